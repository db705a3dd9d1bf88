"""Run corpus cases through every loader and CLI entry point, and judge the outcome.

Entry points: ``lp.load_trace`` (API) and the CLI commands that read a trace file,
``lpserve trace stats``, ``lpserve simulate --trace`` and ``lpserve cache --trace``, run
in this process through ``lpserve.cli.main`` (so an uncaught exception is a traceback)
under a ``SIGALRM`` watchdog (so a blocking read is a hang, not a stuck test).
``python -m tests.robustness.harness [--entry api,stats,simulate,cache]`` prints the
Markdown table of the closing note: case, entry point, outcome.
"""
from __future__ import annotations

import contextlib
import io
import signal
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

from tests.robustness.corpus import Case, cases, materialize

ENTRY_POINTS = ("api", "stats", "simulate", "cache")
HANG_S = 60


class Hang(Exception):
    """The watchdog fired."""


@dataclass
class Outcome:
    """What one run did: ``verdict`` is ``"error"``, ``"accept"``, ``"traceback"`` or
    ``"hang"``; ``message`` the error text or a summary; ``ok`` whether the case's
    expectation held (``why`` says what did not)."""

    case: str
    entry: str
    verdict: str
    message: str
    ok: bool = True
    why: str = ""


@contextlib.contextmanager
def watchdog(seconds: int = HANG_S):
    def fire(signum, frame):
        raise Hang(f"no answer after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _argv(entry: str, path: Path) -> list[str]:
    p = str(path)
    return {"stats": ["trace", "stats", p, "--json"],
            "simulate": ["simulate", "--trace", p, "--json"],
            "cache": ["cache", "--trace", p, "--capacity-blocks", "8", "--json"]}[entry]


def run(case: Case, entry: str, path: Path) -> Outcome:
    """Run ``case`` (materialized at ``path``) through ``entry`` and judge it."""
    import lpserve as lp
    from lpserve.cli import main

    try:
        with watchdog():
            if entry == "api":
                try:
                    tr = lp.load_trace(path)
                except (ValueError, OSError) as exc:  # TraceError, FileNotFoundError, ...
                    out = Outcome(case.name, entry, "error", f"{type(exc).__name__}: {exc}")
                else:
                    out = Outcome(case.name, entry, "accept", f"{len(tr)} requests")
                    out.n = len(tr)
            else:
                o, e = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
                    rc = main(_argv(entry, path))
                err = e.getvalue().strip().splitlines()
                msg = err[-1] if err else ""
                if rc == 0:
                    out = Outcome(case.name, entry, "accept", "exit 0")
                else:
                    out = Outcome(case.name, entry, "error", f"exit {rc}: {msg}")
                    out.rc = rc
    except Hang as exc:
        return Outcome(case.name, entry, "hang", str(exc), False, "hang")
    except Exception as exc:  # escaped every handler: the user would see a traceback
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return Outcome(case.name, entry, "traceback", tb, False, "traceback")
    return judge(case, entry, path, out)


def judge(case: Case, entry: str, path: Path, out: Outcome) -> Outcome:
    """Set ``out.ok``/``out.why`` from the case's expectation."""
    if case.expect == "error":
        if out.verdict != "error":
            out.ok, out.why = False, "silent acceptance"
        elif entry != "api" and getattr(out, "rc", 2) != 2:
            out.ok, out.why = False, f"exit code {out.rc}, not 2"
        else:
            missing = [s for s in (path.name, *case.needles) if s not in out.message]
            if missing:
                out.ok, out.why = False, f"message lacks {missing}"
        return out
    # accepted cases: the loader gives the trace; the CLI runs on it, except that the
    # cache command refuses a trace without prefix block ids
    if entry == "api":
        if out.verdict != "accept" or getattr(out, "n", None) != case.n:
            out.ok, out.why = False, f"expected {case.n} requests, got {out.message}"
    elif entry == "cache" and not case.blocks:
        if not (out.verdict == "error" and "no prefix block ids" in out.message
                and getattr(out, "rc", 0) == 2):
            out.ok, out.why = False, "expected the no-block-ids refusal"
        else:
            out.verdict = "refused"
    elif out.verdict != "accept":
        out.ok, out.why = False, f"expected it to run: {out.message}"
    return out


def run_all(entries=ENTRY_POINTS, folder: Path | None = None) -> list[Outcome]:
    """Every case through every entry point of ``entries``."""
    tmp = Path(tempfile.mkdtemp(prefix="lpserve-corpus-")) if folder is None else folder
    out = []
    for case in cases():
        path = materialize(case, tmp)
        for entry in entries:
            out.append(run(case, entry, path))
    return out


def table(outcomes: list[Outcome]) -> str:
    """Markdown: case | entry point | outcome."""
    lines = ["| case | entry point | outcome |", "|---|---|---|"]
    for o in outcomes:
        msg = o.message.replace("|", "\\|")
        msg = msg if len(msg) <= 150 else msg[:147] + "..."
        flag = "" if o.ok else f" **FAILED: {o.why}**"
        lines.append(f"| {o.case} | {o.entry} | {o.verdict}: {msg}{flag} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--entry", default=",".join(ENTRY_POINTS))
    args = ap.parse_args()
    res = run_all(args.entry.split(","))
    print(table(res))
    bad = [o for o in res if not o.ok]
    counts = {v: sum(o.verdict == v for o in res) for v in
              ("error", "accept", "refused", "traceback", "hang")}
    print(f"\n{len(res)} runs of {len(cases())} cases: {counts}; failed expectations: "
          f"{len(bad)}")
