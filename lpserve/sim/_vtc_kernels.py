"""Numba twin of :class:`lpserve.policies.fairness.VTC` (the Virtual Token Counter).

The Python scheduler is also the engine's meter: the engine credits every produced token
to the request's tenant on its replica as it is produced, and the scheduler reads the
counters only when it decides. The twin credits the same service at each decision
instead, from the per-request arrays the compiled engine keeps: a candidate's tokens since
the last decision, and the last tokens of the candidates that left since (they
finished). Every request that ever runs was a candidate of some decision on its replica
and stays in that replica's last-decision list until a decision it no longer belongs to,
so the counters read at every decision equal the metered ones (requests do not move
between replicas: :func:`lpserve.sim.twins.vtc_in_pauses` ranks VTC in Python, in
pauses, beside a rebalancer or on a disaggregated cluster). :func:`final_service` gives
the counters at the end of the run for
:meth:`~lpserve.sim.compiled.CompiledRun.sync_policy_state`.

Parameters (:func:`vtc_params`, from the scheduler and the run's tenant ids): ``fp =
[quantum_s, input_price, output_price, weight of dense tenant 0..T-1, shedding deadline of
dense tier 0..K-1 (inf: none)]`` and ``ip = [T, tenant ids (ascending; dense tenant t is
the t-th), K, dense tier of each tenant, admission cap of each tier (-1: none), tier of
each dense tier (ascending)]``; ``K = 0`` for plain VTC (one tier, nothing shed).
:class:`~lpserve.policies.fairness.TieredShedding` (``K >= 1``) serves tiers in strict
order, VTC within a tier, and sheds as its Python ``_admissible``. State ``pf`` float64
``(4, max(R T, R))``: rows 0-2 at ``r T + t`` the prompt tokens admitted, output tokens
produced and lift offset of tenant ``t`` on replica ``r`` (whole numbers in float64, exact
below 2**53); row 3 at ``r`` the counter of the last tenant to leave the backlog of
replica ``r``. Per request: the prompt-charged flag, the output tokens credited, the
decision stamp at which it was shed (0: never), whether the replica knows it (it was
admitted against its tier's cap) and the stamps marking it a candidate of the current and
of the previous decision.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from lpserve.kernels.heap import heap_pop, heap_push

_RUNNING_RANK = -1.0e18
_TIER_SCALE = 1.0e9
_PROMPT, _OUTPUT, _OFFSET, _LAST_LEFT = range(4)


def vtc_params(scheduler: Any, tenant: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(fp, ip)`` of the twin of ``scheduler`` (a VTC or TieredShedding) for a run whose
    requests have tenant ids ``tenant`` (int64 ``(n,)``)."""
    ids = np.unique(np.asarray(tenant, np.int64)).tolist()
    w = [float(scheduler.weights.get(t, 1.0)) for t in ids]
    tiers = getattr(scheduler, "tiers", None)
    quantum = float(scheduler.quantum_s or 0.0)
    if tiers is None:
        return (np.asarray([quantum, scheduler.input_price, scheduler.output_price, *w],
                           np.float64),
                np.asarray([len(ids), *ids, 0], np.int64))
    of = [int(tiers.get(t, 0)) for t in ids]
    levels = sorted(set(of))
    cap = [int(scheduler.max_waiting.get(k, -1)) for k in levels]
    limit = [float(scheduler.shed_after_s.get(k, np.inf)) for k in levels]
    return (np.asarray([quantum, scheduler.input_price, scheduler.output_price, *w, *limit],
                       np.float64),
            np.asarray([len(ids), *ids, len(levels), *[levels.index(k) for k in of], *cap,
                        *levels], np.int64))


def final_service(ip: np.ndarray, pf: np.ndarray, replica: np.ndarray,
                  prompt_charged: np.ndarray, prompt: np.ndarray, gen: np.ndarray,
                  tenant: np.ndarray, n_replicas: int) -> dict[int, dict[str, Any]]:
    """Per replica ``{"prompt": {tenant: tokens}, "output": {...}, "offset": {...},
    "last_left": s}`` at the end of a run: every token the requests produced and every
    prompt charged so far (``prompt_charged``: the twin's per-request flag; ``replica``:
    where each request ran, -1 if nowhere)."""
    T = int(ip[0])
    ids = ip[1:1 + T]
    ran = replica >= 0
    charged = ran & ((prompt_charged != 0) | (gen > 0))
    produced = ran & (gen > 0)
    col = np.where(ran, replica, 0) * T + np.searchsorted(ids, tenant)
    size = max(n_replicas * T, 1)
    p_tok = np.bincount(col[charged], weights=prompt[charged], minlength=size)
    p_any = np.bincount(col[charged], minlength=size)
    o_tok = np.bincount(col[produced], weights=gen[produced], minlength=size)
    o_any = np.bincount(col[produced], minlength=size)
    out: dict[int, dict[str, Any]] = {}
    for r in range(n_replicas):
        rec: dict[str, Any] = {"prompt": {}, "output": {}, "offset": {},
                               "last_left": float(pf[_LAST_LEFT, r])}
        for t in range(T):
            b = r * T + t
            if p_any[b]:
                rec["prompt"][int(ids[t])] = int(p_tok[b])
            if o_any[b]:
                rec["output"][int(ids[t])] = int(o_tok[b])
            if pf[_OFFSET, b] != 0.0:
                rec["offset"][int(ids[t])] = float(pf[_OFFSET, b])
        out[r] = rec
    return out


