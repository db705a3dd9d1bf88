"""Time-indexed LP relaxation of serving in the GPU cost model (``cost-lp``).

A lower bound on the total end-to-end latency of every schedule the simulator can run
without speculative decoding or dependencies (``proofs/cost-lp-bound.md``); the equations
are ``models/cost-lp.md`` (1)-(16), cited below by number.

Time is cut into intervals of ``dt_s``; in each interval a request produces some of its
decode tokens at per-token time levels (faster costs more of a replica: (4)-(5)) and some of
its prompt tokens in chunk-size classes ((3)); every interval has three capacity rows over
the whole cluster (the two iteration-time minorants and the KV memory, (9)-(11)), every
request-interval a time row ((12)), and each request's completion is tied to its first token,
its iteration time and the mean time of its tokens ((13)-(16)). The bound reported is the
Lagrangian value of the solver's dual vector (weak duality), so it is valid at any solver
status, including a time limit.

``build_cost_lp(instance, ...) -> CostLPModel``; ``solve_cost_lp(model, time_limit_s=...)``
-> :class:`~lpserve.opt.solution.Solution` (``bound`` = ``objective`` = the certified bound
on total latency, s); ``certify_cost_lp``; no export (the LP's alpha points seed
:mod:`lpserve.opt.schedule_search`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lpserve.opt.cost_lp_terms import (
    SUPPORTED_KINDS,
    counted_prompt_tokens,
    decode_floor,
    regime_prompt_shares,
    regime_shares,
    iteration_minorant,
    prefill_classes,
    share_levels,
)
from lpserve.opt.lower_bounds import prefill_rate_s_per_token, reusable_prefix_tokens
from lpserve.opt.solution import Formulation, Solution, SolutionError, Status

__all__ = ["CostLPModel", "build_cost_lp", "solve_cost_lp", "certify_cost_lp", "COST_LP",
           "request_floors", "lagrangian_bound"]


# ====================================================================== per-request floors
@dataclass(frozen=True, eq=False)
class Floors:
    """Per-request closed-form quantities (arrays shape (n,), seconds unless noted).

    ``uncached`` prompt tokens that must be computed, ``prefill_s`` = P_i (13),
    ``d_min`` least per-token decode time, ``decode_s`` = D_i (14), ``h_after`` / ``h_before``
    the mean-busy-time offsets H_i / H'_i (15)-(16), ``resident`` KV tokens counted once (7),
    ``rate`` the best prefill time per token r (s/token).
    """

    uncached: np.ndarray
    prefill_s: np.ndarray
    d_min: np.ndarray
    decode_s: np.ndarray
    h_after: np.ndarray
    h_before: np.ndarray
    resident: np.ndarray
    rate: float


def request_floors(instance: Any, cost: Any) -> Floors:
    """The :class:`Floors` of ``instance`` under ``cost`` (``models/cost-lp.md`` (13)-(16))."""
    tr = instance.trace
    s = np.asarray(tr.prompt_tokens, np.int64)
    o = np.asarray(tr.output_tokens, np.int64)
    n = s.size
    cached = reusable_prefix_tokens(tr)
    u = np.maximum(s - cached, 1)
    r, t1 = prefill_rate_s_per_token(cost, int(u.max()) if n else 1)
    P = np.maximum(t1, r * u)
    c_max = int((s + o).max()) if n else 1
    S, _ = decode_floor(cost, c_max)
    d_min = S[s + 1] - S[s]
    D = S[s + o - 1] - S[s]
    # fluid mean-busy offsets: token j (j = 1..o-1 after the first) has mass over an
    # iteration of at least d_j; H = mean over j of (sum_{m>j} d_m + d_j/2), H' likewise
    h_after = np.zeros(n)
    h_before = np.zeros(n)
    for i in np.flatnonzero(o > 1).tolist():
        d = np.diff(S[s[i]:s[i] + o[i]])           # d_j, j = 1..o-1 (contexts s..s+o-2)
        cum = np.cumsum(d)
        before = cum - d / 2.0                      # sum_{m<j} d_m + d_j/2
        h_before[i] = float(before.mean())
        h_after[i] = float((cum[-1] - cum + d / 2.0).mean())
    return Floors(u, P, d_min, D, h_after, h_before, counted_prompt_tokens(tr), float(r))


# ====================================================================== model
@dataclass(eq=False)
class CostLPModel:
    """The LP of one instance in column form, with the maps the solver reports through.

    Arrays: ``c``, ``col_lo``, ``col_hi`` (n_col,), ``row_lo``, ``row_hi`` (n_row,), CSC
    matrix ``a_start``/``a_index``/``a_value``; ``const`` the objective offset (-sum of
    arrivals, s). ``dec_cols``/``pre_cols``: per request the decode / prefill columns with
    their interval start times (for alpha points); ``late_dec``/``late_pre``: the late
    columns; ``c_col``: the completion (or first-token) column of each request.
    """

    c: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    a_start: np.ndarray
    a_index: np.ndarray
    a_value: np.ndarray
    const: float
    c_col: np.ndarray
    late_dec: np.ndarray
    late_pre: np.ndarray
    dec_cols: list
    window_s: np.ndarray
    dt_s: float
    start_cols: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    tags: list = field(default_factory=list)
    row_groups: list = field(default_factory=list)
    digest: str = ""
    build_s: float = 0.0
    message: str = ""
    unsupported: bool = False
    info: dict = field(default_factory=dict)
    instance: Any = None
    options: dict = field(default_factory=dict)


class _Coo:
    """Column-wise accumulation of an LP (lists of entries)."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.rlo: list[float] = []
        self.rhi: list[float] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.start: list[bool] = []
        self.tag: list[tuple] = []     # (request, kind, interval, class, level) per column
        self.rgroup: list[str] = []    # the equation family of each row

    def row(self, lo: float, hi: float, group: str = "") -> int:
        self.rgroup.append(group)
        self.rlo.append(lo)
        self.rhi.append(hi)
        return len(self.rlo) - 1

    def col(self, cost: float, lo: float, hi: float, entries: list, start: bool = True,
            tag: tuple = ()) -> int:
        j = len(self.cost)
        self.start.append(start)
        self.tag.append(tag)
        self.cost.append(cost)
        self.lo.append(lo)
        self.hi.append(hi)
        for r, v in entries:
            self.rows.append(r)
            self.cols.append(j)
            self.vals.append(v)
        return j


