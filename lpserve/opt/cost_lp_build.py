"""The cost-model LP's columns and rows (``models/cost-lp.md`` (8)-(18)); solved by
:mod:`lpserve.opt.cost_lp`.

Rows are numbered families (``CostLPModel.row_group``); columns carry their request,
kind, interval, class and level (``col_req``, ``col_kind``, ``col_k``, ``col_q``,
``col_lev``) so that a schedule can be mapped onto them (the tests do: a simulated schedule
must be a feasible point). Columns of one request are built as numpy blocks.
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
    iteration_minorant,
    prefill_classes,
    prefill_rate,
    regime_prompt_shares,
    regime_shares,
    share_levels,
)
from lpserve.opt.lower_bounds import prefix_sharing

__all__ = ["Floors", "request_floors", "CostLPModel", "build_cost_lp", "KIND_NAMES",
           "sequential_upper_s", "default_dt_s", "GRID_FULL_REQUESTS", "GRID_MAX_REFINE"]

#: column kinds (``CostLPModel.col_kind``)
KIND_NAMES = ("first-token", "completion", "decode", "prefill", "late-decode", "late-prefill",
              "precedence", "work")
_T1, _C, _DEC, _PRE, _LDEC, _LPRE, _PREC, _WORK = range(8)
#: the default grid is the median least latency over 5 from this many requests up; a
#: smaller instance gets a finer one (its LP keeps about this many requests' intervals),
#: at most :data:`GRID_MAX_REFINE` times finer
GRID_FULL_REQUESTS = 200
GRID_MAX_REFINE = 4.0


# ====================================================================== per-request floors
@dataclass(frozen=True, eq=False)
class Floors:
    """Per-request closed-form quantities (arrays shape (n,), seconds unless noted).

    ``uncached`` prompt tokens that must be computed, ``prefill_s`` = P_i (13),
    ``d_min`` least per-token decode time, ``decode_s`` = D_i (14), ``h_after`` /
    ``h_before`` the mean-busy-time offsets H_i / H'_i (15), ``resident`` KV tokens counted
    once (7), ``rate`` the best prefill time per token r (s/token).
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
    # at most this much of a prompt can come from KV another request computed (the
    # content keys of models/simulator.md (5), any other request: proofs/cost-lp-bound.md step 1)
    cached, _ = prefix_sharing(tr, instance.cluster.block_tokens)
    u = np.maximum(s - cached, 1)
    r, t1 = prefill_rate(cost, int(u.max()) if n else 1)
    P = np.maximum(t1, r * u)
    c_max = int((s + o).max()) if n else 1
    S, _ = decode_floor(cost, c_max)
    d_min = S[s + 1] - S[s]
    D = S[s + o - 1] - S[s]
    # fluid mean-busy offsets (15): token j (j = 1..o-1 after the first) spreads over an
    # iteration of at least d_j; H = mean_j (sum_{m>j} d_m + d_j/2), H' = mean_j
    # (sum_{m<j} d_m + d_j/2)
    h_after = np.zeros(n)
    h_before = np.zeros(n)
    for i in np.flatnonzero(o > 1).tolist():
        d = np.diff(S[s[i]:s[i] + o[i]])
        cum = np.cumsum(d)
        h_before[i] = float((cum - d / 2.0).mean())
        h_after[i] = float((cum[-1] - cum + d / 2.0).mean())
    return Floors(u, P, d_min, D, h_after, h_before, counted_prompt_tokens(tr), float(r))