@njit(cache=True)
def _dense(ip, tenant_id):
    """Dense index of ``tenant_id`` among ``ip[1:1 + T]`` (ascending)."""
    lo, hi = 1, 1 + ip[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if ip[mid] < tenant_id:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@njit(cache=True)
def _counter(fp, pf, b, t):
    """Twin of ``VTC.counter``: weighted service plus lift of dense tenant ``t`` at
    ``pf`` column ``b``."""
    return (fp[1] * pf[_PROMPT, b] + fp[2] * pf[_OUTPUT, b]) / fp[3 + t] + pf[_OFFSET, b]


@njit(cache=True)
def _credit(ip, i, running, base, prompt, gen, tenant, charged_out, prompt_charged, pf):
    """Credit request ``i``'s service since it was last credited: its prompt once (when
    it is running or has produced a token) and every token it produced since."""
    b = base + _dense(ip, tenant[i])
    if prompt_charged[i] == 0 and (running or gen[i] > 0):
        prompt_charged[i] = 1
        pf[_PROMPT, b] += prompt[i]
    d = gen[i] - charged_out[i]
    if d > 0:
        pf[_OUTPUT, b] += d
        charged_out[i] = gen[i]


@njit(cache=True)
def _admissible(fp, ip, cand, run, m, tick_s, stamp, arrival, tenant, known, shed_at):
    """Twin of ``TieredShedding._admissible``: sheds waiting candidates past their tier's
    deadline (checked at the tick's start ``tick_s``) and, oldest first, the new ones that
    find their tier's cap of admissible requests waiting (``shed_at`` = ``stamp``)."""
    T, K = ip[0], ip[1 + ip[0]]
    tt, cap = 2 + T, 2 + 2 * T
    counts = np.zeros(K, np.int64)
    fresh = np.empty(m, np.int64)
    nf = 0
    for k in range(m):
        i = cand[k]
        if run[k] or shed_at[i] != 0:
            continue
        kk = ip[tt + _dense(ip, tenant[i])]
        if tick_s - arrival[i] > fp[3 + T + kk]:
            shed_at[i] = stamp
        elif known[i]:
            counts[kk] += 1
        else:
            fresh[nf] = i
            nf += 1
    fresh = fresh[:nf]
    o1 = np.argsort(fresh, kind="mergesort")
    arr = np.empty(nf)
    for w in range(nf):
        arr[w] = arrival[fresh[o1[w]]]
    for w in o1[np.argsort(arr, kind="mergesort")]:
        i = fresh[w]
        kk = ip[tt + _dense(ip, tenant[i])]
        known[i] = 1
        if 0 <= ip[cap + kk] <= counts[kk]:
            shed_at[i] = stamp
        else:
            counts[kk] += 1


@njit(cache=True)
def ranks(fp, ip, cand, run, m, rep, tick_s, prev, prev_run, arrival, prompt, gen, tenant,
          charged_out, prompt_charged, shed_at, known, in_prev, mark, stamp, pf, res):
    """VTC's (or TieredShedding's) ranks of ``cand[:m]`` (``run``: running flags) on
    replica ``rep`` into ``res``; ``prev``/``prev_run``: the candidates and flags of the
    replica's last decision; ``stamp``, ``stamp - 1``: fresh values for ``mark`` and
    ``in_prev`` (per request); ``tick_s``: the start of the current quantum tick."""
    T, K = ip[0], ip[1 + ip[0]]
    base = rep * T
    s_run, s_wait = stamp - 1, stamp
    for k in range(prev.shape[0]):
        in_prev[prev[k]] = stamp
    for k in range(m):
        i = cand[k]
        mark[i] = s_run if run[k] else s_wait
        if in_prev[i] != stamp:  # the replica forgets a request that left its candidates
            known[i] = 0
    # service since the last decision, of the candidates and of those that left
    for k in range(m):
        _credit(ip, cand[k], run[k] != 0, base, prompt, gen, tenant, charged_out,
                prompt_charged, pf)
    for k in range(prev.shape[0]):
        i = prev[k]
        if mark[i] != s_run and mark[i] != s_wait:
            _credit(ip, i, False, base, prompt, gen, tenant, charged_out, prompt_charged,
                    pf)
    if K > 0:
        _admissible(fp, ip, cand, run, m, tick_s, stamp, arrival, tenant, known, shed_at)
    # the backlog's change: tenants that (re)joined are lifted to its floor (VTC._lift)
    now_t = np.zeros(T, np.bool_)
    prev_t = np.zeros(T, np.bool_)
    stay = np.zeros(T, np.bool_)
    for k in range(m):
        if not run[k] and shed_at[cand[k]] == 0:
            now_t[_dense(ip, tenant[cand[k]])] = True
    for k in range(prev.shape[0]):
        i = prev[k]
        if prev_run[k] == 0 and (shed_at[i] == 0 or shed_at[i] == stamp):
            t = _dense(ip, tenant[i])
            prev_t[t] = True
            if mark[i] == s_wait and shed_at[i] == 0:
                stay[t] = True
    any_stay = False
    floor = 0.0
    for t in range(T):
        if stay[t]:
            c = _counter(fp, pf, base + t, t)
            floor = c if not any_stay else min(floor, c)
            any_stay = True
    if not any_stay:
        for t in range(T):
            if prev_t[t]:
                pf[_LAST_LEFT, rep] = max(pf[_LAST_LEFT, rep], _counter(fp, pf, base + t, t))
        floor = pf[_LAST_LEFT, rep]
    for t in range(T):
        if now_t[t] and not stay[t]:
            c = _counter(fp, pf, base + t, t)
            if c < floor:
                pf[_OFFSET, base + t] += floor - c
    _order(fp, ip, cand, run, m, base, arrival, prompt, tenant, prompt_charged, shed_at,
           pf, res)


@njit(cache=True)
def _order(fp, ip, cand, run, m, base, arrival, prompt, tenant, prompt_charged, shed_at,
           pf, res):
    """Admission order (``VTC._order`` within each tier, tiers in order): each tenant's
    queue by (arrival, request), the tenant with the smallest (counter, head arrival, id)
    first, its counter raised by the prompt; shed requests +inf, running ones first."""
    T, K = ip[0], ip[1 + ip[0]]
    nw = 0
    for k in range(m):
        if run[k]:
            res[k] = _RUNNING_RANK
        elif shed_at[cand[k]] != 0:
            res[k] = np.inf
        else:
            nw += 1
    if nw == 0:
        return
    pos = np.empty(nw, np.int64)
    w = 0
    for k in range(m):
        if not run[k] and shed_at[cand[k]] == 0:
            pos[w] = k
            w += 1
    ids = np.empty(nw, np.int64)
    for w in range(nw):
        ids[w] = cand[pos[w]]
    o1 = np.argsort(ids, kind="mergesort")
    arr = np.empty(nw)
    for w in range(nw):
        arr[w] = arrival[cand[pos[o1[w]]]]
    order = o1[np.argsort(arr, kind="mergesort")]
    # queues: positions grouped by dense tenant, each in (arrival, request) order
    start = np.zeros(T + 1, np.int64)
    for w in range(nw):
        start[_dense(ip, tenant[cand[pos[w]]]) + 1] += 1
    for t in range(T):
        start[t + 1] += start[t]
    fill = start[:T].copy()
    queue = np.empty(nw, np.int64)
    for w in range(nw):
        k = pos[order[w]]
        t = _dense(ip, tenant[cand[k]])
        queue[fill[t]] = k
        fill[t] += 1
    head = start[:T].copy()
    # one entry per tenant: (counter, head arrival, tenant); no payload
    hc = np.empty(T)
    ha = np.empty(T)
    ht = np.empty(T, np.int64)
    hv = np.zeros(T, np.int64)
    for kk in range(max(K, 1)):
        scale = float(ip[2 + 2 * T + K + kk]) * _TIER_SCALE if K > 0 else 0.0
        n = 0
        for t in range(T):
            if start[t + 1] > start[t] and (K == 0 or ip[2 + T + t] == kk):
                n = heap_push(hc, ha, ht, hv, n, _counter(fp, pf, base + t, t),
                              arrival[cand[queue[start[t]]]], t, 0)
        rank = 0
        while n > 0:
            c, t = hc[0], ht[0]
            n = heap_pop(hc, ha, ht, hv, n)
            k = queue[head[t]]
            res[k] = float(rank)
            if K > 0:
                res[k] += scale
            rank += 1
            head[t] += 1
            if prompt_charged[cand[k]] == 0:
                c += fp[1] * prompt[cand[k]] / fp[3 + t]
            if head[t] < start[t + 1]:
                n = heap_push(hc, ha, ht, hv, n, c, arrival[cand[queue[head[t]]]], t, 0)