def _unsupported(instance: Any, t0: float, msg: str) -> CostLPModel:
    z = np.zeros(0)
    zi = np.zeros(0, np.int64)
    return CostLPModel(z, z, z, z, z, np.zeros(1, np.int64), zi, z, 0.0, zi, zi, zi, [], z,
                       0.0, np.zeros(0, bool), [], [], instance.digest(), time.perf_counter() - t0,
                       msg, True)


def _sequential_upper_s(instance: Any, cost: Any) -> float:
    """Total latency (s) of serving the requests one at a time in arrival order on one
    replica, each alone (whole-prompt prefill, then batch-1 decodes): a feasible schedule,
    so every request's latency in an optimal schedule is at most this."""
    tr = instance.trace
    a = np.asarray(tr.arrival_s, np.float64)
    s = np.asarray(tr.prompt_tokens, np.int64)
    o = np.asarray(tr.output_tokens, np.int64)
    if a.size == 0:
        return 0.0
    pre = cost.batch_times_s([{"prefill_tokens": [int(x)]} for x in s])
    alone = pre + np.array([cost.decode_run_s([int(si)], int(oi) - 1) if oi > 1 else 0.0
                            for si, oi in zip(s, o)])
    t = 0.0
    total = 0.0
    for ai, li in zip(a.tolist(), alone.tolist()):
        t = max(t, ai) + li
        total += t - ai
    return float(total)


