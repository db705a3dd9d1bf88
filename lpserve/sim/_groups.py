"""Groups of a replica's evictable KV blocks (numba), kept as blocks come and go, for the
session-aware evictors' compiled form (:mod:`lpserve.sim._session_evict`).

A group is what :class:`lpserve.policies.evictors_sessions.SessionEvictor` groups in its
view: the evictable blocks of equal thread, last access time and wait kind, i.e. the
blocks that requests of one thread released at one instant. A block joins its group when
it becomes evictable (:func:`join`, from ``_pool.release``) and leaves it when it is hit
again or evicted (:func:`leave`): O(1) each, and an eviction reads the groups, not the
cache (``models/kv-sessions.md`` section 6).

Layout (the pool's fields ``gi`` int64 ``(GI_ROWS, cap)``, ``gt`` float64
``(GT_ROWS, cap)``; ``cap = 2 (total blocks + 1)``, two columns when the pool's evictor
is another kind): a group's thread, wait kind, member count and first member (its
members form a doubly linked list through the slot rows ``S_GNEXT``/``S_GPREV`` of the
pool's ``si``; ``S_GROUP``: a slot's group, -1 none), its release time and its cached
mean recompute value (NaN: to be summed again), its cached eviction key (``GT_K1``,
``GT_K2``, tail depth ``GI_NEED``), valid before ``GT_UNTIL`` (-inf: to be keyed again;
a join or leave resets it) while the evictor's stamp is ``GI_STAMP``; ``GI_ORDER``:
group ids in creation order, which is time order (a dead group stays until the list is
compacted);
``GI_FREE``: a stack of unused ids; ``GI_STATE``: the two lists' lengths and the live
groups' count. The list is compacted when its dead groups outnumber the live ones
(:func:`live_groups`), so reading the groups costs O(live groups), amortized.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# rows of the pool's si (int64 per slot) after the pool's own nine
S_GROUP, S_GNEXT, S_GPREV = 9, 10, 11
N_SI_GROUPS = 3
# rows of gi (int64 per group id)
GI_THREAD, GI_WAIT, GI_COUNT, GI_HEAD, GI_ORDER, GI_FREE, GI_STATE, GI_STAMP, GI_NEED = \
    range(9)
GI_ROWS = 9
ST_ORDER, ST_FREE, ST_LIVE = 0, 1, 2  # GI_STATE: lengths of GI_ORDER, GI_FREE; live groups
# rows of gt (float64 per group id)
GT_T, GT_VAL, GT_K1, GT_K2, GT_UNTIL = range(5)
GT_ROWS = 5


def new_group_arrays(total_blocks: int, on: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(gi, gt)`` of a pool of ``total_blocks`` blocks: room for every group when
    ``on``, two unused columns otherwise."""
    cap = 2 * (int(total_blocks) + 1) if on else 2
    gi = np.zeros((GI_ROWS, cap), np.int64)
    gi[GI_FREE] = np.arange(cap - 1, -1, -1)
    gi[GI_STATE, ST_FREE] = cap if on else 0
    gt = np.full((GT_ROWS, cap), np.nan)
    return gi, gt


@njit(cache=True)
def _compact(gi):
    """Drop the dead groups from the creation-order list; their ids become free."""
    order, free, st = gi[GI_ORDER], gi[GI_FREE], gi[GI_STATE]
    m = 0
    for j in range(st[ST_ORDER]):
        g = order[j]
        if gi[GI_COUNT, g] > 0:
            order[m] = g
            m += 1
        else:
            free[st[ST_FREE]] = g
            st[ST_FREE] += 1
    st[ST_ORDER] = m


@njit(cache=True)
def _group_of(gi, gt, thread, wait, now):
    """The live group of ``(thread, wait, now)``, made if there is none. Releases come in
    time order, so the groups released at ``now`` end the creation-order list."""
    order, st = gi[GI_ORDER], gi[GI_STATE]
    j = st[ST_ORDER] - 1
    if j >= 0 and gt[GT_T, order[j]] > now:
        raise RuntimeError("internal: KV blocks released out of time order")
    while j >= 0 and gt[GT_T, order[j]] == now:
        g = order[j]
        if gi[GI_COUNT, g] > 0 and gi[GI_THREAD, g] == thread and gi[GI_WAIT, g] == wait:
            return g
        j -= 1
    if st[ST_FREE] == 0:
        _compact(gi)
    st[ST_FREE] -= 1
    g = gi[GI_FREE, st[ST_FREE]]
    order[st[ST_ORDER]] = g  # never full: it holds no free id
    st[ST_ORDER] += 1
    gi[GI_THREAD, g], gi[GI_WAIT, g], gi[GI_COUNT, g], gi[GI_HEAD, g] = thread, wait, 0, -1
    gt[GT_T, g] = now
    st[ST_LIVE] += 1
    return g


@njit(cache=True)
def join(gi, gt, si, s, thread, wait, now):
    """Slot ``s`` became evictable at ``now`` (s), released by a request of ``thread``
    with ``wait`` kind (-1: none): it joins their group."""
    g = _group_of(gi, gt, thread, wait, now)
    h = gi[GI_HEAD, g]
    si[S_GROUP, s], si[S_GNEXT, s], si[S_GPREV, s] = g, h, -1
    if h >= 0:
        si[S_GPREV, h] = s
    gi[GI_HEAD, g] = s
    gi[GI_COUNT, g] += 1
    gt[GT_VAL, g] = np.nan
    gt[GT_UNTIL, g] = -np.inf


@njit(cache=True)
def leave(gi, gt, si, s):
    """Slot ``s`` stops being evictable (hit again or evicted): it leaves its group."""
    g = si[S_GROUP, s]
    if g < 0:
        return
    nx, pv = si[S_GNEXT, s], si[S_GPREV, s]
    if pv >= 0:
        si[S_GNEXT, pv] = nx
    else:
        gi[GI_HEAD, g] = nx
    if nx >= 0:
        si[S_GPREV, nx] = pv
    si[S_GROUP, s] = -1
    gi[GI_COUNT, g] -= 1
    gt[GT_VAL, g] = np.nan
    gt[GT_UNTIL, g] = -np.inf
    if gi[GI_COUNT, g] == 0:
        gi[GI_STATE, ST_LIVE] -= 1


@njit(cache=True)
def live_groups(gi, out):
    """The live groups' ids in creation order into ``out``; their count. Compacts the
    creation-order list first when it holds more dead groups than live ones (each dead
    group is passed over at most once more before it is dropped)."""
    st = gi[GI_STATE]
    if st[ST_ORDER] > 2 * st[ST_LIVE] + 16:
        _compact(gi)
    G = 0
    for j in range(st[ST_ORDER]):
        g = gi[GI_ORDER, j]
        if gi[GI_COUNT, g] > 0:
            out[G] = g
            G += 1
    return G


@njit(cache=True)
def members(gi, si, g, out):
    """The slots of group ``g`` into ``out`` (unordered); their count."""
    m = 0
    s = gi[GI_HEAD, g]
    while s >= 0:
        out[m] = s
        m += 1
        s = si[S_GNEXT, s]
    return m
