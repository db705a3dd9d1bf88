"""Shared plumbing of the CLI: JSON output, clear errors, progress bars."""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Iterable, TypeVar

import numpy as np

T = TypeVar("T")


class CLIError(Exception):
    """An error the CLI reports in one line (exit code 2), without a traceback."""


def int_at_least(minimum: int):
    """An argparse ``type``: an integer >= ``minimum`` (argparse names the flag in its
    error and exits with code 2)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got "
                                             f"{text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {v}")
        return v

    parse.__name__ = f"integer >= {minimum}"
    return parse


def positive_number(*, allow_inf: bool = False):
    """An argparse ``type``: a number > 0, finite unless ``allow_inf`` (NaN never)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (v > 0 and (allow_inf or math.isfinite(v))):
            raise argparse.ArgumentTypeError(
                f"must be a {'' if allow_inf else 'finite '}number > 0, got {text!r}")
        return v

    parse.__name__ = "number > 0"
    return parse


def name_list(text: str) -> list[str]:
    """An argparse ``type``: comma-separated names, at least one, none empty."""
    names = [x.strip() for x in text.split(",")]
    if not any(names) or not all(names):
        raise argparse.ArgumentTypeError(f"must be comma-separated names without empty "
                                         f"entries, got {text!r}")
    return names


def seed_list(text: str) -> list[int]:
    """An argparse ``type``: comma-separated integer seeds >= 0, at least one."""
    parts = [x.strip() for x in text.split(",")]
    try:
        seeds = [int(x) for x in parts]
    except ValueError:
        seeds = []
    if not seeds or any(x < 0 for x in seeds):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 0, got "
                                         f"{text!r}")
    return seeds


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` to ``parser``: print one JSON object on stdout instead of the
    text report."""
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout (for scripts)"
    )


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    return obj


MIX_HELP = ("a heterogeneous cluster: GPU:COUNT[:TP] groups, comma-separated, e.g. "
            "h100-sxm:2,a100-80gb:4 (replaces --gpu, --tp and --replicas)")


def cluster_from_args(args: argparse.Namespace, **fields: Any) -> Any:
    """The :class:`~lpserve.cluster.Cluster` of ``--gpu/--llm/--tp/--replicas``, or of
    ``--mix GPU:COUNT[:TP],...`` when given; ``fields`` are further Cluster fields."""
    from lpserve.cluster import Cluster

    mix = getattr(args, "mix", None)
    if not mix:
        return Cluster(gpu=args.gpu, llm=args.llm, tp=args.tp, replicas=args.replicas,
                       **fields)
    groups = []
    for k, part in enumerate(x.strip() for x in mix.split(",")):
        if not part:
            raise CLIError(f"--mix {mix!r}: group {k + 1} is empty (groups are "
                           "GPU:COUNT[:TP], separated by single commas)"[:300])
        bits = part.split(":")
        try:
            if not 2 <= len(bits) <= 3:
                raise ValueError
            groups.append((bits[0], int(bits[1]), int(bits[2]) if len(bits) == 3 else 1))
        except ValueError:
            raise CLIError(f"--mix: each group is GPU:COUNT[:TP], got {part!r}") from None
    try:
        return Cluster.mixed(llm=args.llm, groups=groups, **fields)
    except ValueError as exc:
        raise CLIError(f"--mix {mix!r}: {exc}") from None


def emit_json(obj: dict[str, Any]) -> None:
    """Print ``obj`` as one JSON object (NaN and inf become null)."""
    sys.stdout.write(json.dumps(_jsonable(obj), allow_nan=False) + "\n")


def progress(iterable: Iterable[T], *, total: int | None = None, desc: str = "",
             quiet: bool = False) -> Iterable[T]:
    """Wrap ``iterable`` in a progress bar on a terminal; silent with ``quiet`` or off a TTY."""
    if quiet or not sys.stderr.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; user errors (bad values, unreadable files: ValueError,
    KeyError, OSError and their kin) print one line on stderr and exit 2."""
    from lpserve.trace import TraceError

    try:
        rc = args.func(args)
    except (CLIError, TraceError, ValueError, KeyError, OSError, MemoryError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        if getattr(args, "json", False):
            emit_json({"error": f"{type(exc).__name__}: {msg}"})
        print(f"lpserve {args.command}: error: {msg}", file=sys.stderr)
        return 2
    return int(rc or 0)


def process_age_s() -> float:
    """Seconds since this process started (interpreter start and imports included), from
    ``/proc/self/stat``; 0.0 where ``/proc`` is missing. Used so that a command's
    ``--time-limit`` counts from when the user started it."""
    import os
    import time

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - start_s, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def fmt_num(x: float, digits: int = 4) -> str:
    """A number for a text table: ``"-"`` for None, NaN or inf; integers with thousands
    separators; scientific notation with ``digits`` significant digits below 1e-3 or from
    1e6 on; else ``digits`` significant digits below 100 and one decimal from 100."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    ax = abs(x)
    if ax != 0 and (ax >= 1e6 or ax < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:,.{digits}g}" if ax < 100 else f"{x:,.1f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of ``header`` and ``rows`` (cells already formatted as text)."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"
