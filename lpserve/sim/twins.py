"""Which parts of a policy have compiled twins in the replica kernels
(:mod:`lpserve.sim.compiled`): each role or hook opts in with its own ``kernel_spec()``;
a subclass that does not define one is a different policy and is asked in Python, in a
pause of the compiled replica (:mod:`lpserve.sim.hooks`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.sim import _ranks as RK
from lpserve.sim import _state_kernels as T

__all__ = ["RANK_EXTERNAL", "independent_replicas", "rank_spec", "twin_spec",
           "vtc_in_pauses"]

RANK_EXTERNAL = T.RANK_EXTERNAL  # rank_spec kind of a scheduler ranked in Python


def twin_spec(obj: Any) -> Any:
    """``obj.kernel_spec()`` when ``obj``'s own class defines it (a subclass that does not
    is a different policy and runs in Python), else None."""
    if obj is None or "kernel_spec" not in type(obj).__dict__:
        return None
    return obj.kernel_spec()


def vtc_in_pauses(policy: Any, disaggregated: bool = False) -> bool:
    """Whether ``policy``'s scheduler is VTC (or a subclass with its own twin) run where its
    twin cannot meter it: on a disaggregated cluster, beside a rebalancer, or under
    another budget controller. The twin meters every token (as the engine's hook does when
    the scheduler is also the budget controller) and credits it to the replica the request
    ends on; elsewhere VTC ranks in Python, asked in pauses of the compiled replicas (and
    meters there, when it is its engine's budget controller)."""
    s = twin_spec(policy.scheduler)
    return s is not None and s[0] == "vtc" and (
        disaggregated or policy.rebalancer is not None
        or policy.engine.budget_controller is not policy.scheduler)


def rank_spec(scheduler: Any, in_python: bool = False) -> tuple[int, np.ndarray, np.ndarray]:
    """``(kind, float params, int params)`` of the scheduler's compiled twin, or
    ``RANK_EXTERNAL`` for a scheduler ranked in Python (one without a twin, or any with
    ``in_python``, e.g. :func:`vtc_in_pauses`)."""
    s = None if in_python else twin_spec(scheduler)
    if s is None:
        return T.RANK_EXTERNAL, np.zeros(1), np.zeros(1, np.int64)
    kind, fp, ip = s
    return RK.RANK_KINDS[kind], np.asarray(fp, np.float64), np.asarray(ip, np.int64)


def independent_replicas(policy: Any, ranks_in_python: bool) -> bool:
    """Whether compiled replicas of ``policy`` never read each other between arrivals, so
    that each may take its arrivals in one kernel call: round-robin routing (its routes
    read no state) and a scheduler with a compiled twin and no state shared across
    replicas (program-level schedulers share each program's service);
    ``ranks_in_python``: the run's ``RunContext.ranks_in_python``."""
    kind = rank_spec(policy.scheduler, ranks_in_python)[0]
    return twin_spec(policy.router) == ("round-robin", ()) and \
        kind not in (T.RANK_EXTERNAL, RK.R_PROG)

