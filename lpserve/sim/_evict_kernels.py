"""Numba kernels that choose which evictable blocks of a replica's KV pool
(:mod:`lpserve.sim._pool`) to drop: the built-in evictors' orders, taken off the pool's
heaps (``_pool``'s table of kinds), and the pause in which an evictor written in Python
chooses instead (kind ``external``).

The pause: the replica stops where an eviction needs the evictor (``make_room``), hands
the evictable blocks' arrays to :func:`lpserve.sim.hooks.evict` in object mode, which
builds the :class:`~lpserve.policy.EvictorView` (blocks in ascending slot order), asks the evictor, checks its answer with the
contract's checks and returns the slots; the kernel drops them and goes on. The same
hook tells an evictor that ``observes_requests`` of each arrival and finish
(:func:`observe`). Python runs once per eviction batch and per request event, never
per decode iteration.
"""
from __future__ import annotations

import numpy as np
from numba import njit, objmode

from lpserve.sim import _pool as P
from lpserve.sim import hooks as H

__all__ = ["evict", "evict_external", "observe"]


@njit(cache=True)
def _knap_p(p, c):
    """Reuse probability of knapsack class ``c`` over the evictable blocks: (blocks with
    more than ``c`` hits + 1) / (blocks with at least ``c`` hits + 2)."""
    above = 0
    at_least = 0
    for b in range(5):
        cnt = p.ist[P.P_KNAP + b]
        if b > c:
            above += cnt
        if b >= c:
            at_least += cnt
    return (above + 1.0) / (at_least + 2.0)


@njit(cache=True)
def _pick_knapsack(p, probs):
    """Heap (class) whose head has the lowest ``(last + credit p, -depth, slot)``."""
    best = -1
    bk = 0.0
    bn = 0
    bs = 0
    for h in range(4):
        if P.heap_top(p, h) < 0:
            continue
        k1, ng, s = P.top_entry(p, h)
        k = k1 + p.kp[P.K_CREDIT] * probs[h]
        if best < 0 or k < bk or (k == bk and (ng < bn or (ng == bn and s < bs))):
            best, bk, bn, bs = h, k, ng, s
    return best


@njit(cache=True)
def evict(p, n, queued, n_queued):
    """Evict ``n`` evictable blocks in the evictor's order (``n <= evictable``).

    ``queued[:n_queued]`` are the slots the first waiting requests would hit (used by
    ``lookahead`` only)."""
    kind = p.ist[P.P_KIND]
    if kind == P.EV_KNAPSACK:
        probs = np.empty(4)
        for c in range(4):
            probs[c] = _knap_p(p, c)
        for _ in range(n):
            h = _pick_knapsack(p, probs)
            s = P.top_entry(p, h)[2]
            P.heap_pop(p, h)
            P.evict_one(p, s)
        return
    if kind == P.EV_LOOKAHEAD:
        _evict_lookahead(p, n, queued, n_queued)
        return
    leafy = kind == P.EV_GDSF or kind == P.EV_RADIX or kind == P.EV_LFU
    done = 0
    if leafy:
        while done < n and P.heap_top(p, np.int64(1)) >= 0:
            s = P.top_entry(p, np.int64(1))[2]
            P.heap_pop(p, np.int64(1))
            P.evict_one(p, s)
            done += 1
    while done < n:
        P.heap_top(p, np.int64(0))
        s = P.top_entry(p, np.int64(0))[2]
        P.heap_pop(p, np.int64(0))
        P.evict_one(p, s)
        done += 1


