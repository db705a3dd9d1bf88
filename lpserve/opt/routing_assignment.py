"""The routing assignment LP (``routing-assignment``, ``models/routing-lp.md`` (1)-(4a)).

``min sum_ij c_ij x_ij`` s.t. every request is routed once and replica ``j`` takes at most
``cap_j`` requests, ``x_ij = 0`` where replica ``j`` cannot hold request ``i``. The
constraint matrix is a bipartite incidence matrix, hence totally unimodular: a basic
optimal solution (HiGHS simplex) is integral, so rounding is the identity
(``proofs/assignment-integrality.md``). ``c_ij`` is the expected latency of request ``i``
alone on replica ``j`` from ``j``'s own cost model (only its uncached prefill with
``cached_tokens``), with the output length uniform on its predicted interval (true length
when the trace has no prediction).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lpserve.opt.budget import Deadline, as_deadline, run_highs
from lpserve.opt.routing_profile import ReplicaProfile, output_interval, replica_profile
from lpserve.opt.routing_profile import replica_costs as per_replica_costs
from lpserve.opt.solution import Formulation, Solution, Status, highs_status

__all__ = ["ROUTING_ASSIGNMENT", "AssignmentModel", "build_assignment", "certify_assignment",
           "export_assignment", "solve_assignment"]


@dataclass(frozen=True, eq=False)
class AssignmentModel:
    """``cost_s`` c_ij (n, R) expected latency (s); ``capacity`` cap_j (R,) requests;
    ``clairvoyant``: c used true output lengths (no predictions in the trace);
    ``allowed`` (n, R) bool: replica j can hold request i (``models/routing-lp.md`` (4a);
    None: every pair)."""

    cost_s: np.ndarray
    capacity: np.ndarray
    clairvoyant: bool
    digest: str = ""
    build_s: float = 0.0
    allowed: np.ndarray | None = None


def build_assignment(instance: Any, *, replica_costs: Sequence[Any] | None = None,
                     capacity: Sequence[int] | None = None, slack: float = 1.05,
                     backlog_s: Sequence[float] | None = None,
                     cost_s: np.ndarray | None = None,
                     cached_tokens: np.ndarray | None = None,
                     allowed: np.ndarray | None = None) -> AssignmentModel:
    """Assignment model of ``instance``.

    Args:
        replica_costs: one cost model per replica (default: the instance's, one per
            replica: each its own GPU type and TP).
        capacity: cap_j, most requests replica j may take; default: ``slack`` times its
            share of n in proportion to its speed (1 / mean c_ij), rounded up.
        backlog_s: seconds of work already queued on each replica, added to c_ij.
        cost_s: an explicit (n, R) cost matrix (seconds) instead of the cost model.
        cached_tokens: (n, R) prompt tokens of request i already in replica j's prefix
            cache; c_ij then prices only the uncached prefill (``models/routing-lp.md``
            (1a)).
        allowed: (n, R) bool, the pairs that may be assigned; default (cost model): replica
            j's KV holds request i's whole sequence, prompt + predicted upper output
            (4a); with ``cost_s``: every pair.
    """
    t0 = time.perf_counter()
    tr = instance.trace
    n = len(tr.arrival_s)
    lo, hi, clair = output_interval(tr)
    if cost_s is None:
        costs = per_replica_costs(instance, replica_costs)
        s = np.asarray(tr.prompt_tokens, np.int64)
        c_max = int((s + hi).max()) if n else 2
        if cached_tokens is not None:
            h = np.asarray(cached_tokens, np.int64)
            if h.shape != (n, len(costs)) or np.any(h < 0) or np.any(h > s[:, None]):
                raise ValueError(f"cached_tokens must be ({n}, {len(costs)}) integers in "
                                 f"[0, prompt_tokens], got shape {h.shape}")
        profs: dict[int, ReplicaProfile] = {}
        cols, fit = [], []
        for j, c in enumerate(costs):
            if id(c) not in profs:
                profs[id(c)] = replica_profile(
                    c, c_max=c_max, gpu_memory_fraction=instance.cluster.gpu_memory_fraction)
            p = profs[id(c)]
            pre = p.prefill_s(s) if cached_tokens is None else \
                p.prefill_cached_s(s, h[:, j])                                  # (1a)
            cols.append(pre + p.expected_decode_s(s, lo, hi))                   # (1)
            fit.append(s + hi <= p.kv_tokens)                                   # (4a)
        C = np.stack(cols, axis=1) if n else np.zeros((0, len(costs)))
        if allowed is None:
            allowed = np.stack(fit, axis=1) if n else np.zeros((0, len(costs)), bool)
    else:
        C = np.asarray(cost_s, dtype=np.float64)
        if C.ndim != 2 or C.shape[0] != n or not np.all(np.isfinite(C)):
            raise ValueError(f"cost_s must be a finite ({n}, R) array, got shape {C.shape}")
    R = C.shape[1]
    if allowed is not None:
        allowed = np.asarray(allowed, bool)
        if allowed.shape != C.shape:
            raise ValueError(f"allowed must have shape {C.shape}, got {allowed.shape}")
    if backlog_s is not None:
        b = np.asarray(backlog_s, dtype=np.float64)
        if b.shape != (R,) or np.any(b < 0):
            raise ValueError(f"backlog_s must be {R} non-negative seconds, got {backlog_s!r}")
        C = C + b[None, :]
    if capacity is None:
        if not slack >= 1.0:
            raise ValueError(f"slack must be >= 1, got {slack!r}")
        speed = 1.0 / np.maximum(C.mean(axis=0), 1e-12) if n else np.ones(R)
        cap = np.ceil(slack * n * speed / speed.sum()).astype(np.int64)
    else:
        cap = np.asarray(capacity, dtype=np.int64)
        if cap.shape != (R,) or np.any(cap < 0):
            raise ValueError(f"capacity must be {R} non-negative integers, got {capacity!r}")
    return AssignmentModel(C, cap, clair, instance.digest(), time.perf_counter() - t0,
                           allowed)


def solve_assignment(model: AssignmentModel, solver: str = "highs",
                     time_limit_s: float | None = None,
                     deadline: Deadline | None = None) -> Solution:
    """Solve (1)–(4a) with HiGHS (interior point + crossover); the basic optimum is
    integral (TU), the
    rounding ``argmax_j x_ij`` is then the identity (checked in :func:`certify_assignment`).
    ``deadline`` (from ``lp.solve``) wins over ``time_limit_s``; at the limit: ``LIMIT``."""
    if solver not in ("highs", "cvxpy"):
        raise ValueError(f"solver must be 'highs' or 'cvxpy', got {solver!r}")
    t0 = time.perf_counter()
    C, cap = model.cost_s, model.capacity
    n, R = C.shape
    if cap.sum() < n:
        return Solution("routing-assignment", Status.INFEASIBLE, wall_s=model.build_s,
                        digest=model.digest, objective_units="s",
                        message=f"capacity sums to {int(cap.sum())} < {n} requests "
                                f"(capacity={cap.tolist()})")
    ok = model.allowed
    if ok is not None and n and not ok.any(axis=1).all():
        i = int(np.flatnonzero(~ok.any(axis=1))[0])
        return Solution("routing-assignment", Status.INFEASIBLE, wall_s=model.build_s,
                        digest=model.digest, objective_units="s",
                        message=f"request {i} fits on no replica (allowed row all False; "
                                f"{int((~ok.any(axis=1)).sum())} such requests)")
    if n == 0:
        return Solution("routing-assignment", Status.OPTIMAL, 0.0, 0.0, model.build_s,
                        model.digest, primal={"replica": np.zeros(0, np.int64)},
                        objective_units="s")
    if solver == "cvxpy":
        return _solve_assignment_cvxpy(model, t0)
    nc = n * R
    a_start = np.arange(0, 2 * nc + 1, 2, dtype=np.int64)
    a_index = np.empty(2 * nc, dtype=np.int64)
    a_index[0::2] = np.repeat(np.arange(n), R)                        # (2) demand rows
    a_index[1::2] = n + np.tile(np.arange(R), n)                      # (3) capacity rows
    upper = np.ones(nc) if ok is None else ok.ravel().astype(np.float64)      # (4a)
    run = run_highs(dict(col_cost=C.ravel(), col_lower=np.zeros(nc), col_upper=upper,
                         row_lower=np.concatenate([np.ones(n), np.full(R, -np.inf)]),
                         row_upper=np.concatenate([np.ones(n), cap.astype(np.float64)]),
                         a_start=a_start, a_index=a_index, a_value=np.ones(2 * nc)),
                    deadline=as_deadline(deadline, time_limit_s),
                    # interior point + crossover ends at a vertex (integral, by TU), and is
                    # 2-3x faster than dual simplex on 10^5 columns (benchmarks/)
                    options={"solver": "ipm", "run_crossover": "on"})
    status, obj, bound, text = highs_status(run, has_integers=False)
    primal, dual = {}, {}
    if status == Status.OPTIMAL:
        x = run.col_value.reshape(n, R)
        rd = run.row_dual
        primal = {"x": x, "replica": x.argmax(axis=1).astype(np.int64)}
        dual = {"demand": rd[:n].copy(), "capacity": np.maximum(-rd[n:], 0.0)}
    return Solution("routing-assignment", status, obj, bound,
                    model.build_s + time.perf_counter() - t0, model.digest, primal, dual,
                    message=text, objective_units="s",
                    info={"n_requests": n, "n_replicas": R, "solver": "highs",
                          "clairvoyant_costs": model.clairvoyant})


def _solve_assignment_cvxpy(model: AssignmentModel, t0: float) -> Solution:
    import cvxpy as cp

    C, cap = model.cost_s, model.capacity
    n, R = C.shape
    x = cp.Variable((n, R), nonneg=True)
    demand = cp.sum(x, axis=1) == 1
    capc = cp.sum(x, axis=0) <= cap
    cons = [demand, capc]
    if model.allowed is not None and not model.allowed.all():
        cons.append(cp.multiply(x, (~model.allowed).astype(float)) == 0)       # (4a)
    prob = cp.Problem(cp.Minimize(cp.sum(cp.multiply(C, x))), cons)
    t_build = time.perf_counter() - t0
    prob.solve(solver=cp.HIGHS, highs_options={"solver": "ipm", "run_crossover": "on"})
    ok = prob.status == cp.OPTIMAL
    xv = np.asarray(x.value) if ok else None
    st = prob.solver_stats
    return Solution("routing-assignment", Status.OPTIMAL if ok else Status.ERROR,
                    float(prob.value) if ok else math.nan, float(prob.value) if ok else math.nan,
                    model.build_s + time.perf_counter() - t0, model.digest,
                    {"x": xv, "replica": xv.argmax(axis=1).astype(np.int64)} if ok else {},
                    {"demand": -np.asarray(demand.dual_value), "capacity":
                     np.maximum(np.asarray(capc.dual_value), 0.0)} if ok else {},
                    message=str(prob.status), objective_units="s",
                    info={"n_requests": n, "n_replicas": R, "solver": "cvxpy+highs",
                          "cvxpy_build_s": t_build,
                          "solver_s": float(st.solve_time or math.nan)})


def certify_assignment(model: AssignmentModel, solution: Solution) -> dict[str, float]:
    """Residuals: integrality of x, demand, capacity, mass on pairs that are not allowed,
    and the cost of the rounded assignment minus the LP objective (0 for a basic
    optimum)."""
    if not solution.solved:
        return {"integrality": 0.0, "demand": 0.0, "capacity": 0.0, "allowed": 0.0,
                "rounding_loss_s": 0.0}
    x, r = solution.primal["x"], solution.primal["replica"]
    n, R = model.cost_s.shape
    counts = np.bincount(r, minlength=R)
    return {"integrality": float(np.abs(x - np.round(x)).max()),
            "demand": float(np.abs(x.sum(axis=1) - 1).max()),
            "capacity": float(max(0, (counts - model.capacity).max())),
            "allowed": 0.0 if model.allowed is None or not n else
            float(np.abs(x[~model.allowed]).max(initial=0.0)),
            "rounding_loss_s": float(model.cost_s[np.arange(n), r].sum() - solution.objective)}


def export_assignment(solution: Solution, instance: Any) -> Any:
    """The integral assignment as an offline table router."""
    from lpserve.policies.routers_lp import AssignmentRouter

    solution.require_solved(instance.digest())
    return AssignmentRouter(solution.primal["replica"])


ROUTING_ASSIGNMENT = Formulation("routing-assignment", build_assignment, solve_assignment,
                                 certify_assignment, export_assignment)
