"""Numba twin of :class:`lpserve.policies.fairness.VTC` (the Virtual Token Counter).

The Python scheduler is also the engine's meter: the engine credits every produced token
to the request's tenant on its replica as it is produced, and the scheduler reads the
counters only when it decides. The twin credits the same service at each decision
instead, from the per-request arrays the compiled engine keeps: a candidate's tokens since
the last decision, and the last tokens of the candidates that left since (they
finished). Every request that ever runs was a candidate of some decision on its replica
and stays in that replica's last-decision list until a decision it no longer belongs to,
so the counters read at every decision equal the metered ones (requests do not move
between replicas: :func:`lpserve.sim.compiled.eligible` keeps VTC with a rebalancer or a
disaggregated cluster in Python). :func:`final_service` gives the counters at the end of
the run for :meth:`~lpserve.sim.compiled.CompiledRun.sync_policy_state`.

Parameters (:func:`vtc_params`): ``fp = [0 (no quantum), input_price, output_price,
weight of tenant 0, ...]`` and ``ip = [T, tenant id 0, ...]`` over the trace's tenant ids
in ascending order (dense tenant ``t`` is the ``t``-th smallest id). State ``pf``
float64 ``(4, max(R T, R))``: rows 0-2 at ``r T + t`` the prompt tokens admitted, output
tokens produced and lift offset of tenant ``t`` on replica ``r`` (whole numbers in
float64, exact below 2**53); row 3 at ``r`` the counter of the last tenant to leave the
backlog of replica ``r``.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from numba import njit

_RUNNING_RANK = -1.0e18
_PROMPT, _OUTPUT, _OFFSET, _LAST_LEFT = range(4)


def vtc_params(input_price: float, output_price: float, weights: Mapping[int, float],
               tenant: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(fp, ip)`` of the twin for a run whose requests have tenant ids ``tenant``
    (int64 ``(n,)``); unlisted tenants weigh 1."""
    ids = np.unique(np.asarray(tenant, np.int64))
    fp = np.concatenate([[0.0, float(input_price), float(output_price)],
                         [float(weights.get(int(t), 1.0)) for t in ids.tolist()]])
    return fp.astype(np.float64), np.concatenate([[ids.size], ids]).astype(np.int64)


def final_service(ip: np.ndarray, pf: np.ndarray, replica: np.ndarray,
                  prompt_charged: np.ndarray, prompt: np.ndarray, gen: np.ndarray,
                  tenant: np.ndarray, n_replicas: int) -> dict[int, dict[str, Any]]:
    """Per replica ``{"prompt": {tenant: tokens}, "output": {...}, "offset": {...},
    "last_left": s}`` at the end of a run: every token the requests produced and every
    prompt charged so far (``prompt_charged``: the twin's per-request flag; ``replica``:
    where each request ran, -1 if nowhere)."""
    T = int(ip[0])
    ids = ip[1:1 + T]
    out: dict[int, dict[str, Any]] = {}
    ran = replica >= 0
    charged = ran & ((prompt_charged != 0) | (gen > 0))
    produced = ran & (gen > 0)
    dense = np.searchsorted(ids, tenant)
    for r in range(n_replicas):
        on = replica == r
        rec: dict[str, Any] = {"prompt": {}, "output": {}, "offset": {},
                               "last_left": float(pf[_LAST_LEFT, r])}
        for t in range(T):
            mine = on & (dense == t)
            if (mine & charged).any():
                rec["prompt"][int(ids[t])] = int(prompt[mine & charged].sum())
            if (mine & produced).any():
                rec["output"][int(ids[t])] = int(gen[mine & produced].sum())
            if pf[_OFFSET, r * T + t] != 0.0:
                rec["offset"][int(ids[t])] = float(pf[_OFFSET, r * T + t])
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
def _less(hc, ha, ht, a, b):
    if hc[a] != hc[b]:
        return hc[a] < hc[b]
    if ha[a] != ha[b]:
        return ha[a] < ha[b]
    return ht[a] < ht[b]


