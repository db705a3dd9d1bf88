"""``run_sweep``: expand a grid, skip finished cells, run the rest on a backend, store rows."""
from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from lpserve.sweep.backends import BACKENDS, default_workers, run_batches
from lpserve.sweep.claims import Claims
from lpserve.sweep.grid import USES_CLUSTER, Cell, Grid, load_grid
from lpserve.sweep.reaper import Reaper
from lpserve.sweep.store import ResultStore
from lpserve.sweep.worker import Payload, cost_key

MAX_AUTO_BATCH = 16


@dataclass
class SweepReport:
    """What one call of :func:`run_sweep` did.

    Attributes:
        out_dir: the sweep directory; backend, workers: how it ran.
        n_cells: cells in the grid; n_skipped: already finished, not run again;
        n_run: run now; n_failed: cells of the grid whose row is an error.
        n_elsewhere: cells run meanwhile by another sweep on the same directory.
        rejected: (part file, rows, reason) the store left out (damaged, edited rows).
        wall_s: seconds for the whole call (start-up of the backend included).
        table: one row per cell of the grid, in grid order (pandas DataFrame).
    """

    out_dir: Path
    backend: str
    workers: int
    n_cells: int
    n_skipped: int
    n_run: int
    n_failed: int
    wall_s: float
    table: Any = field(repr=False, default=None)
    n_elsewhere: int = 0
    rejected: list = field(default_factory=list)

    @property
    def cells_per_s(self) -> float:
        """Cells run per second of wall time (NaN when nothing ran)."""
        return self.n_run / self.wall_s if self.n_run and self.wall_s > 0 else math.nan

    def failures(self) -> list[dict[str, str]]:
        """``{"cell", "error"}`` of every failed cell."""
        if self.table is None or self.table.empty:
            return []
        bad = self.table[self.table["status"] != "ok"]
        return [{"cell": str(c), "error": str(e)} for c, e in zip(bad["cell"], bad["error"])]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: output folder, backend, workers, cell counts (total,
        skipped, run, failed, run elsewhere), ``wall_s`` (s), ``cells_per_s``, the failures and the
        rejected result parts."""
        return {"out_dir": str(self.out_dir), "backend": self.backend, "workers": self.workers,
                "n_cells": self.n_cells, "n_skipped": self.n_skipped, "n_run": self.n_run,
                "n_failed": self.n_failed, "n_elsewhere": self.n_elsewhere,
                "wall_s": self.wall_s, "cells_per_s": self.cells_per_s,
                "failures": self.failures(),
                "rejected": [{"part": p, "rows": n, "reason": r} for p, n, r in self.rejected]}


def load_traces(grid: Grid) -> dict[str, Any]:
    """Load every base trace of ``grid`` once: name -> :class:`lpserve.Trace`."""
    from lpserve.trace.loaders import load_trace

    return {name: load_trace(spec.source, spec.format) for name, spec in grid.traces.items()}


def expand(grid: Grid, traces: Mapping[str, Any]) -> list[Cell]:
    """The grid's cells, keyed with the content digests of ``traces``."""
    return grid.cells({name: tr.digest() for name, tr in traces.items()})


def build_payload(cells: list[Cell], traces: Mapping[str, Any]) -> Payload:
    """Traces and cost models the ``cells`` need, built once here to ship to workers.

    A cost model that cannot be built (say an unknown GPU) is left out: the cells that
    need it fail on the worker with the catalog's own error.
    """
    by_digest = {tr.digest(): tr for tr in traces.values()}
    used = {c.inputs["trace"]["digest"] for c in cells}
    costs: dict[str, Any] = {}
    for c in cells:
        if c.inputs["kind"] not in USES_CLUSTER:
            continue
        cl = c.inputs["cluster"]
        key = cost_key(cl["gpu"], cl["llm"], cl["tp"])
        if key in costs:
            continue
        try:
            from lpserve.cost import cost_model

            costs[key] = cost_model(gpu=cl["gpu"], llm=cl["llm"], tp=cl["tp"])
        except Exception:
            continue
    return Payload(traces={d: by_digest[d] for d in used}, costs=costs)