def sequential_upper_s(instance: Any, cost: Any) -> float:
    """Total latency (s) of serving the requests one at a time in arrival order on one
    replica, each alone (whole-prompt prefill, then batch-1 decodes): a feasible schedule,
    so no request's latency in an optimal schedule exceeds it."""
    tr = instance.trace
    a = np.asarray(tr.arrival_s, np.float64)
    s = np.asarray(tr.prompt_tokens, np.int64)
    o = np.asarray(tr.output_tokens, np.int64)
    if a.size == 0:
        return 0.0
    pre = cost.prefill_alone_s(s)
    alone = pre + np.array([cost.decode_run_s([int(si)], int(oi) - 1) if oi > 1 else 0.0
                            for si, oi in zip(s, o)])
    t = 0.0
    total = 0.0
    for ai, li in zip(a.tolist(), alone.tolist()):
        t = max(t, ai) + li
        total += t - ai
    return float(total)


# ====================================================================== model
@dataclass(eq=False)
class CostLPModel:
    """The LP ``min c'x s.t. row_lo <= A x <= row_hi, col_lo <= x <= col_hi`` of one
    instance (CSC ``a_start``/``a_index``/``a_value``) plus ``const`` (-sum of arrivals, s),
    with per-column labels and per-row families. ``start_cols``: the columns the column
    generation starts from. ``window_s``: each request's window (s)."""

    c: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray
    a_start: np.ndarray
    a_index: np.ndarray
    a_value: np.ndarray
    const: float
    col_req: np.ndarray
    col_kind: np.ndarray
    col_k: np.ndarray
    col_q: np.ndarray
    col_lev: np.ndarray
    col_t: np.ndarray
    row_group: np.ndarray
    start_cols: np.ndarray
    window_s: np.ndarray
    dt_s: float
    digest: str = ""
    build_s: float = 0.0
    message: str = ""
    unsupported: bool = False
    info: dict = field(default_factory=dict)
    instance: Any = None
    options: dict = field(default_factory=dict)
    window_rounds: int = 2   # solve_cost_lp's rounds unless it is given its own

    def columns(self, kind: str, request: int | None = None) -> np.ndarray:
        """Indices of the columns of ``kind`` (one of :data:`KIND_NAMES`), of one request."""
        m = self.col_kind == KIND_NAMES.index(kind)
        if request is not None:
            m &= self.col_req == request
        return np.flatnonzero(m)


