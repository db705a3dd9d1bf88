"""Map a simulated schedule onto the columns of the cost-model LP (``models/cost-lp.md``).

The validity proof of ``cost-lp`` (``proofs/cost-lp-bound.md``) is constructive: every
schedule the simulator runs gives a feasible LP point with the schedule's total latency as
objective. This helper builds that point, so a test can check every row family of the LP
on it (a violated row is a bug in the LP or in its proof).

It reads each iteration of a reference-mode run (its ``iteration_log``), splits each
iteration's tokens and time over the LP's intervals in proportion to time (the fluid
splitting of the proof), and writes each piece as a mix of the two adjacent levels of its
per-token time.
"""
from __future__ import annotations

import numpy as np
from scipy.sparse import csc_matrix

from lpserve.opt.cost_lp_build import KIND_NAMES, build_cost_lp, request_floors
from lpserve.opt.cost_lp_terms import iteration_minorant, prefill_classes, share_levels


def _mix(levels: np.ndarray, t: float) -> tuple[int, float]:
    """(k, weight of level k) so that the mix of levels k, k+1 has per-token time t (t beyond
    the last level is written at the last level, with less time)."""
    if levels.size == 1:
        return 0, 1.0
    t = min(max(t, levels[0]), levels[-1])
    k = int(min(np.searchsorted(levels, t, side="right") - 1, levels.size - 2))
    lam = (levels[k + 1] - t) / (levels[k + 1] - levels[k])
    return k, float(lam)


def embed(instance, result, log, model=None):
    """``(model, x)``: the LP of ``instance`` (built if not given) and the point of the
    schedule recorded in ``log`` whose result is ``result`` (mass past a request's window
    goes to its late columns; prompt tokens beyond the uncached ones it was charged for,
    recomputed or missed in the cache, are extra work the LP does not need)."""
    model = model if model is not None else build_cost_lp(instance)
    cost = instance.cost_model()
    m = iteration_minorant(cost)
    fl = request_floors(instance, cost)
    tr = instance.trace
    s = np.asarray(tr.prompt_tokens, np.int64)
    o = np.asarray(tr.output_tokens, np.int64)
    dt = model.dt_s
    ths = [m.F_A * g for g in (1.3, 1.7, 2.5)] if m.kind == 0 else []
    classes = prefill_classes(cost, m, int(fl.uncached.max()))
    key = {}
    for j in range(model.c.size):
        key[(int(model.col_req[j]), int(model.col_kind[j]), int(model.col_k[j]),
             int(model.col_q[j]), int(model.col_lev[j]))] = j
    x = np.zeros(model.c.size)
    DEC, PRE = KIND_NAMES.index("decode"), KIND_NAMES.index("prefill")

    late = {DEC: "late-decode", PRE: "late-prefill"}

    def put(i, kind, k, q, lev, v):
        j = key.get((i, kind, k, q, lev))
        if j is None:  # past the request's window: its late column
            j = int(model.columns(late[kind], i)[0])
        x[j] += v

    levels = {}
    owed = fl.uncached.astype(np.float64).copy()
    for _, t0, t1, pre, dec in log:
        T = t1 - t0
        # a chunk larger than the prompt tokens still owed (a cache miss, or a prefill
        # recomputed after preemption) counts as a chunk of those tokens taking the whole
        # iteration (T >= T(that smaller chunk alone)); tokens beyond them are extra work
        eff = []
        # a request in decode phase before its first token computes its last prompt token
        # (models/simulator.md (2)): a one-token chunk
        for i, c, _h, g in pre + [(i, 1, ctx, g) for i, ctx, g in dec if g == 0]:
            if g == 0 and owed[i] > 0:
                ce = int(min(c, owed[i]))
                owed[i] -= ce
                eff.append((i, ce))
        for k in range(int(t0 // dt), int(t1 // dt) + 1):
            lo, hi = max(t0, k * dt), min(t1, (k + 1) * dt)
            if hi <= lo:
                continue
            f = (hi - lo) / T
            done = [(i, c) for i, c, g in dec if g >= 1]
            # a recompute's last chunk also produces a decode-phase token
            done += [(i, h + c - 1) for i, c, h, g in pre if g >= 1 and h + c == s[i] + g]
            for i, _ctx in done:
                if i not in levels:
                    levels[i] = share_levels(float(fl.d_min[i]), m.F_A,
                                             float(m.decode_a(s[i])), m.F_B,
                                             float(m.decode_b(s[i])), breaks=ths)[0]
                lev, lam = _mix(levels[i], T)
                put(i, DEC, k, -1, lev, f * lam)
                if lam < 1.0:
                    put(i, DEC, k, -1, lev + 1, f * (1.0 - lam))
            for i, c_eff in eff:
                q = max(j for j, pc in enumerate(classes) if pc.lo <= c_eff)
                lev, lam = _mix(classes[q].t, T / c_eff)
                put(i, PRE, k, q, lev, f * c_eff * lam)
                if lam < 1.0:
                    put(i, PRE, k, q, lev + 1, f * c_eff * (1.0 - lam))
    a = result.arrays
    for i in range(s.size):
        for kind, val in (("first-token", a["first_token_s"][i]), ("completion", a["finish_s"][i])):
            js = model.columns(kind, i)
            if js.size:
                x[js] = val
    # the chain slacks of the precedence rows and the interval work columns follow
    A = csc_matrix((model.a_value, model.a_index, model.a_start),
                   shape=(model.row_lo.size, model.c.size)).tocsr()
    for j in model.columns("precedence"):
        i, k = int(model.col_req[j]), int(model.col_k[j])
        sel = (model.col_req == i) & (model.col_k <= k)
        pre_m = x[sel & (model.col_kind == PRE)].sum() / fl.uncached[i]
        dec_m = x[sel & (model.col_kind == DEC)].sum() / max(o[i] - 1, 1)
        x[j] = pre_m - dec_m
    for j in model.columns("work"):
        side = "AB"[int(model.col_q[j])]
        rows = np.flatnonzero(model.row_group == f"work{side}")
        r = rows[int(model.col_k[j])]
        x[j] = 0.0
        x[j] = -float(np.asarray(A[r] @ x).ravel()[0])
    return model, x


def violations(model, x, tol: float = 1e-7) -> dict[str, float]:
    """Largest violation (absolute, scaled by the row's bound) of each row family and of the
    column bounds at ``x``; empty when ``x`` is feasible."""
    A = csc_matrix((model.a_value, model.a_index, model.a_start),
                   shape=(model.row_lo.size, model.c.size))
    act = A @ x
    out = {}
    for g in np.unique(model.row_group):
        sel = model.row_group == g
        scale = 1.0 + np.abs(np.where(np.isfinite(model.row_hi[sel]), model.row_hi[sel], 0.0))
        v = np.maximum(np.maximum(model.row_lo[sel] - act[sel], act[sel] - model.row_hi[sel]),
                       0.0) / scale
        if v.max() > tol:
            out[str(g)] = float(v.max())
    # the completion and first-token columns' upper bounds cap latencies of an optimal
    # schedule only (proofs/cost-lp-bound.md, step 4); a simulated schedule may exceed them
    capped = (model.col_kind == KIND_NAMES.index("completion")) | \
        (model.col_kind == KIND_NAMES.index("first-token"))
    hi = np.where(capped, np.inf, model.col_hi)
    cb = max(float(np.max(x - hi, initial=0.0)), float(np.max(model.col_lo - x, initial=0.0)))
    if cb > tol:
        out["column bounds"] = cb
    return out
