"""Cheap lower bounds on total latency in the GPU cost model (``srpt-bound``).

``models/cost-lp.md`` (18)-(19), ``proofs/cost-lp-bound.md`` part B:

* every request's latency is at least its floor ``P_i + D_i`` (its least prefill time plus
  its least decode time; the same floors the LP uses), so the total is at least their sum;
* every token takes at least its A-increment (and its B-increment) of some replica's time
  (the share of an iteration in (4) is never below the increment), so the requests are jobs
  with release ``a_i`` and work ``W_i`` on a cluster that does at most ``R`` seconds of such
  work per second: the flow time of preemptive SRPT on one machine of speed ``R``
  (Schrage, *Oper. Res.* 16(3), 1968; ``proofs/cost-lp-bound.md``) is a lower bound.

The value is the largest of the three. Closed form plus one O(n log n) event simulation.
"""
from __future__ import annotations

import heapq
import time
from typing import Any

import numpy as np

from lpserve.opt.cost_lp import request_floors
from lpserve.opt.cost_lp_terms import iteration_minorant
from lpserve.opt.solution import Formulation, Solution, SolutionError, Status

__all__ = ["srpt_flow_time", "SRPT_BOUND", "build_srpt_bound", "solve_srpt_bound"]


def srpt_flow_time(release: np.ndarray, work: np.ndarray, speed: float = 1.0) -> float:
    """Total flow time ``sum (C_j - r_j)`` of preemptive SRPT on one machine of ``speed``
    (work units per second): optimal for ``1 | r_j, pmtn | sum F_j`` (Schrage). Arrays
    shape (n,); times in seconds, work in speed * seconds."""
    r = np.asarray(release, np.float64)
    p = np.asarray(work, np.float64) / float(speed)
    order = np.argsort(r, kind="stable")
    heap: list[tuple[float, int]] = []
    t = 0.0
    total = 0.0
    k = 0
    n = r.size
    while k < n or heap:
        if not heap:
            t = max(t, float(r[order[k]]))
        while k < n and r[order[k]] <= t:
            j = int(order[k])
            heapq.heappush(heap, (float(p[j]), j))
            k += 1
        rem, j = heapq.heappop(heap)
        nxt = float(r[order[k]]) if k < n else np.inf
        if t + rem <= nxt:
            t += rem
            total += t - float(r[j])
        else:
            heapq.heappush(heap, (rem - (nxt - t), j))
            t = nxt
    return float(total)


def build_srpt_bound(instance: Any) -> dict[str, Any]:
    """Per-request floors and A-/B-works (s of one replica) of ``instance``."""
    t0 = time.perf_counter()
    cost = instance.cost_model()
    out: dict[str, Any] = {"digest": instance.digest(), "n": len(instance.trace)}
    try:
        m = iteration_minorant(cost)
    except ValueError as exc:
        out.update(error=str(exc), build_s=time.perf_counter() - t0)
        return out
    tr = instance.trace
    s = np.asarray(tr.prompt_tokens, np.int64)
    o = np.asarray(tr.output_tokens, np.int64)
    fl = request_floors(instance, cost)
    nd = np.maximum(o - 1, 0).astype(np.float64)
    ctx_sum = nd * s + nd * (nd - 1) / 2.0                 # contexts s..s+o-2
    work_a = nd * m.dec0_a + m.dec1 * ctx_sum + fl.uncached * m.pre_a
    work_b = work_a + nd * (m.lin_token + m.head_seq) + fl.uncached * m.lin_token
    out.update(release=np.asarray(tr.arrival_s, np.float64), floor=fl.prefill_s + fl.decode_s,
               work_a=work_a, work_b=work_b, replicas=instance.cluster.n_replicas,
               build_s=time.perf_counter() - t0)
    return out


def solve_srpt_bound(model: dict[str, Any], solver: str = "closed-form",
                     time_limit_s: float | None = None) -> Solution:
    """The bound (s, total latency): OPTIMAL with ``objective == bound``; ERROR when the
    cost model has no minorant. ``info`` holds each of the three terms."""
    t0 = time.perf_counter()
    if "error" in model:
        return Solution("srpt-bound", Status.ERROR, wall_s=model["build_s"],
                        digest=model["digest"], message=model["error"], objective_units="s")
    R = float(model["replicas"])
    floors = float(model["floor"].sum())
    sa = srpt_flow_time(model["release"], model["work_a"], R)
    sb = srpt_flow_time(model["release"], model["work_b"], R)
    v = max(floors, sa, sb)
    return Solution("srpt-bound", Status.OPTIMAL, v, v, model["build_s"] + time.perf_counter() - t0,
                    model["digest"], objective_units="s",
                    info={"floors_total_s": floors, "srpt_a_total_s": sa,
                          "srpt_b_total_s": sb, "n_requests": int(model["n"])})


def _certify(model: dict[str, Any], solution: Solution) -> dict[str, float]:
    if not solution.solved:
        return {"objective_residual": 0.0}
    again = solve_srpt_bound(model)
    return {"objective_residual": abs(again.objective - solution.objective)}


def _no_export(solution: Solution, instance: Any) -> Any:
    raise SolutionError("srpt-bound is a bound and exports no policy")


SRPT_BOUND = Formulation("srpt-bound", build_srpt_bound, solve_srpt_bound, _certify,
                         _no_export, is_bound=True)
