"""Which parts of a policy have compiled twins, and so which runs the compiled replica
engine (:mod:`lpserve.sim.compiled`) takes: each role or hook opts in with its own
``kernel_spec()``; a subclass that does not define one is a different policy and runs in
Python."""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.sim import _ranks as RK
from lpserve.sim import _state_kernels as T

__all__ = ["RANK_EXTERNAL", "eligible", "independent_replicas", "rank_spec", "twin_spec"]

RANK_EXTERNAL = T.RANK_EXTERNAL  # rank_spec kind of a scheduler ranked in Python


def twin_spec(obj: Any) -> Any:
    """``obj.kernel_spec()`` when ``obj``'s own class defines it (a subclass that does not
    is a different policy and runs in Python), else None."""
    if obj is None or "kernel_spec" not in type(obj).__dict__:
        return None
    return obj.kernel_spec()


def rank_spec(scheduler: Any) -> tuple[int, np.ndarray, np.ndarray]:
    """``(kind, float params, int params)`` of the scheduler's compiled twin, or
    ``RANK_EXTERNAL`` for a scheduler ranked in Python."""
    s = twin_spec(scheduler)
    if s is None:
        return T.RANK_EXTERNAL, np.zeros(1), np.zeros(1, np.int64)
    kind, fp, ip = s
    return RK.RANK_KINDS[kind], np.asarray(fp, np.float64), np.asarray(ip, np.int64)


def independent_replicas(policy: Any) -> bool:
    """Whether compiled replicas of ``policy`` never read each other between arrivals, so
    that each may take its arrivals in one kernel call: round-robin routing (its routes
    read no state) and a scheduler with a compiled twin and no state shared across
    replicas (program-level schedulers share each program's service)."""
    kind = rank_spec(policy.scheduler)[0]
    return twin_spec(policy.router) == ("round-robin", ()) and \
        kind not in (T.RANK_EXTERNAL, RK.R_PROG)


def eligible(policy: Any, reference: bool, disaggregated: bool = False) -> bool:
    """Whether a run of ``policy`` can use compiled replicas (on any cluster: in a
    heterogeneous one each compiled replica has its own cost parameters, swap prices and
    KV blocks; an evictor, a preemption decider or a budget controller written in Python
    is asked in a pause, :mod:`lpserve.sim.hooks`, as is a speculation decider whose arms
    are the grid of :class:`~lpserve.policy.SpeculationDecider`): not the reference mode,
    and VTC only as its own meter (the budget controller) on a colocated cluster without a
    rebalancer. Completions reach a router that reads them through the event loop as with
    Python replicas."""
    eng = policy.engine
    spec = eng.speculation
    if reference or (spec is not None and twin_spec(spec) is None
                     and not _grid_arms(spec)):
        return False
    vtc = twin_spec(policy.scheduler)
    if vtc is not None and vtc[0] == "vtc" and (
            disaggregated or policy.rebalancer is not None
            or eng.budget_controller is not policy.scheduler):
        # its twin meters every token (as the engine's hook does when the scheduler is
        # also the budget controller) and credits it to the replica the request ends on
        return False
    return True


def _grid_arms(decider: Any) -> bool:
    """Whether ``decider.arms`` is numbered as the base class numbers them
    (:meth:`~lpserve.policy.SpeculationDecider.arm_index`), the numbering of the compiled
    speculative step."""
    from lpserve.policy import SpeculationDecider

    arms = decider.arms
    return len(arms) == 1 + len(decider.drafts) * decider.max_k and all(
        (a.k == 0) == (j == 0) and
        SpeculationDecider.arm_index(decider, a.k, a.draft) == j for j, a in enumerate(arms))