def build_cost_lp(instance: Any, *, dt_s: float | None = None, window_mult: float = 2.0,
                  window_intervals: float = 4.0, prefill_window: float = 0.25,
                  level_ratio: float = 1.5, level_ratio_far: float = 3.0,
                  precedence: bool = True, chunk_edges: tuple | None = None,
                  regime_ratios: tuple = (1.3, 1.7, 2.5),
                  windows_s: np.ndarray | None = None) -> CostLPModel:
    """The LP of ``instance`` (``models/cost-lp.md``).

    Args:
        dt_s: interval length (s); default: the median least latency over 5, at least
            1 ms (the grid's loss is at most the interval length per request, (17)).
        window_mult, window_intervals: request ``i`` has columns in the intervals of
            ``[a_i, a_i + W_i]``, ``W_i = window_mult * l_i + window_intervals * dt_s``
            (``l_i`` its least latency); decode mass after ``W_i`` goes to a late column
            that is charged time but no capacity (a relaxation, (8)).
        prefill_window: share of the window with prefill columns (late prefill likewise).
        level_ratio, level_ratio_far: geometric ratios of the per-token time levels (5).
        windows_s: explicit windows (s) per request, overriding the two above.
    """
    t0 = time.perf_counter()
    tr = instance.trace
    parent = getattr(tr, "parent", None)
    if parent is not None and np.any(np.asarray(parent) >= 0):
        return _unsupported(instance, t0, "cost-lp: traces with parent dependencies are not "
                            "supported (latency counts from a release the LP cannot see)")
    cost = instance.cost_model()
    if int(np.asarray(cost.params)[0]) not in SUPPORTED_KINDS:
        return _unsupported(instance, t0, f"cost-lp: cost-model kind "
                            f"{int(np.asarray(cost.params)[0])} is not supported")
    try:
        m = iteration_minorant(cost)
    except ValueError as exc:
        return _unsupported(instance, t0, str(exc))
    cl = instance.cluster
    R = cl.n_replicas
    a = np.asarray(tr.arrival_s, np.float64)
    s = np.asarray(tr.prompt_tokens, np.int64)
    o = np.asarray(tr.output_tokens, np.int64)
    n = a.size
    bt = int(cl.block_tokens)
    K_tok = float(cost.kv_capacity_blocks(bt, cl.gpu_memory_fraction) * bt) * R
    fl = request_floors(instance, cost)
    ell = fl.prefill_s + fl.decode_s
    if dt_s is None:
        dt_s = max(float(np.median(ell)) / 5.0, 1e-3) if n else 1.0
    if not (dt_s > 0 and math.isfinite(dt_s)):
        raise ValueError(f"cost-lp: dt_s must be a positive number of seconds, got {dt_s!r}")
    W = (window_mult * ell + window_intervals * dt_s) if windows_s is None \
        else np.asarray(windows_s, np.float64)
    upper = _sequential_upper_s(instance, cost)
    classes = prefill_classes(cost, m, int(fl.uncached.max()) if n else 1, chunk_edges)
    lo_q = np.array([q.lo for q in classes], np.int64)
    q_free = int(np.searchsorted(lo_q, m.n_star, side="right")) - 1   # largest free class
    n_k = int(math.ceil(float((a + W).max()) / dt_s)) + 2 if n else 1
    b = _Coo()
    capA = [b.row(-np.inf, R * dt_s, "capA") for _ in range(n_k)]            # (9)
    capB = [b.row(-np.inf, R * dt_s, "capB") for _ in range(n_k)]            # (10)
    capM = [b.row(-np.inf, K_tok * dt_s, "capM") for _ in range(n_k)]        # (11)
    thresholds = [m.F_A * g for g in regime_ratios] if m.kind == 0 else []
    capR = [[b.row(-np.inf, R * dt_s, f"regime{j}") for _ in range(n_k)]     # (10)
            for j in range(len(thresholds))]
    pre_reg = [[regime_prompt_shares(pc, th) for th in thresholds] for pc in classes]
    # interference (11b), one replica only: all of an interval's increments run in
    # iterations of the one replica, and each of request i's tokens needs one of them
    one = R == 1 and m.kind == 0
    rW = {side: [b.row(0.0, 0.0, f"work{side}") for _ in range(n_k)] for side in "AB"} \
        if one else {}
    colW = {side: [b.col(0.0, 0.0, R * dt_s, [(rW[side][k], 1.0)], tag=(-1, "work", k, side, 0))
                   for k in range(n_k)] for side in rW}
    cls_inc = {"A": [m.chunk_a(float(pc.lo)) / pc.lo for pc in classes],
               "B": [m.chunk_b(1.0) for pc in classes]}
    c_col = np.zeros(n, np.int64)
    late_dec = np.full(n, -1, np.int64)
    late_pre = np.zeros(n, np.int64)
    dec_cols: list = []
    for i in range(n):
        oi, ui, ai, di = int(o[i]), int(fl.uncached[i]), float(a[i]), float(fl.d_min[i])
        nd = oi - 1
        k0 = int(ai // dt_s)
        k_end = max(k0 + 1, int(math.ceil((ai + W[i]) / dt_s)))
        k_pre = max(k0 + 1, min(k_end, int(math.ceil((ai + prefill_window * W[i]) / dt_s))))
        r_mass = b.row(nd, nd, "mass")                                         # decode mass
        r_pmass = b.row(ui, ui, "pmass")                                        # prefill mass
        r_first = b.row(ai, np.inf, "first")          # t1 - prefill time >= a            (13)
        r_pmean = b.row(ui * fl.rate * ui / 2.0, np.inf, "pmean")   # u t1 - sum p tau >= u^2 r/2 (16)
        t1 = b.col(0.0 if nd else 1.0, ai + fl.prefill_s[i], ai + upper,
                   [(r_first, 1.0), (r_pmean, float(ui))])
        if nd:
            # sum x end - nd t1 >= nd H' (15): a token in interval k comes at most at its end
            r_dmean = b.row(nd * fl.h_before[i], np.inf, "dmean")
            r_cmean = b.row(nd * fl.h_after[i], np.inf, "cmean")    # nd C - sum x tau >= nd H    (15)
            r_busy = b.row(0.0, np.inf, "busy")                     # C - t1 - sum t x >= 0       (14)
            r_alone = b.row(float(fl.decode_s[i]), np.inf, "alone")  # C - t1 >= D_i               (14)
            ccol = b.col(1.0, ai, ai + upper, [(r_cmean, float(nd)), (r_busy, 1.0),
                                               (r_alone, 1.0)])
            b.rows += [r_dmean, r_busy, r_alone]
            b.cols += [t1, t1, t1]
            b.vals += [-float(nd), -1.0, -1.0]
            c_col[i] = ccol
            ts, sa, sb = share_levels(di, m.F_A, float(m.decode_a(s[i])), m.F_B,
                                      float(m.decode_b(s[i])), ratio_near=level_ratio,
                                      ratio_far=level_ratio_far, breaks=thresholds)
            sreg = [regime_shares(ts, sa, sb, th) for th in thresholds]
        else:
            c_col[i] = t1
        cols_i: list = []
        spans: dict[int, tuple[float, float, int]] = {}
        interf: dict[int, dict[str, int]] = {}
        prec: dict[int, int] = {}
        for k in range(k0, k_end):
            start = max(k * dt_s, ai)
            span = (k + 1) * dt_s - start
            if span > 1e-12:
                spans[k] = (start, span, b.row(-np.inf, span, "time"))          # (12)
                if one:
                    for side in "AB":
                        rr = b.row(-np.inf, R * dt_s, f"interference{side}")
                        b.rows.append(rr)
                        b.cols.append(colW[side][k])
                        b.vals.append(1.0)
                        interf.setdefault(k, {})[side] = rr
                if nd and k < k_pre and precedence:
                    prec[k] = b.row(0.0, 0.0, "precedence")       # chain row of the precedence (8)
        # precedence (8): slack_k = slack_{k-1} + prefill_k / u - decode_k / nd >= 0
        ks = sorted(prec)
        for q, k in enumerate(ks):
            ent = [(prec[k], 1.0)] + ([(prec[ks[q + 1]], -1.0)] if q + 1 < len(ks) else [])
            b.col(0.0, 0.0, 1.0 + 1e-9, ent, tag=(i, "precedence", k, -1, -1))
        for k, (start, span, r_time) in spans.items():
            if nd:
                pr = [(prec[k], 1.0 / nd)] if k in prec else []
                for lev in range(ts.size):
                    j = b.col(0.0, 0.0, span / ts[lev],
                              [(r_mass, 1.0), (r_dmean, start + span), (r_cmean, -start),
                               (r_busy, -ts[lev]), (r_time, ts[lev]), (capA[k], sa[lev]),
                               (capB[k], sb[lev]), (capM[k], fl.resident[i] * ts[lev])]
                              + [(capR[j][k], sreg[j][lev]) for j in range(len(thresholds))]
                              + ([(rW["A"][k], -float(m.decode_a(s[i]))),
                                  (rW["B"][k], -float(m.decode_b(s[i]))),
                                  (interf[k]["A"], m.F_A), (interf[k]["B"], m.F_B)]
                                 if one else []) + pr,
                              start=lev in (0, 1, 3), tag=(i, "decode", k, -1, lev))
                    cols_i.append((j, start))
            if k < k_pre:
                pr = [(prec[k], -1.0 / ui)] if k in prec else []
                for q, pc in enumerate(classes):
                    if pc.lo > ui:
                        break
                    first = q + 1 == len(classes) or classes[q + 1].lo > ui or q == q_free
                    for lev in range(pc.t.size):
                        b.col(0.0, 0.0, span / pc.t[lev],
                              [(r_pmass, 1.0), (r_pmean, -start), (r_time, pc.t[lev]),
                               (r_first, -pc.t[lev]), (capA[k], pc.share_a[lev]),
                               (capB[k], pc.share_b[lev])]
                              + [(capR[j][k], pre_reg[q][j][lev]) for j in range(len(thresholds))]
                              + ([(rW["A"][k], -cls_inc["A"][q]), (rW["B"][k], -cls_inc["B"][q]),
                                  (interf[k]["A"], (m.F_A - m.fixed_dec) / pc.hi),
                                  (interf[k]["B"], (m.F_B - m.fixed_dec) / pc.hi)]
                                 if one else []) + pr, start=first and lev == 0,
                              tag=(i, "prefill", k, q, lev))
        t_late_pre = k_pre * dt_s        # late prefill mass comes after the last column
        late_pre[i] = b.col(0.0, 0.0, float(ui), [(r_pmass, 1.0), (r_pmean, -t_late_pre),
                                                  (r_first, -fl.rate)])
        if nd:
            t_late = k_end * dt_s
            late_dec[i] = b.col(0.0, 0.0, float(nd), [(r_mass, 1.0), (r_dmean, ai + upper),
                                                      (r_cmean, -t_late), (r_busy, -di)])
        dec_cols.append(cols_i)
    from scipy.sparse import csc_matrix

    A = csc_matrix((b.vals, (b.rows, b.cols)), shape=(len(b.rlo), len(b.cost)))
    A.sum_duplicates()
    return CostLPModel(np.array(b.cost), np.array(b.lo), np.array(b.hi), np.array(b.rlo),
                       np.array(b.rhi), A.indptr.astype(np.int64), A.indices.astype(np.int64),
                       A.data.astype(np.float64), -float(a.sum()), c_col, late_dec, late_pre,
                       dec_cols, W, float(dt_s), np.array(b.start, bool), b.tag, b.rgroup,
                       instance.digest(),
                       time.perf_counter() - t0,
                       info={"n_requests": int(n), "n_cols": int(A.shape[1]),
                             "n_rows": int(A.shape[0]), "nnz": int(A.nnz),
                             "isolated_total_s": float(ell.sum()),
                             "sequential_upper_s": upper},
                       instance=instance)


# ====================================================================== solving
def lagrangian_bound(model: CostLPModel, row_dual: np.ndarray) -> float:
    """Weak-duality bound ``min_x c'x + y'(b - Ax)`` over the column box, for the row duals
    ``row_dual`` projected onto the signs the row bounds allow; valid for any vector (the
    columns' boxes are finite). Returns the bound on the LP's objective plus ``const`` (s)."""
    from scipy.sparse import csc_matrix

    y = np.asarray(row_dual, np.float64).copy()
    y[(y > 0) & ~np.isfinite(model.row_lo)] = 0.0
    y[(y < 0) & ~np.isfinite(model.row_hi)] = 0.0
    A = csc_matrix((model.a_value, model.a_index, model.a_start),
                   shape=(model.row_lo.size, model.c.size))
    d = model.c - A.T @ y
    if np.any(~np.isfinite(model.col_hi[d < 0])) or np.any(~np.isfinite(model.col_lo[d > 0])):
        return -math.inf
    rows = np.where(y > 0, y * np.where(np.isfinite(model.row_lo), model.row_lo, 0.0),
                    y * np.where(np.isfinite(model.row_hi), model.row_hi, 0.0))
    cols = np.where(d > 0, d * model.col_lo, d * np.where(np.isfinite(model.col_hi),
                                                        model.col_hi, 0.0))
    return float(rows.sum() + cols.sum() + model.const)


def _run_highs(model: CostLPModel, time_limit_s: float | None, solver: str, *,
               max_add: int = 4000) -> tuple:
    """Column generation: solve the LP over ``model.start_cols``, price every other column
    with the row duals, add the most negative (at most ``max_add`` per round) and solve
    again, until none prices out or the time limit. Every round's duals give a certified
    bound on the *full* LP (:func:`lagrangian_bound`), so stopping early is safe.

    Returns ``(status, best certified bound, solver text, primal x over all columns,
    duals of the best round, rounds)``; status OPTIMAL only when no column prices out."""
    import highspy
    from scipy.sparse import csc_matrix

    from lpserve.opt.solution import highs_model, highs_status

    t0 = time.perf_counter()
    A = csc_matrix((model.a_value, model.a_index, model.a_start),
                   shape=(model.row_lo.size, model.c.size))
    active = model.start_cols.copy() if model.start_cols.size == model.c.size \
        else np.ones(model.c.size, bool)
    idx = np.flatnonzero(active)
    sub = A[:, idx]
    h = highs_model(col_cost=model.c[idx], col_lower=model.col_lo[idx],
                    col_upper=model.col_hi[idx], row_lower=model.row_lo,
                    row_upper=model.row_hi, a_start=sub.indptr, a_index=sub.indices,
                    a_value=sub.data, time_limit_s=time_limit_s,
                    options={"solver": solver} if solver not in ("highs", "choose") else None)
    best, best_y, x_full, text = -math.inf, None, None, ""
    status = Status.ERROR
    n_rounds = 0
    while True:
        if time_limit_s is not None:
            left = time_limit_s - (time.perf_counter() - t0)
            if left <= 0.05:
                status = Status.LIMIT
                break
            h.setOptionValue("time_limit", float(h.getRunTime() + left))
        h.run()
        n_rounds += 1
        st, obj, _, text = highs_status(h, has_integers=False)
        sol = h.getSolution()
        if not sol.dual_valid:
            status = st if st != Status.OPTIMAL else Status.ERROR
            break
        y = np.asarray(sol.row_dual, np.float64)
        lb = lagrangian_bound(model, y)
        if lb > best:
            best, best_y = lb, y
        if sol.value_valid:
            x_full = np.zeros(model.c.size)
            x_full[idx] = np.asarray(sol.col_value, np.float64)
        if st != Status.OPTIMAL:
            status = Status.LIMIT if st in (Status.LIMIT, Status.FEASIBLE) else st
            break
        d = model.c - A.T @ y
        scale = max(1.0, abs(obj))
        cand = np.flatnonzero(~active & (d < -1e-9 * scale))
        if cand.size == 0:
            status = Status.OPTIMAL
            break
        cand = cand[np.argsort(d[cand], kind="stable")[:max_add]]
        active[cand] = True
        add = A[:, cand]
        h.addCols(int(cand.size), model.c[cand], model.col_lo[cand], model.col_hi[cand],
                  int(add.nnz), add.indptr[:-1].astype(np.int32), add.indices.astype(np.int32),
                  add.data.astype(np.float64))
        idx = np.concatenate([idx, cand])
    del highspy
    return status, best, text, x_full, best_y, {"cg_rounds": n_rounds,
                                                 "active_cols": int(active.sum())}


def solve_cost_lp(model: CostLPModel, solver: str = "highs",
                  time_limit_s: float | None = None, *, window_rounds: int = 3,
                  late_tol: float = 1e-3) -> Solution:
    """Solve the LP; widen the windows of requests with late mass and solve again while
    time remains (``window_rounds`` at most). The bound is the largest certified
    Lagrangian value over the rounds (each round's LP is a relaxation).

    Status: OPTIMAL when the last round solved to optimality and left no late mass above
    ``late_tol`` tokens; FEASIBLE when it solved but a wider window might still raise the
    bound; LIMIT when the time limit stopped a round (``bound`` is the best certified
    value, NaN if none); ERROR for an unsupported instance or a solver failure.
    """
    t0 = time.perf_counter()
    name = "cost-lp"
    if model.unsupported:
        return Solution(name, Status.ERROR, wall_s=model.build_s, digest=model.digest,
                        message=model.message, objective_units="s")
    best = -math.inf
    best_x = None
    cur = model
    rounds = []
    status = Status.ERROR
    text = ""
    for rnd in range(max(1, int(window_rounds))):
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - t0)
        if left is not None and left <= 0.05:
            status = Status.LIMIT
            break
        st, lb, text, x, _, cg = _run_highs(cur, left, solver)
        rounds.append({"round": rnd, "status": st.value, "certified_s": lb,
                       "n_cols": int(cur.c.size), **cg})
        if lb > best:
            best, best_x = lb, (x, cur)
        if st != Status.OPTIMAL:
            status = Status.LIMIT if st in (Status.LIMIT, Status.FEASIBLE) else Status.ERROR
            break
        late = np.zeros(cur.c_col.size)
        if x is not None:
            ok = cur.late_dec >= 0
            late[ok] = x[cur.late_dec[ok]]
            late += x[cur.late_pre]
        wide = late > late_tol
        status = Status.OPTIMAL if not wide.any() else Status.FEASIBLE
        if not wide.any() or rnd + 1 >= window_rounds:
            break
        W = cur.window_s.copy()
        W[wide] *= 2.0
        cur = build_cost_lp(cur.instance, windows_s=W, **_window_free(cur.options))
        cur.options = model.options
    wall = model.build_s + time.perf_counter() - t0
    primal: dict[str, np.ndarray] = {}
    if best_x is not None and best_x[0] is not None:
        x, mdl = best_x
        primal = {"completion_lb_s": x[mdl.c_col].copy(),
                  "alpha_point_s": _alpha_points(mdl, x, 0.5),
                  "window_s": mdl.window_s.copy()}
    info = {**model.info, "rounds": rounds, "dt_s": model.dt_s, "solver_message": text}
    if not math.isfinite(best):
        st_out = Status.LIMIT if status == Status.LIMIT else Status.ERROR
        return Solution(name, st_out, wall_s=wall, digest=model.digest, objective_units="s",
                        message=f"no certified bound ({text})", info=info, primal=primal)
    return Solution(name, status, best, best, wall, model.digest, primal=primal,
                    objective_units="s", message=text, info=info)


