"""``lpserve sweep GRID``: run a grid of cells on a process pool, Dask or Ray, resumably.

Prints a progress bar (on a terminal) and a summary table per policy and load; with
``--plot`` also writes the standard figures; with ``--json`` one JSON object.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from lpserve.commands.common import (
    CLIError,
    add_json_flag,
    emit_json,
    fmt_num,
    int_at_least,
    progress,
)

#: metrics of the summary table (mean over seeds)
TABLE_METRICS = ("ttft_s_mean", "ttft_s_p99", "tpot_s_mean", "e2e_s_p99", "goodput_rps")


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve sweep`` (run a grid of simulations, solves, bounds or cache replays)
    on the subcommand parsers ``sub``: its flags and its handler."""
    p = sub.add_parser(
        "sweep", help="run a grid of simulations, solves, bounds or cache replays",
        description="Run every cell of a sweep grid (TOML; see lpserve.sweep.grid) that the "
        "output directory does not hold yet, on a local process pool, Dask or Ray. Results "
        "are Parquet part files with one row per cell; an interrupted sweep resumes where "
        "it stopped. Exit status 1 when a cell failed (its error is listed and stored).")
    p.add_argument("grid", help="grid TOML file, or the name of a bundled grid "
                   "(lpserve/data/grids: default, bench200)")
    p.add_argument("--backend", default="local", choices=["local", "dask", "ray", "serial"],
                   help="where cells run (default: local process pool; serial: in this "
                   "process)")
    p.add_argument("--address", default=None,
                   help="Dask scheduler or Ray cluster address (default: start a local one)")
    p.add_argument("--workers", type=int_at_least(1), default=None, metavar="N",
                   help="worker processes of a local pool or cluster (default: CPUs "
                   "available)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="sweep directory (default: sweeps/<grid name>)")
    p.add_argument("--batch-size", type=int_at_least(1), default=None, metavar="CELLS",
                   help="cells per task and per part file (default: about 4 tasks per "
                   "worker, at most 16 cells)")
    p.add_argument("--no-retry-failed", action="store_true",
                   help="keep the recorded error of failed cells instead of running them again")
    p.add_argument("--plot", action="store_true",
                   help="also draw latency and throughput vs load (PNG) into the sweep "
                   "directory")
    add_json_flag(p)
    p.set_defaults(func=_sweep)


def _summary_rows(table: Any) -> list[dict[str, Any]]:
    """Mean over seeds of :data:`TABLE_METRICS` per series and load (simulate cells)."""
    from lpserve.sweep.plot import aggregate

    if table.empty or "kind" not in table or not (table["kind"] == "simulate").any():
        return []
    sim = table[table["kind"] == "simulate"]
    if not (sim["status"] == "ok").any():
        return []
    agg = aggregate(sim, [m for m in TABLE_METRICS if m in sim])
    return agg.to_dict("records")


def _sweep(args: argparse.Namespace) -> int:
    from lpserve.sweep import GridError, load_grid, run_sweep
    from lpserve.sweep.grid import Grid

    if args.workers is not None and args.workers < 1:
        raise CLIError(f"--workers must be >= 1, got {args.workers}")
    if args.batch_size is not None and args.batch_size < 1:
        raise CLIError(f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        grid: Grid = load_grid(args.grid)
    except GridError as exc:
        raise CLIError(str(exc)) from None
    quiet = args.json
    bar = progress(iter(()), total=grid.n_cells, desc=f"sweep {grid.name}", quiet=quiet)
    update = getattr(bar, "update", None)

    def start(n_cells: int, n_todo: int) -> None:
        if hasattr(bar, "reset"):
            bar.reset(total=n_todo)

    try:
        report = run_sweep(grid, args.out, backend=args.backend, workers=args.workers,
                           address=args.address, batch_size=args.batch_size,
                           retry_failed=not args.no_retry_failed, on_batch=update,
                           on_start=start)
    except RuntimeError as exc:
        raise CLIError(str(exc)) from None
    finally:
        if hasattr(bar, "close"):
            bar.close()
    figures: list[str] = []
    if args.plot:
        from lpserve.sweep.plot import plot_sweep

        figures = [str(p) for p in plot_sweep(report.table, report.out_dir, title=grid.name)]
    rows = _summary_rows(report.table)
    if args.json:
        emit_json({**report.as_dict(), "grid": grid.name, "table": rows, "figures": figures})
        return 0 if report.n_failed == 0 else 1
    _print_report(grid.name, report, rows, figures)
    return 0 if report.n_failed == 0 else 1


def _print_report(name: str, report: Any, rows: list[dict[str, Any]],
                  figures: list[str]) -> None:
    cps = report.cells_per_s
    print(f"sweep      {name}  ({report.backend}, {report.workers} workers)")
    print(f"cells      {report.n_cells:,}  (run {report.n_run:,}, already done "
          f"{report.n_skipped:,}, failed {report.n_failed:,}"
          + (f", run by another sweep {report.n_elsewhere:,}" if report.n_elsewhere else "")
          + ")")
    for part, rows, reason in report.rejected:
        print(f"rejected   {part}: {reason}" + (f" ({rows} rows)" if rows >= 0 else "")
              + "; its cells are run again", file=sys.stderr)
    print(f"wall       {fmt_num(report.wall_s)} s"
          + (f"   ({fmt_num(cps)} cells/s)" if math.isfinite(cps) else ""))
    print(f"results    {report.out_dir}/parts")
    if rows:
        keys = [k for k in rows[0] if k not in TABLE_METRICS
                and not k.endswith(("_lo", "_hi")) and k != "n"]
        metrics = [m for m in TABLE_METRICS if m in rows[0]]
        head = [*keys, "n", *metrics]
        widths = [max(len(h), 10) for h in head]
        print()
        print("  ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
        for r in rows:
            cells = [str(r[k]) if not isinstance(r[k], float) else fmt_num(r[k])
                     for k in keys] + [str(r.get("n", "")), *(fmt_num(r[m]) for m in metrics)]
            print("  ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
        print("(mean over seeds; TTFT, TPOT and end-to-end in seconds, goodput in req/s)")
    for f in report.failures()[:10]:
        print(f"failed     {f['cell'][:12]}  {f['error']}", file=sys.stderr)
    if report.n_failed > 10:
        print(f"failed     ... and {report.n_failed - 10} more (column `error`)",
              file=sys.stderr)
    for f in figures:
        print(f"figure     {f}")