@njit(cache=True)
def _swap(hc, ha, ht, a, b):
    hc[a], hc[b] = hc[b], hc[a]
    ha[a], ha[b] = ha[b], ha[a]
    ht[a], ht[b] = ht[b], ht[a]


@njit(cache=True)
def _push(hc, ha, ht, n, c, a, t):
    hc[n], ha[n], ht[n] = c, a, t
    i = n
    while i > 0:
        par = (i - 1) >> 1
        if not _less(hc, ha, ht, i, par):
            break
        _swap(hc, ha, ht, i, par)
        i = par
    return n + 1


@njit(cache=True)
def _pop(hc, ha, ht, n):
    """Remove the heap's head (moved to position ``n - 1``); returns the new size."""
    n -= 1
    _swap(hc, ha, ht, 0, n)
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(hc, ha, ht, c + 1, c):
            c += 1
        if not _less(hc, ha, ht, c, i):
            break
        _swap(hc, ha, ht, c, i)
        i = c
    return n


@njit(cache=True)
def ranks(fp, ip, cand, run, m, rep, prev, prev_run, arrival, prompt, gen, tenant,
          charged_out, prompt_charged, mark, stamp, pf, res):
    """VTC's ranks of ``cand[:m]`` (``run``: running flags) on replica ``rep`` into
    ``res``; ``prev``/``prev_run``: the candidates and flags of the replica's last
    decision; ``mark`` (per request) with ``stamp`` and ``stamp - 1`` fresh values."""
    T = ip[0]
    base = rep * T
    s_run, s_wait = stamp - 1, stamp
    for k in range(m):
        mark[cand[k]] = s_run if run[k] else s_wait
    # service since the last decision, of the candidates and of those that left
    for k in range(m):
        _credit(ip, cand[k], run[k] != 0, base, prompt, gen, tenant, charged_out,
                prompt_charged, pf)
    for k in range(prev.shape[0]):
        i = prev[k]
        if mark[i] != s_run and mark[i] != s_wait:
            _credit(ip, i, False, base, prompt, gen, tenant, charged_out, prompt_charged,
                    pf)
    # the backlog's change: tenants that (re)joined are lifted to its floor (VTC._lift)
    now_t = np.zeros(T, np.bool_)
    prev_t = np.zeros(T, np.bool_)
    stay = np.zeros(T, np.bool_)
    for k in range(m):
        if not run[k]:
            now_t[_dense(ip, tenant[cand[k]])] = True
    for k in range(prev.shape[0]):
        if prev_run[k] == 0:
            i = prev[k]
            t = _dense(ip, tenant[i])
            prev_t[t] = True
            if mark[i] == s_wait:
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
    # admission order (VTC._order): each tenant's queue by (arrival, request), the tenant
    # with the smallest (counter, head arrival, id) first, its counter raised by the prompt
    nw = 0
    for k in range(m):
        if run[k]:
            res[k] = _RUNNING_RANK
        else:
            nw += 1
    if nw == 0:
        return
    pos = np.empty(nw, np.int64)
    w = 0
    for k in range(m):
        if not run[k]:
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
    hc = np.empty(T)
    ha = np.empty(T)
    ht = np.empty(T, np.int64)
    n = 0
    for t in range(T):
        if start[t + 1] > start[t]:
            n = _push(hc, ha, ht, n, _counter(fp, pf, base + t, t),
                      arrival[cand[queue[start[t]]]], t)
    rank = 0
    while n > 0:
        c, t = hc[0], ht[0]
        n = _pop(hc, ha, ht, n)
        k = queue[head[t]]
        res[k] = float(rank)
        rank += 1
        head[t] += 1
        if prompt_charged[cand[k]] == 0:
            c += fp[1] * prompt[cand[k]] / fp[3 + t]
        if head[t] < start[t + 1]:
            n = _push(hc, ha, ht, n, c, arrival[cand[queue[head[t]]]], t)
