"""The replicas' preemption decisions that read the ranks (numba): priority preemption
(:func:`preempt_outranked`) and FastServe's proactive swapping (:func:`proactive`,
:func:`relieve`; ``models/simulator.md`` (30)).

Under proactive swapping a victim of priority preemption stays *resident* (its KV on the
GPU; parked by :func:`preempt_outranked` when its KV has room on the host). Once per planning
step, after admission, :func:`proactive` swaps resident requests out to keep the free
blocks at the target (``C_PRO_TARGET``) or to make room for the waiting request at which
admission stopped (``I_BLOCKED``), else prefetches the best-ranked swapped-out requests
while the target allows; under memory pressure :func:`relieve` swaps out (or drops) the
worst resident request before any running one is preempted.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from lpserve.sim import _link_kernels as L
from lpserve.sim import _pool as P
from lpserve.sim import _state_kernels as T
from lpserve.sim import _step_kernels as S
from lpserve.sim import _swap_kernels as X


@njit(cache=True)
def preempt_outranked(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, ready):
    """``EngineConfig.priority_preemption`` for the waiting requests with
    ``req.ready <= ready``; under proactive swapping a victim is parked if its KV has host
    room (:func:`lpserve.sim._swap_kernels.resident_host_left`), else it keeps running and
    frees no blocks."""
    S.ensure_ranks(req, rep, cfg, rk)
    p = rep.pool
    order = S.waiting_by_rank(req, rep)
    n_run = rep.ist[T.I_NRUN]
    alive = rep.run[:n_run].copy()
    alive_n = n_run
    seats = cfg[T.C_MAX_SEQS] - n_run - rep.ist[T.I_NLOAD]
    free = P.available(p) - cfg[T.C_WM] + X.link_net(rep)
    max_need = p.ist[P.P_TOTAL] - cfg[T.C_WM]
    taken = np.zeros(p.ist[P.P_TOTAL], np.int64)
    victims = np.empty(n_run, np.int64)
    room = np.ones(n_run, np.bool_)
    left = X.resident_host_left(req, rep) if cfg[T.C_PROACTIVE] else 0
    n_v = 0
    floor = np.inf
    for t in range(order.shape[0]):
        w = order[t]
        if req.ready[w] > ready:
            continue
        r = req.rk[w]
        if r >= floor:
            break
        nd = T.admit_need(req, rep, cfg, w)
        if nd > max_need:
            continue
        stop = False
        while seats < 1 or free < nd:
            v = -1
            vk = -np.inf
            vpos = -1
            for pos in range(alive_n):
                i = alive[pos]
                if v < 0 or req.rk[i] >= vk:
                    v, vk, vpos = i, req.rk[i], pos
            if v < 0 or vk <= r:
                stop = True
                break
            for pos in range(vpos, alive_n - 1):
                alive[pos] = alive[pos + 1]
            alive_n -= 1
            if cfg[T.C_PROACTIVE]:
                need = X.host_need(req, rep, cfg, cff, params, swap_tab, cswap_tab, v)[1]
                room[n_v] = need <= left
                left -= need if room[n_v] else 0
            victims[n_v] = v
            n_v += 1
            floor = min(floor, vk)
            seats += 1
            if room[n_v - 1]:
                free += T.freed_blocks(req, rep, v, taken)
        if stop:
            break
        seats -= 1
        free -= nd
    for k in range(n_v):
        if not cfg[T.C_PROACTIVE]:
            X.preempt(req, rep, cfg, cff, params, swap_tab, cswap_tab, victims[k])
        elif room[k]:
            X.park(req, rep, victims[k])


@njit(cache=True)
def _residents_worst_first(req, ids):
    """The resident requests of the waiting list ``ids`` by ``(rank, position)``, worst
    first."""
    m = 0
    for k in range(ids.shape[0]):
        if req.xfer[ids[k]] == T.XF_RESIDENT:
            m += 1
    res = np.empty(m, np.int64)
    r = np.empty(m)
    j = 0
    for k in range(ids.shape[0]):
        if req.xfer[ids[k]] == T.XF_RESIDENT:
            res[j] = k  # its position
            r[j] = req.rk[ids[k]]
            j += 1
    o = np.argsort(r, kind="mergesort")  # ties by position (res is increasing)
    out = np.empty(m, np.int64)
    for k in range(m):
        out[k] = res[o[m - 1 - k]]
    return out


@njit(cache=True)
def relieve(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk):
    """Memory pressure: swap out (or drop) the worst-ranked resident request; False if
    none is resident."""
    if rep.ist[T.I_NRES] == 0:
        return False
    ids = T.waiting_ids(req, rep)
    S.ensure_ranks(req, rep, cfg, rk)  # asked only with a resident request, as there
    pos = _residents_worst_first(req, ids)
    X.evict_resident(req, rep, cfg, cff, params, swap_tab, cswap_tab, ids[pos[0]], -1)
    return True


@njit(cache=True)
def proactive(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, blocked, blocked_need):
    """Proactive swapping once per planning step after admission:
    ``blocked`` the waiting request at which admission stopped (-1: none) and its need.
    True if an evicted request was dropped (its blocks are free now); sets
    ``I_PRO_EVICTED`` to the requests swapped out or dropped."""
    ist, li = rep.ist, rep.link.li
    target = cfg[T.C_PRO_TARGET]
    wm = cfg[T.C_WM]
    free = P.available(rep.pool) + li[L.L_FREEING] - li[L.L_PROMISED]
    if ist[T.I_NWAIT] > 0:
        S.ensure_ranks(req, rep, cfg, rk)
    ist[T.I_PRO_EVICTED] = 0
    if ist[T.I_NRES] == 0 and ist[T.I_HOST_FREE] == cfg[T.C_HOST_BLOCKS]:
        return False  # nothing to swap out or in: no request is resident or on the host
    ids = T.waiting_ids(req, rep)
    res = _residents_worst_first(req, ids)
    head_r, head_p = math.inf, -1
    if blocked >= 0:
        head_r = req.rk[blocked]
        for k in range(ids.shape[0]):
            if ids[k] == blocked:
                head_p = k
    # nothing else frees blocks (no request running, no copy running): a resident
    # without host room is dropped, as memory pressure would
    stuck = ist[T.I_NRUN] == 0 and li[L.L_ACTIVE] < 0
    out = 0
    dropped = False
    for k in range(res.shape[0]):
        p = res[k]
        v = ids[p]
        rv = req.rk[v]
        short_head = blocked >= 0 and free - wm < blocked_need and \
            (rv > head_r or (rv == head_r and p > head_p))
        if free >= target and not short_head:
            break
        mode, need = X.host_need(req, rep, cfg, cff, params, swap_tab, cswap_tab, v)
        if need > ist[T.I_HOST_FREE] and not stuck:
            continue
        free += req.anon[v] + req.nslots[v]
        dropped |= X.evict_resident(req, rep, cfg, cff, params, swap_tab, cswap_tab, v, mode)
        out += 1
    ist[T.I_PRO_EVICTED] = out
    if out:
        return dropped
    # prefetch the best-ranked swapped-out waiting requests while the target allows
    # (and the watermark plus the blocked request's need)
    m = 0
    host = np.empty(ids.shape[0], np.int64)
    hr = np.empty(ids.shape[0])
    for k in range(ids.shape[0]):
        i = ids[k]
        if req.swapped[i] and req.xfer[i] == T.XF_NONE and req.rk[i] != math.inf:
            host[m] = i
            hr[m] = req.rk[i]
            m += 1
    o = np.argsort(hr[:m], kind="mergesort")  # ties by position
    floor = target if blocked < 0 else max(target, wm + blocked_need)
    for k in range(min(m, cfg[T.C_MAX_SEQS])):
        i = host[o[k]]
        n = req.swap_gpu[i]
        if free - n < floor:
            break
        free -= n
        req.xfer[i] = T.XF_IN
        X.issue(req, rep, cff, cfg, L.KIND_IN, i, n,
                X.copy_s(cff, swap_tab, n, req.compressed[i]), False)
    return False
