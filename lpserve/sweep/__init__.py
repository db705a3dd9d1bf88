"""Sweeps: grids of runs (simulate, solve, bound, cache replay, trace stats) on a local
process pool, Dask or Ray, with results stored as resumable Parquet part files.

>>> from lpserve.sweep import run_sweep
>>> report = run_sweep("default", "sweeps/default", backend="local", workers=2)
>>> report.table            # one row per cell: inputs, status, error, flattened metrics

Cells are keyed by the sha256 digest of their canonical inputs (:func:`cell_digest`); a
re-run skips every finished cell, and the rows are the same whichever backend ran them.
See :mod:`lpserve.sweep.grid` for the grid format.
"""
from __future__ import annotations

from lpserve.sweep.backends import BACKENDS
from lpserve.sweep.grid import (
                                AXES,
                                KINDS,
                                Cell,
                                Grid,
                                GridError,
                                bundled_grids,
                                cell_digest,
                                load_grid,
                                replication_seeds,
)
from lpserve.sweep.runner import SweepReport, load_results, run_sweep
from lpserve.sweep.store import ResultStore, StoreError
from lpserve.sweep.worker import VOLATILE_COLUMNS

__all__ = ["AXES", "BACKENDS", "KINDS", "VOLATILE_COLUMNS", "Cell", "Grid", "GridError",
           "ResultStore", "StoreError", "SweepReport", "bundled_grids", "cell_digest", "load_grid",
           "load_results", "replication_seeds", "run_sweep"]