class _Blocks:
    """Columns accumulated as numpy blocks: per column a cost, bounds, labels, and up to
    ``width`` (row, value) entries (row -1 = none)."""

    def __init__(self) -> None:
        self.rlo: list[float] = []
        self.rhi: list[float] = []
        self.rgroup: list[str] = []
        self.parts: list[tuple] = []
        self.extra: list[tuple] = []
        self.n_col = 0

    def entries(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        """Extra entries into columns already added."""
        self.extra.append((np.asarray(rows, np.int64), np.asarray(cols, np.int64),
                           np.asarray(vals, np.float64)))

    def rows(self, n: int, lo: float, hi: float, group: str) -> np.ndarray:
        first = len(self.rlo)
        self.rlo += [lo] * n
        self.rhi += [hi] * n
        self.rgroup += [group] * n
        return np.arange(first, first + n, dtype=np.int64)

    def row(self, lo: float, hi: float, group: str) -> int:
        return int(self.rows(1, lo, hi, group)[0])

    def add(self, cost: Any, lo: Any, hi: Any, R: np.ndarray, V: np.ndarray, *, req: int,
            kind: int, k: Any = -1, q: Any = -1, lev: Any = -1, t: Any = 0.0,
            start: Any = True) -> np.ndarray:
        """Append ``len(R)`` columns; ``R``/``V`` shape (n, width). Returns their indices."""
        R = np.atleast_2d(np.asarray(R, np.int64))
        V = np.atleast_2d(np.asarray(V, np.float64))
        n = R.shape[0]
        def full(x: Any, dt: Any) -> np.ndarray:
            return np.full(n, x, dt) if np.ndim(x) == 0 else np.asarray(x, dt)

        self.parts.append((full(cost, float), full(lo, float), full(hi, float), R, V,
                           full(req, np.int64), full(kind, np.int64), full(k, np.int64),
                           full(q, np.int64), full(lev, np.int64), full(t, float),
                           full(start, bool)))
        idx = np.arange(self.n_col, self.n_col + n, dtype=np.int64)
        self.n_col += n
        return idx


def default_dt_s(least_latency_s: np.ndarray) -> float:
    """The default interval (s) for requests of least latencies ``least_latency_s`` (n,):
    the median over 5, divided by ``min(GRID_MAX_REFINE, GRID_FULL_REQUESTS / n)`` when
    that is above 1 (a small LP affords a finer grid: the bound loses about one interval
    per request in (15), (16)), at least 1 ms; 1 s without requests."""
    n = least_latency_s.size
    if n == 0:
        return 1.0
    refine = min(GRID_MAX_REFINE, max(1.0, GRID_FULL_REQUESTS / n))
    return max(float(np.median(least_latency_s)) / 5.0 / refine, 1e-3)


def build_cost_lp(instance: Any, *, dt_s: float | None = None, window_mult: float = 2.0,
                  window_intervals: float = 4.0, prefill_window: float = 0.25,
                  level_ratio: float = 1.5, level_ratio_far: float = 3.0,
                  precedence: bool = True, chunk_edges: tuple | None = None,
                  regime_ratios: tuple = (1.3, 1.7, 2.5), upper_total_s: float | None = None,
                  windows_s: np.ndarray | None = None, dt_scale: float = 1.0) -> CostLPModel:
    """The LP of ``instance`` (``models/cost-lp.md``).

    Args:
        dt_s: interval length (s); default: the median least latency over 5, at least 1 ms,
            refined for instances of fewer than :data:`GRID_FULL_REQUESTS` requests
            (:func:`default_dt_s`; the grid's effect on the bound is discussed in
            ``models/cost-lp.md`` §5).
        window_mult, window_intervals: request ``i`` has columns in the intervals of
            ``[a_i, a_i + W_i]``, ``W_i = window_mult * l_i + window_intervals * dt_s``
            (``l_i`` its least latency); mass after ``W_i`` goes to late columns, charged
            time but no capacity ((18): a relaxation, which the solver widens while it binds).
        prefill_window: share of the window with prompt columns.
        level_ratio, level_ratio_far: geometric ratios of the decode time levels (5).
        precedence: the prefill-before-decode chain rows (8).
        chunk_edges: chunk-size class edges (3); default ``cost_lp_terms.CHUNK_EDGES``.
        regime_ratios: thresholds of the regime rows (10), in units of ``F_A``.
        upper_total_s: total latency of a known feasible schedule (a simulated policy),
            which caps every request's latency in an optimal schedule; default: serving
            the requests one at a time (:func:`sequential_upper_s`).
        windows_s: explicit windows (s) per request, overriding ``window_*``.
        dt_scale: multiplies the default ``dt_s`` (ignored when ``dt_s`` is given): a
            coarser grid is a smaller LP, solved sooner; any grid gives a valid bound
            (``models/cost-lp.md`` §5).
    """
    t0 = time.perf_counter()
    tr = instance.trace
    parent = getattr(tr, "parent", None)
    if parent is not None and np.any(np.asarray(parent) >= 0):
        return _unsupported(instance, t0, "cost-lp: traces with parent dependencies are not "
                            "supported (latency counts from a release the LP cannot see)")
    cost = instance.cost_model()
    kind = int(getattr(cost, "kind", -1))
    if kind not in SUPPORTED_KINDS:
        return _unsupported(instance, t0, f"cost-lp: cost-model kind {kind} is not supported")
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
    # the simulator holds at most kv_capacity_blocks * block_tokens <= kv_capacity_tokens
    K_tok = float(cost.kv_capacity_tokens(cl.gpu_memory_fraction)) * R
    fl = request_floors(instance, cost)
    ell = fl.prefill_s + fl.decode_s
    if not (dt_scale > 0 and math.isfinite(dt_scale)):
        raise ValueError(f"cost-lp: dt_scale must be a positive number, got {dt_scale!r}")
    if dt_s is None:
        dt_s = dt_scale * default_dt_s(ell)
    if not (dt_s > 0 and math.isfinite(dt_s)):
        raise ValueError(f"cost-lp: dt_s must be a positive number of seconds, got {dt_s!r}")
    W = (window_mult * ell + window_intervals * dt_s) if windows_s is None \
        else np.asarray(windows_s, np.float64)
    total_up = sequential_upper_s(instance, cost) if upper_total_s is None \
        else float(upper_total_s)
    # every request's latency in an optimal schedule is at most the total minus the
    # others' floors
    upper = np.maximum(total_up - (ell.sum() - ell), ell) + dt_s
    classes = prefill_classes(cost, m, int(fl.uncached.max()) if n else 1, chunk_edges)
    lo_q = np.array([pc.lo for pc in classes], np.int64)
    q_free = int(np.searchsorted(lo_q, m.n_star, side="right")) - 1
    n_k = int(math.ceil(float((a + W).max()) / dt_s)) + 2 if n else 1
    b = _Blocks()
    capA = b.rows(n_k, -np.inf, R * dt_s, "capA")                       # (9)
    capB = b.rows(n_k, -np.inf, R * dt_s, "capB")                       # (9)
    capM = b.rows(n_k, -np.inf, K_tok * dt_s, "capM")                   # (11)
    thresholds = [m.F_A * g for g in regime_ratios] if m.kind == 0 else []
    capR = [b.rows(n_k, -np.inf, R * dt_s, f"regime{j}") for j in range(len(thresholds))]
    pre_reg = [[regime_prompt_shares(pc, th) for th in thresholds] for pc in classes]
    one = R == 1 and m.kind == 0       # interference rows (17) need a single replica
    if one:
        rW = {side: b.rows(n_k, 0.0, 0.0, f"work{side}") for side in "AB"}
        colW = {side: b.add(0.0, 0.0, R * dt_s, rW[side][:, None], np.ones((n_k, 1)), req=-1,
                            kind=_WORK, k=np.arange(n_k), q=j)
                for j, side in enumerate("AB")}
    inc_pre = {"A": np.array([m.chunk_a(float(pc.lo)) / pc.lo for pc in classes]),
               "B": np.full(len(classes), m.chunk_b(1.0))}
    for i in range(n):
        nd, ui, ai, di = int(o[i]) - 1, int(fl.uncached[i]), float(a[i]), float(fl.d_min[i])
        k0 = int(ai // dt_s)
        k_end = max(k0 + 1, int(math.ceil((ai + W[i]) / dt_s)))
        k_pre = max(k0 + 1, min(k_end, int(math.ceil((ai + prefill_window * W[i]) / dt_s))))
        ks = np.arange(k0, k_end)
        start = np.maximum(ks * dt_s, ai)
        span = (ks + 1) * dt_s - start
        keep = span > 1e-12
        ks, start, span = ks[keep], start[keep], span[keep]
        nk = ks.size
        r_mass = b.row(nd, nd, "mass")
        r_pmass = b.row(ui, ui, "pmass")
        r_first = b.row(ai, np.inf, "first")                            # (13)
        r_pmean = b.row(ui * fl.rate * ui / 2.0, np.inf, "pmean")       # (16)
        r_time = b.rows(nk, -np.inf, 0.0, "time")                       # (12)
        for j, sp in zip(r_time.tolist(), span.tolist()):
            b.rhi[j] = sp
        if one:
            r_int = {side: b.rows(nk, -np.inf, R * dt_s, f"interference{side}") for side in "AB"}
            for side in "AB":                     # + W_k in each of i's interference rows
                b.entries(r_int[side], colW[side][ks], np.ones(nk))
        if nd:
            r_dmean = b.row(nd * fl.h_before[i], np.inf, "dmean")       # (15)
            r_cmean = b.row(nd * fl.h_after[i], np.inf, "cmean")        # (15)
            r_busy = b.row(0.0, np.inf, "busy")                          # (14)
            r_alone = b.row(float(fl.decode_s[i]), np.inf, "alone")      # (14)
            b.add(0.0, ai + fl.prefill_s[i], ai + upper[i],
                  [[r_first, r_pmean, r_dmean, r_busy, r_alone]],
                  [[1.0, float(ui), -float(nd), -1.0, -1.0]], req=i, kind=_T1)
            b.add(1.0, ai, ai + upper[i], [[r_cmean, r_busy, r_alone]],
                  [[float(nd), 1.0, 1.0]], req=i, kind=_C)
        else:
            b.add(1.0, ai + fl.prefill_s[i], ai + upper[i], [[r_first, r_pmean]],
                  [[1.0, float(ui)]], req=i, kind=_T1)
        pk = ks < k_pre
        prec = np.full(nk, -1, np.int64)
        if nd and precedence and pk.any():
            prec[pk] = b.rows(int(pk.sum()), 0.0, 0.0, "precedence")     # (8)
            idx = prec[pk]
            nxt = np.append(idx[1:], -1)
            b.add(0.0, 0.0, 1.0 + 1e-9, np.stack([idx, nxt], 1),
                  np.stack([np.ones(idx.size), -np.ones(idx.size)], 1), req=i, kind=_PREC,
                  k=ks[pk])
        if nd:
            a_dec, b_dec = float(m.decode_a(s[i])), float(m.decode_b(s[i]))
            ts, sa, sb = share_levels(di, m.F_A, a_dec, m.F_B, b_dec, ratio_near=level_ratio,
                                      ratio_far=level_ratio_far, breaks=thresholds)
            L = ts.size
            kk = np.repeat(np.arange(nk), L)
            lev = np.tile(np.arange(L), nk)
            t = ts[lev]
            cols_r = [np.full(kk.size, r_mass), np.full(kk.size, r_dmean),
                      np.full(kk.size, r_cmean), np.full(kk.size, r_busy), r_time[kk],
                      capA[ks[kk]], capB[ks[kk]], capM[ks[kk]]]
            cols_v = [np.ones(kk.size), (start + span)[kk], -start[kk], -t, t, sa[lev],
                      sb[lev], fl.resident[i] * t]
            for j, th in enumerate(thresholds):
                cols_r.append(capR[j][ks[kk]])
                cols_v.append(regime_shares(ts, sa, sb, th)[lev])
            if one:
                cols_r += [rW["A"][ks[kk]], rW["B"][ks[kk]], r_int["A"][kk], r_int["B"][kk]]
                cols_v += [np.full(kk.size, -a_dec), np.full(kk.size, -b_dec),
                           np.full(kk.size, m.F_A), np.full(kk.size, m.F_B)]
            cols_r.append(prec[kk])
            cols_v.append(np.full(kk.size, 1.0 / nd))
            b.add(0.0, 0.0, span[kk] / t, np.stack(cols_r, 1), np.stack(cols_v, 1), req=i,
                  kind=_DEC, k=ks[kk], lev=lev, t=t, start=np.isin(lev, (0, 1, 3)))
            b.add(0.0, 0.0, float(nd), [[r_mass, r_dmean, r_cmean, r_busy]],
                  [[1.0, ai + upper[i], -float(k_end * dt_s), -di]], req=i, kind=_LDEC)
        # prompt tokens: classes x levels in the first k_pre intervals (3), (6)
        for q, pc in enumerate(classes):
            if pc.lo > ui:
                break
            first = q + 1 == len(classes) or classes[q + 1].lo > ui or q == q_free
            L = pc.t.size
            ip = np.flatnonzero(pk)
            kk = np.repeat(ip, L)
            lev = np.tile(np.arange(L), ip.size)
            t = pc.t[lev]
            cols_r = [np.full(kk.size, r_pmass), np.full(kk.size, r_pmean), r_time[kk],
                      np.full(kk.size, r_first), capA[ks[kk]], capB[ks[kk]]]
            cols_v = [np.ones(kk.size), -start[kk], t, -t, pc.share_a[lev], pc.share_b[lev]]
            for j in range(len(thresholds)):
                cols_r.append(capR[j][ks[kk]])
                cols_v.append(pre_reg[q][j][lev])
            if one:
                cols_r += [rW["A"][ks[kk]], rW["B"][ks[kk]], r_int["A"][kk], r_int["B"][kk]]
                cols_v += [np.full(kk.size, -inc_pre["A"][q]), np.full(kk.size, -inc_pre["B"][q]),
                           np.full(kk.size, (m.F_A - m.fixed_dec) / pc.hi),
                           np.full(kk.size, (m.F_B - m.fixed_dec) / pc.hi)]
            cols_r.append(prec[kk])
            cols_v.append(np.full(kk.size, -1.0 / ui))
            b.add(0.0, 0.0, span[kk] / t, np.stack(cols_r, 1), np.stack(cols_v, 1), req=i,
                  kind=_PRE, k=ks[kk], q=q, lev=lev, t=t, start=first & (lev == 0))
        b.add(0.0, 0.0, float(ui), [[r_pmass, r_pmean, r_first]],
              [[1.0, -float(k_pre * dt_s), -fl.rate]], req=i, kind=_LPRE)
    return _finish(b, instance, a, W, dt_s, t0, ell, total_up)


def _finish(b: _Blocks, instance: Any, a: np.ndarray, W: np.ndarray, dt_s: float, t0: float,
            ell: np.ndarray, total_up: float) -> CostLPModel:
    """Concatenate the blocks into a CSC matrix and the model."""
    from scipy.sparse import csc_matrix

    cat = [np.concatenate([p[j] for p in b.parts]) for j in range(3)]
    rows_l, vals_l, cols_l = [], [], []
    base = 0
    for p in b.parts:
        R, V = p[3], p[4]
        n, w = R.shape
        cols = np.repeat(np.arange(base, base + n), w)
        rr, vv = R.ravel(), V.ravel()
        ok = rr >= 0
        rows_l.append(rr[ok])
        vals_l.append(vv[ok])
        cols_l.append(cols[ok])
        base += n
    for rr, cc, vv in b.extra:
        rows_l.append(rr)
        cols_l.append(cc)
        vals_l.append(vv)
    labels = [np.concatenate([p[j] for p in b.parts]) for j in range(5, 12)]
    A = csc_matrix((np.concatenate(vals_l), (np.concatenate(rows_l), np.concatenate(cols_l))),
                   shape=(len(b.rlo), base))
    A.sum_duplicates()
    return CostLPModel(cat[0], cat[1], cat[2], np.array(b.rlo), np.array(b.rhi),
                       A.indptr.astype(np.int64), A.indices.astype(np.int64),
                       A.data.astype(np.float64), -float(a.sum()), *labels[:6],
                       np.array(b.rgroup), labels[6], W, float(dt_s), instance.digest(),
                       time.perf_counter() - t0,
                       info={"n_requests": int(a.size), "n_cols": int(base),
                             "n_rows": len(b.rlo), "nnz": int(A.nnz),
                             "isolated_total_s": float(ell.sum()),
                             "upper_total_s": float(total_up)},
                       instance=instance)


def _unsupported(instance: Any, t0: float, msg: str) -> CostLPModel:
    z = np.zeros(0)
    zi = np.zeros(0, np.int64)
    return CostLPModel(z, z, z, z, z, np.zeros(1, np.int64), zi, z, 0.0, zi, zi, zi, zi, zi, z,
                       np.zeros(0, str), np.zeros(0, bool), z, 0.0, instance.digest(),
                       time.perf_counter() - t0, msg, True)
