"""Routing formulations (``models/routing-lp.md``).

* **Assignment** (``routing-assignment``, (1)–(4a)): in
  :mod:`lpserve.opt.routing_assignment`, re-exported here.
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
from lpserve.opt.routing_assignment import (  # noqa: F401  (re-exported)
    ROUTING_ASSIGNMENT,
    AssignmentModel,
    build_assignment,
    certify_assignment,
    export_assignment,
    solve_assignment,
)
from lpserve.opt.routing_profile import (
    output_interval,
    replica_profile,
)
from lpserve.opt.routing_profile import replica_costs as per_replica_costs
from lpserve.opt.solution import Formulation, Solution, Status, highs_status


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
        prefill_s: t_cm (C, R) mean prefill seconds of the class's prompts on each replica
            (``exact_prefill``; None: the GPU row (11) prices prefill at mu^P, (11a)).
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
    prefill_s: np.ndarray | None = None

    def gpu_coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """(C, R) GPU seconds per request of class c on m, and the seconds a cached
        request saves: ``P_c / mu^P_m + D_c / mu^D_m`` and ``S_c / mu^P_m`` (11), or with
        ``prefill_s``: ``t_cm + D_c / mu^D_m`` and ``delta_cm`` (11a)."""
        dec = self.output_tokens[:, None] / self.decode_tokens_per_s[None, :]
        if self.prefill_s is None:
            return (self.prompt_tokens[:, None] / self.prefill_tokens_per_s[None, :] + dec,
                    self.prefix_tokens[:, None] / self.prefill_tokens_per_s[None, :])
        return self.prefill_s + dec, self.cache_saving_s

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
                rate_scale: float = 1.0,
                groups: tuple[np.ndarray, np.ndarray] | None = None,
                exact_prefill: bool = False) -> FluidModel:
    """Classes and replica rates of ``instance`` (``models/routing-lp.md`` (5)).

    Classes are prompt-length bucket x predicted-output bucket (quantile edges) x prefix
    group (the ``max_groups - 1`` most frequent tenants, the rest pooled; one group when
    the trace has no tenants; or ``groups = (keys (G,), group of each request (n,))``,
    e.g. the prefix groups of :func:`lpserve.opt.routing_locality.prefix_groups`).
    ``rate_per_s`` = class count / ``duration_s`` (default: the trace's arrival span) x
    ``rate_scale``. ``utilization`` is rho, the largest allowed share of each replica's
    prefill, decode and GPU time. Replicas are priced by their own cost models
    (``replica_costs``, default the instance's: heterogeneous clusters included).
    ``exact_prefill`` prices each class's prefill by the mean of its prompts' own prefill
    times (and the saving of their reusable prefixes) on each replica instead of the
    class mean prompt at the reference chunk rate: (6a), (11a); long prompts' attention
    is then counted.
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
    costs = per_replica_costs(instance, replica_costs)
    s = np.asarray(tr.prompt_tokens, np.int64)
    lo, hi, _ = output_interval(tr)
    d = (lo + hi) / 2.0
    pref = reusable_prefix_tokens(tr).astype(np.float64)
    pe, oe = _edges(s.astype(float), n_prompt_buckets), _edges(d, n_output_buckets)
    tenant = getattr(tr, "tenant", None)
    if groups is not None:
        keys, g = (np.asarray(x, np.int64) for x in groups)
        if g.shape != (n,) or keys.ndim != 1 or g.min(initial=0) < 0 or \
                g.max(initial=0) >= max(keys.size, 1):
            raise ValueError(f"groups must be (keys (G,), group index (n={n},) in [0, G)), got "
                             f"shapes {keys.shape}, {g.shape}")
    elif tenant is not None and np.any(np.asarray(tenant) >= 0):
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
    t_c = None
    if exact_prefill:                                                           # (6a)
        t_c = np.stack([mean(p.prefill_s(s)) for p in pr], axis=1)
        sav = np.stack([mean(p.prefill_s(s) - p.prefill_cached_s(s, pref)) for p in pr],
                       axis=1)
        lat = t_c + D[:, None] * tpot[None, :]
    else:
        lat = np.stack([p.prefill_s(P) + D * p.tpot_s for p in pr], axis=1)      # (6)
        sav = np.stack([p.prefill_s(P) - p.prefill_s(np.maximum(P - S, 1)) for p in pr],
                       axis=1)
    kvh = ((P + D / 2.0) * D)[:, None] * tpot[None, :]                          # (10)
    fit = np.array([np.polyfit(p.prefill_grid_tokens, p.prefill_grid_s, 1)[::-1] for p in pr])
    return FluidModel(cnt / span * rate_scale, P, D, S, gc.astype(np.int64), SG, lat, sav, kvh,
                      np.array([p.prefill_tokens_per_s for p in pr]),
                      np.array([p.decode_tokens_per_s for p in pr]),
                      np.array([p.kv_tokens for p in pr]), tpot, fit, float(utilization),
                      pe, oe, np.asarray(keys, np.int64), instance.digest(),
                      time.perf_counter() - t0, t_c)


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
    gpu_a, gpu_u = m.gpu_coefficients()
    fam("gpu", R, np.concatenate([rr, rr]), np.concatenate([a(cc, rr), u(cc, rr)]),
        np.concatenate([gpu_a[cc, rr], -gpu_u[cc, rr]]), -np.inf, m.utilization)        # (11)
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
            "kv": float(m.rate_per_s @ m.kv_token_s.min(axis=1)),
            # GPU seconds per second at each class's cheapest replica, cached where it can be
            "gpu": float(m.rate_per_s @ (m.gpu_coefficients()[0]
                                         - m.gpu_coefficients()[1]).min(axis=1))}
    have = {"decode": float(m.utilization * m.decode_tokens_per_s.sum()),
            "prefill": float(m.utilization * m.prefill_tokens_per_s.sum()),
            "kv": float(m.kv_tokens.sum()),
            "gpu": float(m.utilization * m.tpot_s.size)}
    unit = {"decode": "decode tokens/s", "prefill": "prefill tokens/s", "kv": "KV tokens",
            "gpu": "GPU-seconds/s"}
    tok = [k for k in need if k != "gpu"]
    worst = max(tok, key=lambda k: need[k] / have[k])
    if need[worst] < have[worst] and need["gpu"] >= have["gpu"]:
        worst = "gpu"  # each resource suffices alone; their shares of GPU time do not
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
    gpu_a, gpu_u = model.gpu_coefficients()
    gpu = cp.sum(cp.multiply(a, gpu_a), axis=0) - cp.sum(cp.multiply(u, gpu_u), axis=0)
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


ROUTING_FLUID = Formulation("routing-fluid", build_fluid, solve_fluid, certify_fluid,
                            export_fluid)