def check_predictions(grid: Grid, cells: list[Cell], traces: Mapping[str, Any]) -> None:
    """Refuse, before any cell runs, a simulate cell whose policy reads predicted output
    lengths on a trace without them and no ``predictor`` (GridError naming both)."""
    from lpserve.registry import make_policy
    from lpserve.sweep.grid import GridError

    seen: set[tuple[str, str]] = set()
    for c in cells:
        inp = c.inputs
        key = (inp.get("policy", ""), inp["trace"]["name"])
        if inp["kind"] != "simulate" or "predictor" in inp or key in seen:
            continue
        seen.add(key)
        tr = traces[key[1]]
        if tr.predicted_lo is None and make_policy(key[0]).reads_predictions:
            raise GridError(f"grid {grid.name!r}: policy {key[0]!r} decides on predicted "
                            f"output lengths but trace {key[1]!r} carries none: set "
                            "[params].predictor (e.g. \"history\") or a predictor axis, or "
                            "predictor = \"none\" to run its fallback on purpose")


def auto_batch_size(n_cells: int, workers: int) -> int:
    """About four batches per worker, at most :data:`MAX_AUTO_BATCH` cells each."""
    return max(1, min(MAX_AUTO_BATCH, math.ceil(n_cells / (4 * workers))))


def run_sweep(grid: Grid | Mapping[str, Any] | str | os.PathLike,
              out_dir: str | os.PathLike | None = None, *, backend: str = "local",
              workers: int | None = None, address: str | None = None, client: Any = None,
              batch_size: int | None = None, retry_failed: bool = True,
              on_batch: Callable[[int], None] | None = None,
              on_start: Callable[[int, int], None] | None = None, format: str = "auto"
              ) -> SweepReport:
    """Run every cell of ``grid`` that ``out_dir`` does not hold yet.

    Args:
        grid: a :class:`Grid`, a dict, a TOML path or a bundled grid name.
        out_dir: the sweep directory (default ``sweeps/<grid name>``).
        backend: ``serial``, ``local``, ``dask`` or ``ray``.
        workers: worker processes (default: the CPUs this process may use).
        address: Dask scheduler / Ray cluster address; default starts a local one.
        client: an existing ``distributed.Client`` (Dask only).
        batch_size: cells per task and per part file (default :func:`auto_batch_size`).
        retry_failed: run cells whose stored row is an error again.
        on_batch: called with the number of cells of each completed batch (progress).
        on_start: called once with the number of cells and the number left to run.
        format: part file format, ``auto``, ``parquet`` or ``csv``.

    Returns:
        a :class:`SweepReport` whose ``table`` has one row per cell, in grid order.
    """
    t0 = time.perf_counter()
    grid = load_grid(grid)
    out = Path(out_dir) if out_dir is not None else Path("sweeps") / grid.name
    workers = default_workers() if workers is None else workers
    if backend == "serial":
        workers = 1
    if backend not in BACKENDS:
        raise ValueError(f"sweep backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"sweep workers must be an integer >= 1, got {workers!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"sweep batch_size must be an integer >= 1, got {batch_size!r}")
    store = ResultStore(out, format=format)
    store.clean_tmp()
    traces = load_traces(grid)
    cells = expand(grid, traces)
    check_predictions(grid, cells, traces)
    store.write_manifest({"grid": grid.as_dict(), "n_cells": len(cells),
                          "cells": [c.digest for c in cells],
                          "trace_digests": {n: t.digest() for n, t in traces.items()}})
    skip = store.finished() if retry_failed else store.recorded()
    rejected = list(store.rejected)
    todo = [c for c in cells if c.digest not in skip]
    n_run = 0
    if on_start is not None:
        on_start(len(cells), len(todo))
    if todo:
        size = batch_size or auto_batch_size(len(todo), workers)
        payload = build_payload(todo, traces)
        with Claims(out, store.run_id) as claims, \
                (Reaper.start() if backend != "serial" else nullcontext()):
            left = todo
            while left:
                batches = _claimed_batches(left, size, claims, store, retry_failed)
                for rows in run_batches(backend, batches, payload, workers=workers,
                                        address=address, client=client):
                    store.write_part(rows)
                    n_run += len(rows)
                    if on_batch is not None:
                        on_batch(len(rows))
                left = _wait_for_others(left, claims, store, retry_failed)
    table = results_table(store, cells)
    n_failed = int((table["status"] != "ok").sum()) if not table.empty else 0
    n_skipped = len(cells) - len(todo)
    return SweepReport(out_dir=out, backend=backend, workers=workers, n_cells=len(cells),
                       n_skipped=n_skipped, n_run=n_run, n_failed=n_failed,
                       wall_s=time.perf_counter() - t0, table=table,
                       n_elsewhere=len(todo) - n_run, rejected=rejected)


def _done(store: ResultStore, retry_failed: bool) -> set[str]:
    return store.finished() if retry_failed else store.recorded()


def _claimed_batches(cells: list[Cell], size: int, claims: Claims, store: ResultStore,
                     retry_failed: bool) -> Iterator[list[Cell]]:
    """Batches of ``size`` cells claimed just before they are handed out; a cell claimed
    by a live sweep is left to it, a stale claim is taken over unless its cell is stored."""
    done: set[str] = set()
    read_at = -math.inf
    for i in range(0, len(cells), size):
        chunk = cells[i:i + size]
        got = set(claims.take([c.digest for c in chunk]))
        stale = [c.digest for c in chunk if c.digest in got and claims.took_over(c.digest)]
        if any(d not in done for d in stale) and time.monotonic() - read_at > 1.0:
            done, read_at = _done(store, retry_failed), time.monotonic()
        got -= {d for d in stale if d in done}
        batch = [c for c in chunk if c.digest in got]
        if batch:
            yield batch


def _wait_for_others(cells: list[Cell], claims: Claims, store: ResultStore,
                     retry_failed: bool, poll_s: float = 1.0) -> list[Cell]:
    """Wait until the cells of ``cells`` claimed by other live sweeps are stored; returns
    those left to run here (their claimant died, or nobody claimed them)."""
    while True:
        done = _done(store, retry_failed)
        left = [c for c in cells if c.digest not in done]
        if not left:
            return []
        elsewhere = set(claims.held_elsewhere([c.digest for c in left]))
        free = [c for c in left if c.digest not in elsewhere and c.digest not in claims.mine]
        if free:
            return free
        if not elsewhere:
            return []  # ours and not stored: a batch failed to store; nothing to wait for
        time.sleep(poll_s)


def results_table(store: ResultStore, cells: list[Cell]) -> Any:
    """One row per cell of ``cells`` held by ``store``, in the order of ``cells``."""
    df = store.read([c.digest for c in cells])
    if df.empty:
        return df
    order = {c.digest: i for i, c in enumerate(cells)}
    return df.assign(_o=df["cell"].map(order)).sort_values("_o").drop(columns="_o") \
        .reset_index(drop=True)


def load_results(out_dir: str | os.PathLike, grid: Grid | Mapping[str, Any] | str | None = None
                 ) -> Any:
    """The stored rows of a sweep directory (restricted to ``grid``'s cells if given)."""
    store = ResultStore(out_dir)
    if grid is None:
        return store.read()
    g = load_grid(grid)
    return results_table(store, expand(g, load_traces(g)))


__all__ = ["SweepReport", "run_sweep", "load_results", "results_table", "expand",
           "load_traces", "build_payload", "auto_batch_size"]
