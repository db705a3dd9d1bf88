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


def add_json_flag(parser: argparse.ArgumentParser) -> None:
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
    """Run a parsed command; known user errors print one line on stderr and exit 2."""
    from lpserve.trace import TraceError

    try:
        rc = args.func(args)
    except (CLIError, TraceError, ValueError, KeyError, FileNotFoundError) as exc:
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
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    ax = abs(x)
    if ax != 0 and (ax >= 1e6 or ax < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:,.{digits}g}" if ax < 100 else f"{x:,.1f}"
