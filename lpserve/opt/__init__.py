"""Formulations (layer 4): build -> solve -> certify -> export.

``FORMULATIONS`` maps a name to ``"module:OBJECT"`` of a :class:`Formulation`; modules are
imported on first use so ``import lpserve.opt`` stays light. :func:`solve` is what
``lp.solve(name, instance, time_limit_s=...)`` calls. :func:`load_instance` (from
:mod:`lpserve.instance`) reads the benchmark instances of ``instances/<name>/instance.toml``.
"""
from __future__ import annotations

import importlib
import math
import time
from typing import Any

from lpserve.instance import INSTANCES_DIR, instance_names, load_instance
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
