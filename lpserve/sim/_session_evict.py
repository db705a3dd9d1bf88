"""A session-aware evictor in the compiled replica (numba), for a pool whose evictor kind
is ``session-groups`` (``_pool``'s table): it learns at each arrival and finish
(:func:`learn`) and evicts the blocks
:meth:`lpserve.policies.evictors_sessions.SessionEvictor.evict` would choose, without a
pause to Python. ttl-pin with its duel is asked in Python once the duel has started
(:func:`asks_python`; its shadow caches take each finish of a thread there,
:func:`finish_in_python`); before, no replica pins and its shadows are empty, and the pool
evicts as above.

The pool keeps its evictable blocks in groups (:mod:`lpserve.sim._groups`). An eviction
of ``n`` blocks keys each live group at ``now``
(:func:`lpserve.kernels.session_keys.pool_group_key`, from what the evictor learned:
``sv_*`` fields, below; a group keeps its key while nothing it reads changed: its
members, the learned state's stamp, its validity time), orders the groups by
``(primary, secondary)`` with ties in ``(thread, release time, wait kind)`` order (the
view's groups,
:func:`lpserve.arrays.group_rows`; tail-lru by ``secondary`` alone), and takes blocks
group by group, deepest first, ties by slot; tail-lru first takes the blocks at or past
the depth the thread's next turn needs, then those. Work per eviction: O(G) in the live
groups G to key them, plus the members of the groups it takes from (found by scans, a
merge sort past 16 groups; a group's mean value, read by return-knapsack, is summed
again only after the group changed).

The pool's ``sv_*`` arrays (the evictor's own, :meth:`SessionEvictor.kernel_arrays`;
layouts in :mod:`lpserve.kernels.session_keys`): ``sv_f`` mode, TTLs,
parameters and counters; ``sv_ne`` the ended waits per class (K, 3); ``sv_pm`` (2, K, B)
the return probabilities and mean times of the latest fit; ``sv_th`` (threads,
``TH_LEN``) each thread's pending wait, gaps and latest finish; ``sv_tid`` the sorted
thread ids of those rows; ``sv_val`` each depth's recompute value (seconds; 1 without a
cost model); ``sv_ho``/``sv_rx`` the other wait statistics; ``sv_hf``/``sv_hi`` the
timeouts' heap.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from lpserve.kernels import session_keys as K
from lpserve.sim import _groups as GR
from lpserve.sim import _pool as P

_DEPTH_CAP, _SLOT_CAP = 1 << 30, 1 << 32  # packed sort keys of a group's members


@njit(cache=True)
def _mean_value(p, g, buf):
    """Group ``g``'s mean recompute value: its members' values summed in slot order (the
    view's order), over their count; cached until the group changes."""
    v = p.gt[GR.GT_VAL, g]
    if not np.isnan(v):
        return v
    m = GR.members(p.gi, p.si, g, buf)
    buf[:m].sort()
    tot = 0.0
    for k in range(m):
        d = p.si[P.S_DEPTH, buf[k]]
        if d >= p.sv_val.shape[0]:
            raise RuntimeError("internal: a KV block deeper than the run's longest request")
        tot += p.sv_val[d]
    v = tot / m
    p.gt[GR.GT_VAL, g] = v
    return v


@njit(cache=True)
def _group_keys(p, now, buf):
    """The live groups and, per group, its key ``(primary, secondary)``, its place in the
    view's group order ``(thread, release time bits, wait kind)`` and its tail depth."""
    gi, gt = p.gi, p.gt
    live = np.empty(gi[GR.GI_STATE, GR.ST_ORDER], np.int64)
    G = GR.live_groups(gi, live)
    mode = int(p.sv_f[K.SV_MODE])
    keys = np.empty((2, G))
    ties = np.empty((4, G), np.int64)  # thread, time bits, wait kind, tail depth
    tbit = np.empty(1)
    stamp = int(p.sv_f[K.SV_STAMP])
    for k in range(G):
        g = live[k]
        t_g = gt[GR.GT_T, g]
        if gi[GR.GI_STAMP, g] != stamp or not now < gt[GR.GT_UNTIL, g]:
            value = _mean_value(p, g, buf) if mode == K.MODE_INDEX else 0.0
            gt[GR.GT_K1, g], gt[GR.GT_K2, g], gi[GR.GI_NEED, g], gt[GR.GT_UNTIL, g] = \
                K.pool_group_key(p.sv_f, p.sv_ne, p.sv_pm, p.sv_th, p.sv_tid,
                                 gi[GR.GI_WAIT, g] + 1, t_g, gi[GR.GI_THREAD, g], now, value)
            gi[GR.GI_STAMP, g] = stamp
        keys[0, k], keys[1, k], ties[3, k] = gt[GR.GT_K1, g], gt[GR.GT_K2, g], \
            gi[GR.GI_NEED, g]
        tbit[0] = t_g
        ties[0, k], ties[1, k], ties[2, k] = gi[GR.GI_THREAD, g], tbit.view(np.int64)[0], \
            gi[GR.GI_WAIT, g]
    if mode == K.MODE_TAIL:  # tail-lru orders by the secondary key alone
        keys[0, :] = 0.0
    return live[:G], keys, ties


@njit(cache=True)
def _before(keys, ties, a, b):
    """Whether group ``a`` goes before group ``b``: by key, then the view's group order."""
    for r in range(2):
        if keys[r, a] != keys[r, b]:
            return keys[r, a] < keys[r, b]
    for r in range(3):
        if ties[r, a] != ties[r, b]:
            return ties[r, a] < ties[r, b]
    return False


@njit(cache=True)
def _sorted(keys, ties, idx):
    """Group indices ``idx`` in eviction order (:func:`_before`; a merge sort, stable)."""
    n = idx.shape[0]
    src, dst = idx.copy(), np.empty_like(idx)
    w = 1
    while w < n:
        for lo in range(0, n, 2 * w):
            mid, hi = min(lo + w, n), min(lo + 2 * w, n)
            i, j = lo, mid
            for k in range(lo, hi):
                if j < hi and (i == mid or _before(keys, ties, src[j], src[i])):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
        src, dst = dst, src
        w *= 2
    return src


@njit(cache=True)
def _order(keys, ties, order, n_done, used):
    """Extend ``order[:n_done]`` (the first groups in eviction order) by the next group:
    the smallest one not yet used (a scan: an eviction takes from few groups); after 16
    scans the rest is sorted at once. Returns the new length."""
    G = used.shape[0]
    if n_done >= 16:
        rest = np.empty(G - n_done, np.int64)
        m = 0
        for k in range(G):
            if not used[k]:
                rest[m] = k
                m += 1
        order[n_done:G] = _sorted(keys, ties, rest)
        used[:] = True
        return G
    best = -1
    for k in range(G):
        if not used[k] and (best < 0 or _before(keys, ties, k, best)):
            best = k
    used[best] = True
    order[n_done] = best
    return n_done + 1


@njit(cache=True)
def _deepest_first(p, g, buf):
    """Group ``g``'s members into ``buf``, deepest first, ties by slot (one sort of packed
    keys: the depth's complement above the slot's 32 bits); their count."""
    m = GR.members(p.gi, p.si, g, buf)
    for j in range(m):
        s, d = buf[j], p.si[P.S_DEPTH, buf[j]]
        if d >= _DEPTH_CAP or s >= _SLOT_CAP:
            raise RuntimeError("internal: a KV block deeper than 2**30 or a pool over 2**32")
        buf[j] = ((_DEPTH_CAP - d) << 32) | s
    buf[:m].sort()
    for j in range(m):
        buf[j] &= _SLOT_CAP - 1
    return m


@njit(cache=True)
def evict(p, n, now):
    """Evict ``n`` evictable blocks of pool ``p`` (``n <= evictable``) at ``now`` (s), in
    the order of the module docstring."""
    buf = np.empty(p.ist[P.P_TOTAL], np.int64)
    live, keys, ties = _group_keys(p, now, buf)
    G = live.shape[0]
    tail = int(p.sv_f[K.SV_MODE]) == K.MODE_TAIL
    order = np.empty(G, np.int64)
    used = np.zeros(G, np.bool_)
    n_ord = 0
    chosen = np.empty(n, np.int64)
    done = 0
    for stage in range(2 if tail else 1):  # tail-lru: the blocks past the need first
        for k in range(G):
            if done == n:
                break
            if k == n_ord:
                n_ord = _order(keys, ties, order, n_ord, used)
            q = order[k]
            m = _deepest_first(p, live[q], buf)
            for j in range(m):
                s = buf[j]
                if tail and (p.si[P.S_DEPTH, s] < ties[3, q]) != (stage == 1):
                    continue
                chosen[done] = s
                done += 1
                if done == n:
                    break
    if done < n:
        raise RuntimeError("internal: session groups hold fewer blocks than evictable")
    for k in range(n):
        P.evict_one(p, chosen[k])


@njit(cache=True)
def asks_python(p):
    """Whether pool ``p``'s evictions are asked of the Python evictor: ttl-pin's duel has
    started (its shadow caches live in the Python object)."""
    return p.sv_f[K.SV_ASK] != 0.0


@njit(cache=True)
def finish_in_python(p, thread):
    """Whether a finish of ``thread`` (-1: none) is told to the Python evictor, not
    learned here: ttl-pin's duel steps its shadow caches with every finish of a thread."""
    return thread >= 0 and K.duels(p.sv_f)


@njit(cache=True)
def learn(p, finish, now, thread, wait_kind, prompt, context, block_tokens):
    """Tell the session-aware evictor whose arrays pool ``p`` holds of a request's arrival
    (``finish`` False) or finish at ``now`` (s): ``lpserve.kernels.session_keys.learn``,
    and the refit it asks for; ``thread`` -1: none, ``wait_kind`` -1 at an arrival,
    ``context``: its prompt plus generated tokens at a finish, its prompt at an arrival."""
    r = np.searchsorted(p.sv_tid, thread) if thread >= 0 else 0
    if K.learn(p.sv_f, p.sv_ho, p.sv_rx, p.sv_ne, p.sv_pm, p.sv_th, p.sv_hf, p.sv_hi, finish,
               now, thread, r, wait_kind, prompt, context, block_tokens):
        K.refit(p.sv_f, p.sv_ho, p.sv_rx, p.sv_ne, p.sv_pm)
