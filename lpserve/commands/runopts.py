"""Options shared by the commands that simulate policies (``gap``, ``simulate``): engine
parameters, predictors, load as a utilisation, checkpoints, and progress with incremental
results on stderr."""
from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any, Sequence

from lpserve.commands.common import CLIError, fmt_num

ENGINE_HELP = ("EngineConfig parameter KEY=VALUE for every policy, or POLICY[,POLICY...]:"
               "KEY=VALUE for some (repeatable), e.g. --engine vllm,mcsf:"
               "max_num_batched_tokens=131072; `lpserve list engine` lists the keys")
PREDICTOR_HELP = ("output-length predictor NAME[:key=value,...] of every simulation "
                  "(history, noisy-oracle:sigma=0.5, interval-classes:alpha=0.5, oracle), "
                  "or none to run prediction-reading policies on their fallback on purpose; "
                  "`lpserve list predictors` lists them. Without it, a policy that reads "
                  "predictions on a trace without them is an error (gap's default policy "
                  "set then uses history, and says so)")


def add_engine_options(p: argparse.ArgumentParser, *, scoped: bool = True) -> None:
    """``--engine`` (repeatable) and ``--predictor``."""
    p.add_argument("--engine", action="append", default=[],
                   metavar="[POLICY:]KEY=VALUE" if scoped else "KEY=VALUE",
                   help=ENGINE_HELP if scoped else "EngineConfig parameter KEY=VALUE of the "
                   "policy (repeatable), e.g. --engine max_num_batched_tokens=131072")
    p.add_argument("--predictor", default=None, metavar="NAME[:K=V,...]", help=PREDICTOR_HELP)


def add_progress_options(p: argparse.ArgumentParser) -> None:
    """``--quiet``: no progress on stderr."""
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar and no per-run lines on stderr (--json implies it)")


def engine_mapping(items: Sequence[str], policies: Sequence[str]) -> dict[str, Any]:
    """The ``--engine`` texts as compare()'s ``engine`` mapping (CLIError on bad input)."""
    from lpserve.evaluate.specs import parse_engine_flags

    try:
        return parse_engine_flags(items, policies)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def predictor_spec(text: str | None) -> str | None:
    """The ``--predictor`` text, validated (``None`` when not given)."""
    if text is None:
        return None
    from lpserve.registry import resolve_predictor

    try:
        resolve_predictor(text, "--predictor")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return text


def prediction_readers(policies: Sequence[str]) -> list[str]:
    """The registered policies among ``policies`` that read predicted output lengths."""
    from lpserve.registry import POLICIES, make_policy

    return [p for p in policies if p in POLICIES and make_policy(p).reads_predictions]


def check_predictions(policies: Sequence[str], trace: Any, predictor: str | None) -> None:
    """CLIError naming the policies that read predictions when ``trace`` has none and no
    ``--predictor`` was given."""
    if predictor is not None or (trace.predicted_lo is not None
                                 and trace.predicted_hi is not None):
        return
    readers = prediction_readers(policies)
    if readers:
        raise CLIError(f"{', '.join(readers)} decide(s) on predicted output lengths, but "
                       f"trace {trace.name!r} carries no predictions: give --predictor "
                       "(history: online quantiles of completed requests; "
                       "noisy-oracle:sigma=0.5: the truth with log-normal error) or "
                       "--predictor none to run their fallback on purpose")


def context_warning(trace: Any, llm: str) -> str | None:
    """A warning when requests exceed the LLM's context length (catalog ``max_context``)."""
    from lpserve.cost.catalog import get_llm

    ctx = get_llm(llm).max_context
    if not ctx:
        return None
    tot = trace.prompt_tokens.astype("int64") + trace.output_tokens.astype("int64")
    over = int((tot > ctx).sum())
    if not over:
        return None
    return (f"{over:,} of {len(trace):,} requests of {trace.name} have prompt + output above "
            f"{llm}'s context length {ctx:,} tokens (longest {int(tot.max()):,}); the "
            f"simulator serves them as the cost model prices them (--engine "
            f"max_model_len={ctx} rejects them as vLLM would)")


def warn(lines: Sequence[str], *, quiet: bool = False) -> None:
    """Print warnings on stderr, one per line, each starting with ``WARNING:``."""
    if quiet:
        return
    for w in lines:
        print(f"WARNING: {w}", file=sys.stderr)


class Reporter:
    """Progress of a batch of simulations on stderr: a bar counted in routed requests (with
    its ETA) on a terminal, and one line per finished run (also off a terminal, with its own
    estimate of the time left); silent with ``quiet``."""

    def __init__(self, total_requests: int, total_runs: int, desc: str, *,
                 quiet: bool = False) -> None:
        self.quiet = quiet
        self.total, self.runs = int(total_requests), int(total_runs)
        self.done = self.n_runs = self.loaded = 0  # loaded: requests of checkpoint runs
        self.case = ""
        self.t0 = time.perf_counter()
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=desc, unit="req", file=sys.stderr,
                            dynamic_ncols=True, smoothing=0.05)

    def on_requests(self, n: int) -> None:
        """Count ``n`` more routed requests (advances the bar)."""
        self.done += int(n)
        if self.bar is not None:
            self.bar.update(int(n))

    def on_result(self, row: dict[str, Any]) -> None:
        """One line for a finished (or checkpoint-loaded) run: its row of the table."""
        self.n_runs += 1
        if row.get("from_checkpoint"):  # took no time: left out of the rate of the ETA
            self.loaded += int(row["n_requests"])
        if self.quiet:
            return
        el = time.perf_counter() - self.t0
        todo = self.total - self.loaded
        frac = (self.done - self.loaded) / todo if todo > 0 else 1.0
        left = el * (1 - frac) / frac if frac > 0 else (0.0 if todo <= 0 else math.nan)
        src = "checkpoint" if row.get("from_checkpoint") else f"{row['wall_s']:.1f} s"
        msg = (f"[{self.n_runs}/{self.runs} runs, {_clock(el)} elapsed, ~{_clock(left)} left] "
               f"{row['policy']}{' @ ' + self.case if self.case else ''}: e2e mean "
               f"{fmt_num(row['e2e_s_mean'])} s over {int(row['n_finished']):,} finished, "
               f"{int(row['n_rejected']):,} rejected ({src})")
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the bar (idempotent)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _clock(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60}:{s % 60:02d}"