def _window_free(options: dict) -> dict:
    return {k: v for k, v in options.items() if k not in ("windows_s", "window_mult",
                                                          "window_intervals")}


def _alpha_points(model: CostLPModel, x: np.ndarray, alpha: float) -> np.ndarray:
    """Per request, the start time of the interval in which the LP's decode mass first
    reaches ``alpha`` of the total (s); the late time when it never does; the first-token
    floor for one-token requests."""
    out = np.zeros(model.c_col.size)
    for i, cols in enumerate(model.dec_cols):
        if not cols:
            out[i] = float(x[model.c_col[i]])
            continue
        j = np.array([c for c, _ in cols], np.int64)
        st = np.array([t for _, t in cols])
        order = np.argsort(st, kind="stable")
        mass = np.cumsum(x[j[order]])
        total = mass[-1] + (x[model.late_dec[i]] if model.late_dec[i] >= 0 else 0.0)
        hit = np.flatnonzero(mass >= alpha * max(total, 1e-12))
        out[i] = float(st[order][hit[0]]) if hit.size else float(model.window_s[i] +
                                                                  st.min())
    return out


def certify_cost_lp(model: CostLPModel, solution: Solution) -> dict[str, float]:
    """Residuals: the bound minus the LP objective of the round it came from (>= 0 means the
    certificate is not above the LP optimum), and how far the certified value is below it."""
    rounds = solution.info.get("rounds", [])
    if not solution.solved or not rounds:
        return {"certificate_above_lp": 0.0, "certificate_gap": 0.0}
    objs = [r["certified_s"] for r in rounds if math.isfinite(r["certified_s"])]
    top = max(objs) if objs else solution.bound
    return {"certificate_above_lp": max(0.0, solution.bound - top - 1e-6 * abs(top)),
            "certificate_gap": max(0.0, top - solution.bound)}


def _build(instance: Any, **options: Any) -> CostLPModel:
    model = build_cost_lp(instance, **options)
    model.options = dict(options)
    return model


def _no_export(solution: Solution, instance: Any) -> Any:
    raise SolutionError("cost-lp is a bound and exports no policy (its alpha points seed "
                        "schedule-search)")


COST_LP = Formulation("cost-lp", _build, solve_cost_lp, certify_cost_lp, _no_export,
                      is_bound=True)
