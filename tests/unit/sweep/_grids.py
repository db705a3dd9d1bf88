"""Small grids shared by the sweep tests (unit and slow)."""
from __future__ import annotations

from typing import Any


def sim_grid(*, head: int = 40, policies=("vllm", "sarathi"), loads=(0.5, 2.0),
             replications: int = 2, name: str = "tiny", **extra: Any) -> dict[str, Any]:
    """Simulate cells on a slice of the bundled trace with redrawn Poisson arrivals."""
    g: dict[str, Any] = {
        "name": name, "kind": "simulate", "replications": replications, "seed": 11,
        "traces": {"conv": {"source": "azure-conv-10min", "head": head,
                            "arrivals": "poisson"}},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.1},
        "axes": {"policy": list(policies), "load": list(loads)},
    }
    g.update(extra)
    return g


def stats_grid(*, loads=(0.5, 1.0, 2.0), replications: int = 2) -> dict[str, Any]:
    """Trace-statistics cells (no simulator): cheap, for store and runner mechanics."""
    return {"name": "stats", "kind": "stats", "replications": replications, "seed": 3,
            "traces": {"conv": {"source": "azure-conv-10min", "head": 50,
                                "arrivals": "poisson"}},
            "axes": {"load": list(loads)}}


def comparable(table):
    """The table without run-to-run columns (timings, worker, run id), indexed by cell."""
    from lpserve.sweep import VOLATILE_COLUMNS

    return table.drop(columns=[c for c in VOLATILE_COLUMNS if c in table]) \
        .set_index("cell").sort_index()
