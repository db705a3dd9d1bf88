"""Formulations (layer 4): build -> solve -> certify -> export.

``FORMULATIONS`` maps a name to ``"module:OBJECT"`` of a :class:`Formulation`; modules are
imported on first use so ``import lpserve.opt`` stays light. :func:`solve` is what
``lp.solve(name, instance, time_limit_s=...)`` calls. :func:`load_instance` reads the
benchmark instances of ``instances/<name>/instance.toml``.
"""
from __future__ import annotations

import importlib
import math
import time
from pathlib import Path
from typing import Any

from lpserve.opt.solution import Formulation, Solution, SolutionError, Status

FORMULATIONS: dict[str, str] = {
    "schedule-ip": "lpserve.opt.schedule_ip:SCHEDULE_IP",
    "schedule-lp": "lpserve.opt.schedule_ip:SCHEDULE_LP",
    "schedule-area": "lpserve.opt.lower_bounds:SCHEDULE_AREA",
    "cost-bound": "lpserve.opt.lower_bounds:COST_BOUND",
    "routing-assignment": "lpserve.opt.routing_lp:ROUTING_ASSIGNMENT",
    "routing-fluid": "lpserve.opt.routing_lp:ROUTING_FLUID",
}

__all__ = ["FORMULATIONS", "Formulation", "Solution", "SolutionError", "Status",
           "formulation", "solve", "load_instance", "instance_names", "INSTANCES_DIR"]

INSTANCES_DIR = Path(__file__).resolve().parents[2] / "instances"


def formulation(name: str) -> Formulation:
    """The :class:`Formulation` registered under ``name``."""
    target = FORMULATIONS.get(name)
    if target is None:
        raise KeyError(f"unknown formulation {name!r}; known: {', '.join(sorted(FORMULATIONS))}")
    module, obj = target.split(":")
    return getattr(importlib.import_module(module), obj)


def solve(name: str, instance: Any, *, time_limit_s: float | None = None,
          **options: Any) -> Solution:
    """Build and solve formulation ``name`` on ``instance``.

    ``options`` go to the formulation's ``build`` (e.g. ``memory_tokens=``); ``seed`` goes
    to ``solve`` when the formulation takes one. Returns a :class:`Solution` whose
    ``wall_s`` covers build and solve. Bad options raise ValueError naming them; solver
    outcomes never raise.
    """
    if time_limit_s is not None and not (isinstance(time_limit_s, (int, float))
                                         and time_limit_s > 0 and math.isfinite(time_limit_s)):
        raise ValueError(f"time_limit_s must be a positive number of seconds, got {time_limit_s!r}")
    f = formulation(name)
    t0 = time.perf_counter()
    seed = options.pop("seed", None)
    model = f.build(instance, **options)
    kw: dict[str, Any] = {"time_limit_s": time_limit_s}
    if seed is not None:
        import inspect

        if "seed" not in inspect.signature(f.solve).parameters:
            raise ValueError(f"{name}: its solve takes no seed (got seed={seed!r})")
        kw["seed"] = seed
    sol = f.solve(model, **kw)
    from dataclasses import replace

    return replace(sol, wall_s=time.perf_counter() - t0)


def instance_names() -> list[str]:
    """Names of the instances under ``instances/`` (each has ``instance.toml``)."""
    if not INSTANCES_DIR.is_dir():
        return []
    return sorted(p.parent.name for p in INSTANCES_DIR.glob("*/instance.toml"))


def load_instance(path_or_name: str | Path) -> tuple[Any, dict[str, Any]]:
    """Read ``instances/<name>/instance.toml`` (or a path to one, or to its folder).

    Returns ``(Instance, spec)`` where ``spec`` is the parsed TOML (its ``[optimal]``
    table holds certified values by formulation name).

    TOML: ``[cluster]`` (Cluster fields), ``[cost]`` (``kind = "unit-round"`` with
    ``memory_tokens``, or ``kind = "analytic"``), ``[slo]`` (optional), ``[trace]`` with
    ``file`` (CSV with ``arrival_s,prompt_tokens,output_tokens`` and optional
    ``predicted_lo,predicted_hi``).
    """
    import tomllib

    import numpy as np

    from lpserve.cluster import Cluster
    from lpserve.instance import SLO, Instance
    from lpserve.trace import Trace

    p = Path(path_or_name)
    if not p.exists():
        p = INSTANCES_DIR / str(path_or_name)
    if p.is_dir():
        p = p / "instance.toml"
    if not p.is_file():
        raise FileNotFoundError(f"instance {path_or_name!r}: no such file or instance "
                                f"(known: {', '.join(instance_names()) or 'none'})")
    spec = tomllib.loads(p.read_text())
    for key in ("cluster", "cost", "trace"):
        if key not in spec:
            raise ValueError(f"{p}: missing table [{key}]")
    tfile = p.parent / spec["trace"]["file"]
    data = np.genfromtxt(tfile, delimiter=",", names=True, dtype=None, encoding="utf-8")
    data = np.atleast_1d(data)
    cols = data.dtype.names or ()
    for c in ("arrival_s", "prompt_tokens", "output_tokens"):
        if c not in cols:
            raise ValueError(f"{tfile}: missing column {c!r} (have {list(cols)})")
    opt = {c: data[c] for c in ("predicted_lo", "predicted_hi") if c in cols}
    trace = Trace.from_arrays(arrival_s=data["arrival_s"].astype(float),
                              prompt_tokens=data["prompt_tokens"].astype(np.int64),
                              output_tokens=data["output_tokens"].astype(np.int64),
                              name=spec.get("name", p.parent.name), **opt)
    cluster = Cluster(**spec["cluster"])
    cs = dict(spec["cost"])
    kind = cs.pop("kind", "analytic")
    if kind == "unit-round":
        from lpserve.cost import UnitRoundCost

        cost = UnitRoundCost(memory_tokens=int(cs["memory_tokens"]))
    elif kind == "analytic":
        cost = None
    else:
        raise ValueError(f"{p}: [cost] kind must be 'unit-round' or 'analytic', got {kind!r}")
    slo = SLO(**spec["slo"]) if "slo" in spec else SLO()
    return Instance(trace=trace, cluster=cluster, slo=slo, cost=cost), spec