@njit(cache=True)
def _evict_lookahead(p, n, queued, n_queued):
    """Evict ``n`` blocks by last access, the blocks ``queued[:n_queued]`` (hits of the
    first waiting requests) last, by ``(last + 1e12, -depth, slot)``; the rest go back."""
    mark = p.mark
    for k in range(n_queued):
        mark[queued[k]] = 1
    aside = np.empty(p.ist[P.P_EVICTABLE], np.int64)
    n_aside = 0
    done = 0
    while done < n and P.heap_top(p, np.int64(0)) >= 0:
        s = P.top_entry(p, np.int64(0))[2]
        P.heap_pop(p, np.int64(0))
        if mark[s]:
            aside[n_aside] = s
            n_aside += 1
            continue
        P.evict_one(p, s)
        done += 1
    if done < n:  # only queued blocks are left: by (last + 1e12, -depth, slot)
        key = np.empty(n_aside)
        neg = np.empty(n_aside, np.int64)
        for k in range(n_aside):
            key[k] = p.sf[P.F_LAST, aside[k]] + 1e12
            neg[k] = -p.si[P.S_DEPTH, aside[k]]
        o1 = np.argsort(aside[:n_aside], kind="mergesort")
        o2 = np.argsort(neg[o1], kind="mergesort")
        o12 = o1[o2]
        o3 = np.argsort(key[o12], kind="mergesort")
        order = o12[o3]
        for k in range(n_aside):
            s = aside[order[k]]
            if done < n:
                P.evict_one(p, s)
                done += 1
            else:
                P.heap_push(p, np.int64(0), p.sf[P.F_LAST, s], 0.0, s)
    else:
        for k in range(n_aside):
            s = aside[k]
            P.heap_push(p, np.int64(0), p.sf[P.F_LAST, s], 0.0, s)
    for k in range(n_queued):
        mark[queued[k]] = 0


# ===================================================================================== Python evictors
@njit(cache=True)
def evictable_view(p, tree):
    """The evictable blocks of pool ``p`` in ascending slot order, each one's position
    among them of its cached parent block (-1 where the parent is not evictable or not
    cached; all -1 unless ``tree``) and its cached children: three int64 arrays of shape
    ``(n,)``."""
    n = p.ist[P.P_EVICTABLE]
    slots = np.empty(n, np.int64)
    pos = p.mark  # slot -> position + 1 among the evictable blocks (0: not one)
    m = 0
    for s in range(p.ist[P.P_TOTAL]):
        if p.si[P.S_HASKEY, s] and p.si[P.S_REF, s] == 0:
            slots[m] = s
            m += 1
            pos[s] = m
    parent = np.full(n, -1, np.int64)
    children = np.empty(n, np.int64)
    for k in range(n):
        s = slots[k]
        children[k] = P.n_children(p, s)
        pk = p.si[P.S_PKEY, s]
        if tree and pk != P.NOKEY:
            ps = P.cached_slot(p, pk)
            if ps >= 0 and pos[ps] > 0:
                parent[k] = pos[ps] - 1
    for k in range(n):
        pos[slots[k]] = 0
    return slots, parent, children


@njit(cache=True)
def evict_external(p, n, now_s, handle, queued, n_queued, tree):
    """Evict the ``n`` blocks that the Python evictor of replica ``handle`` (a key of
    :func:`lpserve.sim.hooks.register`) chooses at ``now_s`` (s); ``queued[:n_queued]``:
    the slots the first waiting requests would hit (its ``reads_queue``); ``tree``: it
    reads the blocks' parents (its ``reads_tree``)."""
    slots, parent, children = evictable_view(p, tree)
    q = queued[:n_queued]
    with objmode(chosen="int64[:]"):
        chosen = H.evict(handle, n, now_s, slots, parent, children, q)
    for k in range(chosen.shape[0]):
        P.evict_one(p, chosen[k])


@njit(cache=True)
def observe(handle, kind, i, now_s, keys):
    """Tell the Python evictor of replica ``handle`` that request ``i`` arrived
    (``kind`` 0) or finished (1) there at ``now_s`` (s), ``keys``: at a finish, the
    content keys of its full prompt blocks."""
    with objmode():
        H.observe(handle, kind, i, now_s, keys)
