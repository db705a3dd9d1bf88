"""What runs on a sweep worker: the per-process input cache and the cell runners.

Heavy inputs (base traces, cost models) travel in a :class:`Payload` once per worker
(pool initializer, Dask scatter with ``broadcast=True``, Ray object store) and are kept in
a per-process cache keyed by content digest, so a worker that already holds a trace never
loads or deserializes it again. Each cell is a pure function of its canonical inputs;
the row it returns holds the inputs, a status, the error text of a failed cell and the
flattened metrics.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from lpserve.sweep.grid import Cell

#: columns that vary from run to run (timings, where and when, and the row checksum over
#: them); excluded from comparisons
VOLATILE_COLUMNS = ("cell_wall_s", "wall_s", "worker", "run_id", "part", "checksum")
#: columns every row has, besides the cell inputs
STATUS_COLUMNS = ("status", "error", "result_digest")
_STAT_KEYS = {"mean", "p50", "p90", "p99", "max", "min", "std"}
_DERIVED_CACHE_SIZE = 32


@dataclass
class Payload:
    """Heavy inputs shipped once per worker.

    Attributes:
        traces: base trace content digest -> :class:`lpserve.Trace`.
        costs: ``"gpu|llm|tp"`` -> cost model object.
        key: digest of everything above (what a worker checks before installing).
    """

    traces: dict[str, Any] = field(default_factory=dict)
    costs: dict[str, Any] = field(default_factory=dict)
    key: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            h = hashlib.sha256()
            for d in sorted(self.traces):
                h.update(d.encode())
            for c in sorted(self.costs):
                h.update(c.encode())
            self.key = h.hexdigest()


# per-process cache: filled by install(), read by the cell runners; never holds results
_CACHE: dict[str, dict[str, Any]] = {"traces": {}, "costs": {}, "derived": {}, "payloads": {}}


def install(payload: Payload | None) -> None:
    """Add a payload's traces and cost models to this process's cache (idempotent)."""
    if payload is None or payload.key in _CACHE["payloads"]:
        return
    _CACHE["traces"].update(payload.traces)
    _CACHE["costs"].update(payload.costs)
    _CACHE["payloads"][payload.key] = True


def installed(key: str) -> bool:
    """Whether the payload with digest ``key`` is already in this process's cache."""
    return key in _CACHE["payloads"]


def clear_cache() -> None:
    """Empty this process's cache (tests; a long-lived worker between sweeps)."""
    for d in _CACHE.values():
        d.clear()


def cost_key(gpu: str, llm: str, tp: int) -> str:
    """The cache key ``"gpu|llm|tp"`` of one cost model (one per GPU, LLM and tensor-parallel
    degree per worker process)."""
    return f"{gpu}|{llm}|{int(tp)}"


def _cost(cluster: dict[str, Any]) -> Any:
    key = cost_key(cluster["gpu"], cluster["llm"], cluster["tp"])
    cm = _CACHE["costs"].get(key)
    if cm is None:
        from lpserve.cost import cost_model

        cm = cost_model(gpu=cluster["gpu"], llm=cluster["llm"], tp=cluster["tp"])
        _CACHE["costs"][key] = cm
    return cm


def arrival_seed(seed: int) -> int:
    """Seed of a cell's redrawn arrivals: a stream of ``SeedSequence([seed, 1])``, so it
    never coincides with the simulator's own stream from ``seed``."""
    return int(np.random.SeedSequence([int(seed), 1]).generate_state(1, dtype=np.uint32)[0])


def cell_trace(inputs: dict[str, Any]) -> Any:
    """The trace a cell runs on: its base trace sliced, rebased to 0 and set to its load."""
    spec = inputs["trace"]
    base = _CACHE["traces"].get(spec["digest"])
    if base is None:
        raise RuntimeError(f"trace {spec['name']!r} (digest {spec['digest'][:12]}) was not "
                           "shipped to this worker")
    poisson = spec["arrivals"] == "poisson"
    key = (spec["digest"], spec["head"], spec["start"], spec["arrivals"], inputs.get("load"),
           inputs.get("rate_per_s"), inputs["seed"] if poisson else None)
    derived = _CACHE["derived"]
    if key in derived:
        return derived[key]
    start = spec["start"]
    stop = None if spec["head"] is None else start + spec["head"]
    sub = base.slice(start, stop).rebased()
    if len(sub) < 2:
        raise ValueError(f"trace {spec['name']!r}: slice start={start} head={spec['head']} "
                         f"leaves {len(sub)} request(s); need >= 2 to set a load")
    if poisson:
        from lpserve.trace.generate import Poisson, with_arrivals

        rate = inputs["rate_per_s"] if "rate_per_s" in inputs else \
            inputs["load"] * sub.rate_per_s
        tr = with_arrivals(sub, Poisson(rate_per_s=rate), seed=arrival_seed(inputs["seed"]))
    elif "rate_per_s" in inputs:
        tr = sub.with_rate(inputs["rate_per_s"])
    else:
        tr = sub.scale_rate(inputs["load"])
    if len(derived) >= _DERIVED_CACHE_SIZE:
        derived.pop(next(iter(derived)))
    derived[key] = tr
    return tr


def _instance(inputs: dict[str, Any]) -> Any:
    from lpserve.cluster import Cluster
    from lpserve.instance import SLO, Instance

    inf = float("inf")
    slo = SLO(ttft_s=inputs.get("slo_ttft_s") or inf, tpot_s=inputs.get("slo_tpot_s") or inf)
    cluster = Cluster(**inputs["cluster"])
    return Instance(trace=cell_trace(inputs), cluster=cluster, slo=slo,
                    horizon_s=inputs.get("horizon_s"), cost=_cost(inputs["cluster"]))


