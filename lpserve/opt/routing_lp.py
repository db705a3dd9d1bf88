"""Routing formulations (``models/routing-lp.md``).

* **Assignment** (``routing-assignment``, (1)–(4)): ``min sum_ij c_ij x_ij`` s.t. every
  request is routed once and replica ``j`` takes at most ``cap_j`` requests. The
  constraint matrix is a bipartite incidence matrix, hence totally unimodular: a basic
  optimal solution (HiGHS simplex) is integral, so rounding is the identity
  (``proofs/assignment-integrality.md``). ``c_ij`` is the expected latency of request
  ``i`` alone on replica ``j`` from the cost model, with the output length uniform on its
  predicted interval (true length when the trace has no prediction).
* **Fluid** (``routing-fluid``, (5)–(13)): request classes (prompt bucket x predicted output
  bucket x prefix group) with arrival rates; per-replica prefill-token, decode-token,
  GPU time-share and KV-memory (Little's law) constraints on heterogeneous replicas; prefix
  affinity through relaxed residency ``z``. LP form with HiGHS (duals by constraint name),
  convex queueing-delay form with cvxpy (:func:`solve_fluid_convex`).

Export: :mod:`lpserve.policies.routers_lp` (assignment table, fluid split, dual-index router).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lpserve.opt.budget import Deadline, as_deadline, run_highs
from lpserve.opt.solution import Formulation, Solution, Status, highs_status


# ======================================================================= cost-model tables
@dataclass(frozen=True, eq=False)
class ReplicaProfile:
    """What the routing models need from one replica's cost model.

    Attributes:
        prefill_grid_tokens, prefill_grid_s: prefill time (s) of one prompt per grid length (g,).
        decode_prefix_s: prefix sums of single-request decode iteration time over context
            c = 0..c_max, shape (c_max + 2,).
        tpot_s: decode iteration time at the reference batch (s).
        prefill_tokens_per_s: mu^P, prefill throughput at the reference chunk.
        decode_tokens_per_s: mu^D, decode throughput at the reference batch.
        kv_tokens: K, KV capacity (tokens).
    """

    prefill_grid_tokens: np.ndarray
    prefill_grid_s: np.ndarray
    decode_prefix_s: np.ndarray
    tpot_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    kv_tokens: float

    def prefill_s(self, tokens: np.ndarray) -> np.ndarray:
        """Prefill seconds of one prompt per length in ``tokens`` (same shape), interpolated."""
        return np.interp(tokens, self.prefill_grid_tokens, self.prefill_grid_s)

    def expected_decode_s(self, prompt: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """E[sum_{c=s}^{s+o-2} t(c)] for o uniform on lo..hi (alone on the replica), (n,)."""
        T1 = self.decode_prefix_s
        S1 = np.concatenate([[0.0], np.cumsum(T1)])          # S1[m] = sum_{q<m} T1[q]
        cmax = T1.size - 1
        top = np.minimum(prompt + hi, cmax)                   # T1 index s + o - 1, o = hi
        bot = np.minimum(prompt + lo - 1, cmax)               # o = lo
        mean_T1 = (S1[top] - S1[bot]) / np.maximum(hi - lo + 1, 1)
        return mean_T1 - T1[np.minimum(prompt, cmax)]


def replica_profile(cost: Any, *, c_max: int, gpu_memory_fraction: float = 0.9,
                    ref_batch: int = 64, ref_context: int = 1024,
                    ref_chunk_tokens: int = 2048) -> ReplicaProfile:
    """Tabulate ``cost`` for routing: prefill on a log grid up to ``c_max``, single-request
    decode prefix sums up to ``c_max`` (on a grid of at most 4096 points), throughputs at
    a reference batch of ``ref_batch`` decodes of ``ref_context`` tokens and a prefill
    chunk of ``ref_chunk_tokens``."""
    c_max = max(int(c_max), 2)
    grid = np.unique(np.concatenate([np.geomspace(1, c_max + 1, 96).astype(np.int64),
                                     [1, c_max + 1]]))
    pre = cost.batch_times_s([{"prefill_tokens": [int(g)]} for g in grid])
    step = max(1, -(-(c_max + 2) // 4096))
    pts = np.arange(0, c_max + 2, step)
    t_pts = cost.batch_times_s([{"decode_context": [int(c)]} for c in pts])
    t = np.interp(np.arange(c_max + 1), pts, t_pts)
    T1 = np.concatenate([[0.0], np.cumsum(t)])
    tpot = float(cost.batch_time_s(decode_context=[ref_context] * ref_batch))
    t_chunk = float(cost.batch_time_s(prefill_tokens=[ref_chunk_tokens]))
    return ReplicaProfile(grid.astype(np.float64), pre, T1, tpot, ref_chunk_tokens / t_chunk,
                          ref_batch / tpot, float(cost.kv_capacity_tokens(gpu_memory_fraction)))


def _replica_costs(instance: Any, replica_costs: Sequence[Any] | None) -> list[Any]:
    if replica_costs is None:
        return [instance.cost_model()] * instance.cluster.n_replicas
    costs = list(replica_costs)
    if not costs:
        raise ValueError("replica_costs must hold at least one cost model, got []")
    return costs


def _output_interval(trace: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    """(lo, hi, clairvoyant): the predicted interval, or the true length when absent."""
    lo, hi = getattr(trace, "predicted_lo", None), getattr(trace, "predicted_hi", None)
    if lo is not None and hi is not None:
        lo = np.maximum(np.asarray(lo, np.int64), 1)
        return lo, np.maximum(np.asarray(hi, np.int64), lo), False
    o = np.asarray(trace.output_tokens, np.int64)
    return o, o, True


# ============================================================================ assignment
@dataclass(frozen=True, eq=False)
class AssignmentModel:
    """``cost_s`` c_ij (n, R) expected latency (s); ``capacity`` cap_j (R,) requests;
    ``clairvoyant``: c used true output lengths (no predictions in the trace)."""

    cost_s: np.ndarray
    capacity: np.ndarray
    clairvoyant: bool
    digest: str = ""
    build_s: float = 0.0


def build_assignment(instance: Any, *, replica_costs: Sequence[Any] | None = None,
                     capacity: Sequence[int] | None = None, slack: float = 1.05,
                     backlog_s: Sequence[float] | None = None,
                     cost_s: np.ndarray | None = None) -> AssignmentModel:
    """Assignment model of ``instance``.

    Args:
        replica_costs: one cost model per replica (default: the cluster's, replicated).
        capacity: cap_j, most requests replica j may take; default: ``slack`` times its
            share of n in proportion to its speed (1 / mean c_ij), rounded up.
        backlog_s: seconds of work already queued on each replica, added to c_ij.
        cost_s: an explicit (n, R) cost matrix (seconds) instead of the cost model.
    """
    t0 = time.perf_counter()
    tr = instance.trace
    n = len(tr.arrival_s)
    lo, hi, clair = _output_interval(tr)
    if cost_s is None:
        costs = _replica_costs(instance, replica_costs)
        s = np.asarray(tr.prompt_tokens, np.int64)
        c_max = int((s + hi).max()) if n else 2
        profs: dict[int, ReplicaProfile] = {}
        cols = []
        for c in costs:
            if id(c) not in profs:
                profs[id(c)] = replica_profile(c, c_max=c_max,
                                               gpu_memory_fraction=instance.cluster.gpu_memory_fraction)
            p = profs[id(c)]
            cols.append(p.prefill_s(s) + p.expected_decode_s(s, lo, hi))     # (1)
        C = np.stack(cols, axis=1) if n else np.zeros((0, len(costs)))
    else:
        C = np.asarray(cost_s, dtype=np.float64)
        if C.ndim != 2 or C.shape[0] != n or not np.all(np.isfinite(C)):
            raise ValueError(f"cost_s must be a finite ({n}, R) array, got shape {C.shape}")
    R = C.shape[1]
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
    return AssignmentModel(C, cap, clair, instance.digest(), time.perf_counter() - t0)


def solve_assignment(model: AssignmentModel, solver: str = "highs",
                     time_limit_s: float | None = None,
                     deadline: Deadline | None = None) -> Solution:
    """Solve (1)–(4) with HiGHS (interior point + crossover); the basic optimum is integral
    (TU), so the rounding ``argmax_j x_ij`` is the identity (checked in :func:`certify_assignment`).
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
    run = run_highs(dict(col_cost=C.ravel(), col_lower=np.zeros(nc), col_upper=np.ones(nc),
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
    prob = cp.Problem(cp.Minimize(cp.sum(cp.multiply(C, x))), [demand, capc])
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
    """Residuals: integrality of x, demand, capacity, and the cost of the rounded
    assignment minus the LP objective (0 for a basic optimum)."""
    if not solution.solved:
        return {"integrality": 0.0, "demand": 0.0, "capacity": 0.0, "rounding_loss_s": 0.0}
    x, r = solution.primal["x"], solution.primal["replica"]
    n, R = model.cost_s.shape
    counts = np.bincount(r, minlength=R)
    return {"integrality": float(np.abs(x - np.round(x)).max()),
            "demand": float(np.abs(x.sum(axis=1) - 1).max()),
            "capacity": float(max(0, (counts - model.capacity).max())),
            "rounding_loss_s": float(model.cost_s[np.arange(n), r].sum() - solution.objective)}


def export_assignment(solution: Solution, instance: Any) -> Any:
    """The integral assignment as an offline table router."""
    from lpserve.policies.routers_lp import AssignmentRouter

    solution.require_solved(instance.digest())
    return AssignmentRouter(solution.primal["replica"])


# ================================================================================= fluid
@dataclass(frozen=True, eq=False)
class FluidModel:
    """Classes c (C) x replicas m (R) x prefix groups g (G).

    Attributes:
        rate_per_s: lambda_c (C,); prompt_tokens P_c, output_tokens D_c (predicted mean),
            prefix_tokens S_c (reusable prefix) (C,); group g_c (C,) int64;
            group_prefix_tokens S_g (G,).
        latency_s: l_cm (C, R) prefill + decode seconds at the reference batch;
        cache_saving_s: delta_cm (C, R) prefill seconds saved by a prefix hit;
        kv_token_s: h_cm (C, R) KV token-seconds per request (Little's law);
        prefill_tokens_per_s, decode_tokens_per_s, kv_tokens, tpot_s (R,); utilization rho.
        prompt_edges, output_edges: bucket edges (tokens); group_keys: tenant id of each
            group (-1 for "all others").
    """

    rate_per_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_tokens: np.ndarray
    group: np.ndarray
    group_prefix_tokens: np.ndarray
    latency_s: np.ndarray
    cache_saving_s: np.ndarray
    kv_token_s: np.ndarray
    prefill_tokens_per_s: np.ndarray
    decode_tokens_per_s: np.ndarray
    kv_tokens: np.ndarray
    tpot_s: np.ndarray
    prefill_fit: np.ndarray
    utilization: float
    prompt_edges: np.ndarray
    output_edges: np.ndarray
    group_keys: np.ndarray
    digest: str = ""
    build_s: float = 0.0

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(C, R, G)``: classes, replicas and prefix groups."""
        return (self.rate_per_s.size, self.latency_s.shape[1], self.group_prefix_tokens.size)


def _edges(x: np.ndarray, buckets: int) -> np.ndarray:
    if x.size == 0 or buckets <= 1:
        return np.zeros(0)
    return np.unique(np.quantile(x, np.arange(1, buckets) / buckets))


def build_fluid(instance: Any, *, replica_costs: Sequence[Any] | None = None,
                n_prompt_buckets: int = 4, n_output_buckets: int = 4, max_groups: int = 8,
                utilization: float = 0.9, duration_s: float | None = None,
                rate_scale: float = 1.0) -> FluidModel:
    """Classes and replica rates of ``instance`` (``models/routing-lp.md`` (5)).

    Classes are prompt-length bucket x predicted-output bucket (quantile edges) x prefix
    group (the ``max_groups - 1`` most frequent tenants, the rest pooled; one group when
    the trace has no tenants). ``rate_per_s`` = class count / ``duration_s`` (default: the
    trace's arrival span) x ``rate_scale``. ``utilization`` is rho, the largest allowed
    share of each replica's prefill, decode and GPU time.
    """
    from lpserve.opt.lower_bounds import reusable_prefix_tokens

    t0 = time.perf_counter()
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale!r}")
    tr = instance.trace
    n = len(tr.arrival_s)
    if n == 0:
        raise ValueError("routing-fluid: the trace has no requests")
    costs = _replica_costs(instance, replica_costs)
    s = np.asarray(tr.prompt_tokens, np.int64)
    lo, hi, _ = _output_interval(tr)
    d = (lo + hi) / 2.0
    pref = reusable_prefix_tokens(tr).astype(np.float64)
    pe, oe = _edges(s.astype(float), n_prompt_buckets), _edges(d, n_output_buckets)
    tenant = getattr(tr, "tenant", None)
    if tenant is not None and np.any(np.asarray(tenant) >= 0):
        ten = np.asarray(tenant, np.int64)
        vals, cnt = np.unique(ten, return_counts=True)
        top = vals[np.argsort(-cnt, kind="stable")][:max(1, max_groups - 1)]
        keys = np.concatenate([top, [-1]]) if vals.size > top.size else top
        lookup = {int(k): q for q, k in enumerate(keys)}
        other = lookup.get(-1, 0)
        g = np.array([lookup.get(int(t), other) for t in ten], np.int64)
    else:
        keys, g = np.array([-1]), np.zeros(n, np.int64)
    key = (np.searchsorted(pe, s, side="right") * (oe.size + 1)
           + np.searchsorted(oe, d, side="right")) * keys.size + g
    cls, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    span = float(np.ptp(tr.arrival_s)) if duration_s is None else float(duration_s)
    if not span > 0:
        span = 1.0
    mean = lambda x: np.bincount(inv, weights=x, minlength=cls.size) / cnt
    P, D, S = mean(s.astype(float)), mean(d), mean(pref)
    gc = cls % keys.size
    SG = np.array([pref[g == q].mean() if np.any(g == q) else 0.0 for q in range(keys.size)])
    c_max = int(max(s.max() + hi.max(), 2))
    profs = {}
    for c in costs:
        if id(c) not in profs:
            profs[id(c)] = replica_profile(c, c_max=c_max,
                                           gpu_memory_fraction=instance.cluster.gpu_memory_fraction)
    pr = [profs[id(c)] for c in costs]
    tpot = np.array([p.tpot_s for p in pr])
    lat = np.stack([p.prefill_s(P) + D * p.tpot_s for p in pr], axis=1)          # (6)
    sav = np.stack([p.prefill_s(P) - p.prefill_s(np.maximum(P - S, 1)) for p in pr], axis=1)
    kvh = ((P + D / 2.0) * D)[:, None] * tpot[None, :]                          # (10)
    fit = np.array([np.polyfit(p.prefill_grid_tokens, p.prefill_grid_s, 1)[::-1] for p in pr])
    return FluidModel(cnt / span * rate_scale, P, D, S, gc.astype(np.int64), SG, lat, sav, kvh,
                      np.array([p.prefill_tokens_per_s for p in pr]),
                      np.array([p.decode_tokens_per_s for p in pr]),
                      np.array([p.kv_tokens for p in pr]), tpot, fit, float(utilization),
                      pe, oe, np.asarray(keys, np.int64), instance.digest(),
                      time.perf_counter() - t0)


def _fluid_rows(m: FluidModel):
    """COO triplets and row bounds of (7)–(12); variable order a (C*R), u (C*R), z (G*R)."""
    C, R, G = m.shape
    a = lambda c, r: c * R + r
    u = lambda c, r: C * R + c * R + r
    z = lambda q, r: 2 * C * R + q * R + r
    cc, rr = np.meshgrid(np.arange(C), np.arange(R), indexing="ij")
    cc, rr = cc.ravel(), rr.ravel()
    rows, cols, vals, lo, hi, names = [], [], [], [], [], []

    def fam(name, n_rows, r_idx, c_idx, v, lower, upper):
        base = sum(x.size for x in lo)
        rows.append(base + r_idx)
        cols.append(c_idx)
        vals.append(v)
        lo.append(np.broadcast_to(np.asarray(lower, float), (n_rows,)).copy())
        hi.append(np.broadcast_to(np.asarray(upper, float), (n_rows,)).copy())
        names.append((name, base, n_rows))

    fam("demand", C, cc, a(cc, rr), np.ones(cc.size), m.rate_per_s, m.rate_per_s)      # (7)
    fam("prefill", R, np.concatenate([rr, rr]), np.concatenate([a(cc, rr), u(cc, rr)]),
        np.concatenate([m.prompt_tokens[cc], -m.prefix_tokens[cc]]), -np.inf,
        m.utilization * m.prefill_tokens_per_s)                                         # (8)
    fam("decode", R, rr, a(cc, rr), m.output_tokens[cc], -np.inf,
        m.utilization * m.decode_tokens_per_s)                                          # (9)
    gpu_a = m.prompt_tokens[cc] / m.prefill_tokens_per_s[rr] \
        + m.output_tokens[cc] / m.decode_tokens_per_s[rr]
    fam("gpu", R, np.concatenate([rr, rr]), np.concatenate([a(cc, rr), u(cc, rr)]),
        np.concatenate([gpu_a, -m.prefix_tokens[cc] / m.prefill_tokens_per_s[rr]]),
        -np.inf, m.utilization)                                                         # (11)
    gq, gr = np.meshgrid(np.arange(G), np.arange(R), indexing="ij")
    fam("kv", R, np.concatenate([rr, gr.ravel()]), np.concatenate([a(cc, rr), z(gq.ravel(), gr.ravel())]),
        np.concatenate([m.kv_token_s[cc, rr], m.group_prefix_tokens[gq.ravel()]]),
        -np.inf, m.kv_tokens)                                                           # (10)
    k = np.arange(cc.size)
    fam("cache_rate", C * R, np.concatenate([k, k]), np.concatenate([u(cc, rr), a(cc, rr)]),
        np.concatenate([np.ones(k.size), -np.ones(k.size)]), -np.inf, 0.0)              # (12)
    fam("cache_residency", C * R, np.concatenate([k, k]),
        np.concatenate([u(cc, rr), z(m.group[cc], rr)]),
        np.concatenate([np.ones(k.size), -m.rate_per_s[cc]]), -np.inf, 0.0)             # (12)
    return (np.concatenate(rows), np.concatenate(cols), np.concatenate(vals),
            np.concatenate(lo), np.concatenate(hi), names)


def solve_fluid(model: FluidModel, solver: str = "highs",
                time_limit_s: float | None = None, deadline: Deadline | None = None) -> Solution:
    """LP form (``models/routing-lp.md`` (13)) with HiGHS (``deadline`` from ``lp.solve``
    wins over ``time_limit_s``; at the limit: ``LIMIT``); ``solver="cvxpy"`` runs the
    convex queueing form instead (:func:`solve_fluid_convex`)."""
    if solver == "cvxpy":
        return solve_fluid_convex(model)
    if solver != "highs":
        raise ValueError(f"solver must be 'highs' or 'cvxpy', got {solver!r}")
    from scipy import sparse

    t0 = time.perf_counter()
    C, R, G = model.shape
    rows, cols, vals, lo, hi, names = _fluid_rows(model)
    nv = 2 * C * R + G * R
    A = sparse.csc_matrix((vals, (rows, cols)), shape=(lo.size, nv))
    cost = np.concatenate([model.latency_s.ravel(), -model.cache_saving_s.ravel(),
                           np.zeros(G * R)])
    run = run_highs(dict(col_cost=cost, col_lower=np.zeros(nv),
                         col_upper=np.r_[np.full(2 * C * R, np.inf), np.ones(G * R)],
                         row_lower=lo, row_upper=hi, a_start=A.indptr, a_index=A.indices,
                         a_value=A.data), deadline=as_deadline(deadline, time_limit_s))
    status, obj, bound, text = highs_status(run, has_integers=False)
    primal, dual, msg = {}, {}, text
    if status == Status.OPTIMAL:
        x, rd = run.col_value, run.row_dual
        primal = _fluid_primal(model, x[:C * R].reshape(C, R), x[C * R:2 * C * R].reshape(C, R),
                               x[2 * C * R:].reshape(G, R))
        for name, base, k in names:
            v = rd[base:base + k]
            dual[name] = v.copy() if name == "demand" else np.maximum(-v, 0.0)
    elif status == Status.INFEASIBLE:
        msg = _fluid_diagnosis(model)
    return Solution("routing-fluid", status, obj, bound, model.build_s + time.perf_counter() - t0,
                    model.digest, primal, dual, message=msg, objective_units="request-s/s",
                    info={"n_classes": C, "n_replicas": R, "n_groups": G, "form": "lp",
                          "n_rows": int(lo.size), "n_columns": int(nv)})


def _fluid_primal(m: FluidModel, a: np.ndarray, u: np.ndarray, z: np.ndarray) -> dict:
    split = a / np.maximum(m.rate_per_s[:, None], 1e-300)
    return {"rate_per_s": a, "cached_rate_per_s": u, "residency": z, "split": split,
            "class_prompt_tokens": m.prompt_tokens, "class_output_tokens": m.output_tokens,
            "class_group": m.group, "prompt_edges": m.prompt_edges,
            "output_edges": m.output_edges, "group_keys": m.group_keys,
            "prefill_fit": m.prefill_fit, "tpot_s": m.tpot_s,
            "prefill_tokens_per_s": m.prefill_tokens_per_s,
            "decode_tokens_per_s": m.decode_tokens_per_s,
            "group_saving_s": _group_saving(m, z)}


def _group_saving(m: FluidModel, z: np.ndarray) -> np.ndarray:
    """(G, R) mean prefill seconds a request of group g saves on m where its prefix is
    resident (z > 1/2), else 0."""
    G = z.shape[0]
    tot = np.zeros((G, m.latency_s.shape[1]))
    np.add.at(tot, m.group, m.cache_saving_s)
    cnt = np.maximum(np.bincount(m.group, minlength=G), 1)[:, None]
    return tot / cnt * (z > 0.5)


def _fluid_diagnosis(m: FluidModel) -> str:
    """Name the resource whose aggregate demand is largest relative to its supply."""
    need = {"decode": float(m.rate_per_s @ m.output_tokens),
            "prefill": float(m.rate_per_s @ np.maximum(m.prompt_tokens - m.prefix_tokens, 0)),
            "kv": float(m.rate_per_s @ m.kv_token_s.min(axis=1))}
    have = {"decode": float(m.utilization * m.decode_tokens_per_s.sum()),
            "prefill": float(m.utilization * m.prefill_tokens_per_s.sum()),
            "kv": float(m.kv_tokens.sum())}
    unit = {"decode": "decode tokens/s", "prefill": "prefill tokens/s", "kv": "KV tokens"}
    worst = max(need, key=lambda k: need[k] / have[k])
    return (f"infeasible: demand needs {need[worst]:.4g} {unit[worst]}, replicas give at "
            f"most {have[worst]:.4g} (utilization {m.utilization}); ratios "
            + ", ".join(f"{k} {need[k] / have[k]:.3g}" for k in need))


def solve_fluid_convex(model: FluidModel, congestion_weight: float = 1.0) -> Solution:
    """Convex form with cvxpy (``models/routing-lp.md`` (14)): the LP objective plus
    ``congestion_weight * sum_m rho_m / (1 - rho_m)`` (M/M/1 number in system, convex in
    the GPU time share rho_m), under the same constraints. Duals by constraint name."""
    import cvxpy as cp

    t0 = time.perf_counter()
    C, R, G = model.shape
    a = cp.Variable((C, R), nonneg=True)
    u = cp.Variable((C, R), nonneg=True)
    z = cp.Variable((G, R), nonneg=True)
    P, D, S = model.prompt_tokens, model.output_tokens, model.prefix_tokens
    gpu = (cp.sum(cp.multiply(a, (P[:, None] / model.prefill_tokens_per_s[None, :]
                                  + D[:, None] / model.decode_tokens_per_s[None, :])), axis=0)
           - cp.sum(cp.multiply(u, S[:, None] / model.prefill_tokens_per_s[None, :]), axis=0))
    onehot = np.eye(G)[model.group]                                   # (C, G)
    cons = {
        "demand": cp.sum(a, axis=1) == model.rate_per_s,
        "prefill": P @ a - S @ u <= model.utilization * model.prefill_tokens_per_s,
        "decode": D @ a <= model.utilization * model.decode_tokens_per_s,
        "gpu": gpu <= model.utilization,
        "kv": cp.sum(cp.multiply(a, model.kv_token_s), axis=0)
        + model.group_prefix_tokens @ z <= model.kv_tokens,
        "cache_rate": u <= a,
        "cache_residency": u <= cp.multiply(model.rate_per_s[:, None], onehot @ z),
        "residency_max": z <= 1,
    }
    lin = cp.sum(cp.multiply(model.latency_s, a)) - cp.sum(cp.multiply(model.cache_saving_s, u))
    obj = lin + congestion_weight * cp.sum(cp.inv_pos(1 - gpu) - 1)
    prob = cp.Problem(cp.Minimize(obj), list(cons.values()))
    try:
        prob.solve(solver=cp.CLARABEL)
    except cp.error.SolverError as exc:
        return Solution("routing-fluid", Status.ERROR, wall_s=time.perf_counter() - t0,
                        digest=model.digest, message=str(exc), objective_units="request-s/s")
    st = {cp.OPTIMAL: Status.OPTIMAL, cp.OPTIMAL_INACCURATE: Status.FEASIBLE,
          cp.INFEASIBLE: Status.INFEASIBLE, cp.UNBOUNDED: Status.UNBOUNDED}.get(prob.status,
                                                                              Status.ERROR)
    primal, dual = {}, {}
    if st in (Status.OPTIMAL, Status.FEASIBLE):
        primal = _fluid_primal(model, np.maximum(a.value, 0), np.maximum(u.value, 0),
                               np.clip(z.value, 0, 1))
        primal["gpu_utilization"] = np.asarray(gpu.value)
        for k, c in cons.items():
            dv = np.asarray(c.dual_value, dtype=np.float64)
            dual[k] = -dv if k == "demand" else np.maximum(dv, 0.0)
    v = float(prob.value) if st in (Status.OPTIMAL, Status.FEASIBLE) else math.nan
    return Solution("routing-fluid", st, v, v if st == Status.OPTIMAL else math.nan,
                    model.build_s + time.perf_counter() - t0, model.digest, primal, dual,
                    message=str(prob.status) if st != Status.INFEASIBLE else _fluid_diagnosis(model),
                    objective_units="request-s/s",
                    info={"n_classes": C, "n_replicas": R, "n_groups": G, "form": "convex"})


def certify_fluid(model: FluidModel, solution: Solution) -> dict[str, float]:
    """Residuals: demand, each capacity row's excess, and cache-rate linking."""
    if not solution.solved:
        return {"demand": 0.0, "capacity": 0.0, "cache": 0.0}
    a, u = solution.primal["rate_per_s"], solution.primal["cached_rate_per_s"]
    z = solution.primal["residency"]
    m = model
    pre = m.prompt_tokens @ a - m.prefix_tokens @ u - m.utilization * m.prefill_tokens_per_s
    dec = m.output_tokens @ a - m.utilization * m.decode_tokens_per_s
    kv = (a * m.kv_token_s).sum(axis=0) + m.group_prefix_tokens @ z - m.kv_tokens
    rel = max(float(np.max(pre / m.prefill_tokens_per_s)), float(np.max(dec / m.decode_tokens_per_s)),
              float(np.max(kv / m.kv_tokens)))
    return {"demand": float(np.abs(a.sum(axis=1) - m.rate_per_s).max() / m.rate_per_s.max()),
            "capacity": max(0.0, rel),
            "cache": float(max(0.0, (u - a).max(), (u - m.rate_per_s[:, None] * z[m.group]).max()))}


def export_fluid(solution: Solution, instance: Any, kind: str = "index") -> Any:
    """``kind="index"``: :class:`~lpserve.policies.routers_lp.DualIndexRouter` (argmin of
    latency + dual prices x resource use + live queue); ``kind="split"``:
    :class:`~lpserve.policies.routers_lp.FluidSplitRouter` (random, following a / lambda)."""
    from lpserve.policies.routers_lp import DualIndexRouter, FluidSplitRouter

    solution.require_solved(instance.digest() if instance is not None else None)
    if kind == "index":
        return DualIndexRouter.from_solution(solution)
    if kind == "split":
        return FluidSplitRouter.from_solution(solution)
    raise ValueError(f"kind must be 'index' or 'split', got {kind!r}")


ROUTING_ASSIGNMENT = Formulation("routing-assignment", build_assignment, solve_assignment,
                                 certify_assignment, export_assignment)
ROUTING_FLUID = Formulation("routing-fluid", build_fluid, solve_fluid, certify_fluid,
                            export_fluid)
