"""Formulations (layer 4): build -> solve -> certify -> export.

``FORMULATIONS`` maps a name to ``"module:OBJECT"`` of a :class:`Formulation`; modules are
imported on first use so ``import lpserve.opt`` stays light. :func:`solve` is what
``lp.solve(name, instance, time_limit_s=...)`` calls. :func:`load_instance` (from
:mod:`lpserve.instance`) reads the benchmark instances of ``instances/<name>/instance.toml``.
"""
from __future__ import annotations

import importlib
import time
from typing import Any

from lpserve.instance import INSTANCES_DIR, instance_names, load_instance
from lpserve.opt.solution import Formulation, Solution, SolutionError, Status

FORMULATIONS: dict[str, str] = {
    "schedule-ip": "lpserve.opt.schedule_ip:SCHEDULE_IP",
    "schedule-lp": "lpserve.opt.schedule_ip:SCHEDULE_LP",
    "schedule-area": "lpserve.opt.lower_bounds:SCHEDULE_AREA",
    "cost-bound": "lpserve.opt.lower_bounds:COST_BOUND",
    "routing-assignment": "lpserve.opt.routing_assignment:ROUTING_ASSIGNMENT",
    "routing-fluid": "lpserve.opt.routing_lp:ROUTING_FLUID",
    "routing-locality": "lpserve.opt.routing_locality:ROUTING_LOCALITY",
    "cost-lp": "lpserve.opt.cost_lp:COST_LP",
    "srpt-bound": "lpserve.opt.srpt_bound:SRPT_BOUND",
    "schedule-search": "lpserve.opt.schedule_search:SCHEDULE_SEARCH",
    "schedule-exact": "lpserve.opt.schedule_search:SCHEDULE_EXACT",
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


def _build_options(name: str, build: Any, options: dict[str, Any]) -> None:
    """Raise ValueError naming every option ``build`` does not take."""
    import inspect

    params = inspect.signature(build).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    known = [k for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k != "deadline"]
    bad = sorted(k for k in options if k not in known)
    if bad:
        raise ValueError(f"{name}: unknown option(s) {', '.join(bad)}; it takes "
                         f"{', '.join(known) or 'none'} (and time_limit_s, seed)")


def _takes(fn: Any, arg: str) -> bool:
    import inspect

    return arg in inspect.signature(fn).parameters


def solve(name: str, instance: Any, *, time_limit_s: float | None = None,
          **options: Any) -> Solution:
    """Build and solve formulation ``name`` on ``instance``.

    ``options`` go to the formulation's ``build`` (e.g. ``memory_tokens=``); ``seed`` goes
    to ``solve`` when the formulation takes one. Returns a :class:`Solution` whose
    ``wall_s`` covers build and solve. ``time_limit_s`` is one budget for both (a
    :class:`~lpserve.opt.budget.Deadline`): a build that runs past it stops and the call
    returns ``LIMIT`` (or ``FEASIBLE`` with an incumbent) with the best bound known so far
    (the formulation's ``limit``); the solver gets what is left and is stopped at the
    deadline. Bad options raise ValueError naming them; solver outcomes never raise.
    """
    from dataclasses import replace

    from lpserve.instance import Instance
    from lpserve.opt.budget import Deadline, TimeLimitReached

    deadline = Deadline(time_limit_s)  # validates time_limit_s
    f = formulation(name)
    if not isinstance(instance, Instance):
        raise ValueError(f"{name}: instance must be an lpserve Instance, got "
                         f"{type(instance).__name__}")
    t0 = time.perf_counter()
    seed = options.pop("seed", None)
    if "deadline" in options:
        raise ValueError(f"{name}: pass time_limit_s, not deadline")
    _build_options(name, f.build, options)
    kw: dict[str, Any] = {}
    if seed is not None:
        if not _takes(f.solve, "seed"):
            raise ValueError(f"{name}: its solve takes no seed (got seed={seed!r})")
        kw["seed"] = seed
    try:
        model = f.build(instance, **options,
                        **({"deadline": deadline} if _takes(f.build, "deadline") else {}))
    except TimeLimitReached as exc:
        wall = time.perf_counter() - t0
        if f.limit is not None:
            return replace(f.limit(name, instance, options, exc, wall), wall_s=wall)
        return Solution(name, Status.LIMIT, wall_s=wall, digest=instance.digest(),
                        message=str(exc) + "; no bound known")
    if _takes(f.solve, "deadline"):
        kw["deadline"] = deadline
    else:
        kw["time_limit_s"] = (max(deadline.remaining_s(), 1e-3) if deadline.limited
                              else None)
    sol = f.solve(model, **kw)
    return replace(sol, wall_s=time.perf_counter() - t0)