def _scalar(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if hasattr(v, "value") and isinstance(getattr(v, "value"), str):  # enums
        return v.value
    return v


def flatten_metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """Flatten ``{"ttft_s": {"mean": ..}}`` to ``{"ttft_s_mean": ..}``.

    Dicts of statistics (keys among mean, p50, p90, p99, max, min, std) are spread into
    columns; other dicts and lists become JSON strings, so every cell has the same
    columns whatever its outcome; numpy arrays (per-request values) are left out.
    """
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if isinstance(v, dict) and v and set(v) <= _STAT_KEYS:
            for s, x in v.items():
                out[f"{k}_{s}"] = _scalar(x)
        elif isinstance(v, (dict, list, tuple)):
            out[k] = json.dumps(v, sort_keys=True, default=_scalar)
        elif isinstance(v, np.ndarray):
            continue  # per-request arrays are not cell metrics
        else:
            out[k] = _scalar(v)
    return out


def metrics_digest(metrics: dict[str, Any]) -> str:
    """sha256 of metrics without volatile entries (wall times), floats by ``repr``."""
    clean = {k: (repr(v) if isinstance(v, float) else v) for k, v in metrics.items()
             if k not in VOLATILE_COLUMNS}
    return hashlib.sha256(json.dumps(clean, sort_keys=True, default=str).encode()).hexdigest()


# ---------------------------------------------------------------------- cell kinds
def _run_simulate(inputs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    from lpserve.registry import make_policy, simulate

    policy = make_policy(inputs["policy"])
    if inputs.get("engine"):
        policy = policy.with_(engine=policy.engine.updated(inputs["engine"],
                                                           where="cell engine"),
                              meta=policy.meta)
    res = simulate(_instance(inputs), policy, seed=inputs["seed"],
                   predictor=inputs.get("predictor"))
    return flatten_metrics(res.summary()), res.digest()


def _run_solve(inputs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    from lpserve.opt import solve

    kw = {} if inputs.get("time_limit_s") is None else {"time_limit_s": inputs["time_limit_s"]}
    sol = solve(inputs["formulation"], _instance(inputs), **kw)
    m = flatten_metrics(sol.summary())
    m.pop("digest", None)
    if inputs["kind"] == "bound" and not math.isfinite(float(m.get("bound", math.nan))):
        raise RuntimeError(f"formulation {inputs['formulation']!r} returned no proven bound "
                           f"(status {m.get('status')}: {m.get('message', '')})")
    return m, metrics_digest(m)


def _run_cache(inputs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    from lpserve.evaluate.cache import cache_replay

    out = cache_replay(cell_trace(inputs), capacity_blocks=inputs["capacity_blocks"],
                       policy=inputs["cache_policy"]).as_dict()
    out = {k: v for k, v in dict(out).items() if k not in ("policy", "capacity_blocks")}
    m = flatten_metrics(out)
    return m, metrics_digest(m)


def _run_stats(inputs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    st = cell_trace(inputs).stats()
    st.pop("name", None)
    m = flatten_metrics(st)
    return m, metrics_digest(m)


RUNNERS: dict[str, Callable[[dict[str, Any]], tuple[dict[str, Any], str]]] = {
    "simulate": _run_simulate, "solve": _run_solve, "bound": _run_solve,
    "cache": _run_cache, "stats": _run_stats,
}


def _error_text(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno} in {tb[-1].name})" \
        if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def run_cell(cell: Cell) -> dict[str, Any]:
    """Run one cell; never raises for the cell's own failure (status ``"error"``).

    The row holds the cell's input columns, ``status`` (``ok`` or ``error``), ``error``
    (type, message and where it was raised), ``result_digest`` (``Result.digest()`` for a
    simulation, a digest of the metrics otherwise), ``cell_wall_s``, ``worker`` and the
    flattened metrics; a metric whose name is already a column gets a ``metric_`` prefix
    (a solver's ``status`` becomes ``metric_status``).
    """
    row = cell.columns()
    t0 = time.perf_counter()
    try:
        metrics, rdigest = RUNNERS[cell.inputs["kind"]](cell.inputs)
        status, error = "ok", ""
    except Exception as exc:
        metrics, rdigest, status, error = {}, "", "error", _error_text(exc)
    for k, v in metrics.items():
        row[k if k not in row and k not in STATUS_COLUMNS else f"metric_{k}"] = v
    row.update(status=status, error=error, result_digest=rdigest,
               cell_wall_s=time.perf_counter() - t0,
               worker=f"{socket.gethostname()}:{os.getpid()}")
    return row


def run_batch(cells: list[Cell], payload: Payload | None = None) -> list[dict[str, Any]]:
    """Run a batch of cells in this process (installing ``payload`` first if given)."""
    install(payload)
    return [run_cell(c) for c in cells]


def run_batch_boxed(cells: list[Cell], key: str, box: list[Any]) -> list[dict[str, Any]]:
    """Ray entry point: ``box`` holds the payload's object reference, fetched only when
    this worker process has not installed payload ``key`` yet."""
    if not installed(key):
        import ray

        install(ray.get(box[0]))
    return [run_cell(c) for c in cells]


def init_worker(payload: Payload) -> None:
    """Process-pool initializer: install the payload once per worker process, and exit
    the worker when the sweep that started it is gone (killed: no clean-up ran)."""
    from lpserve.sweep.reaper import watch_parent

    watch_parent()
    install(payload)
