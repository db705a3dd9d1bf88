"""Numba kernels of the fast KV-cache replay, each beside a plain-Python ``_ref`` twin.

Setting (``models/kv-caching-flow.md`` section 1): requests are served in order; request
``r`` hits on the longest leading run of its blocks in the cache, then all its blocks are
in the cache and the evictor brings it back to ``capacity`` blocks. Inputs are the flat
arrays of :class:`lpserve.opt.cache_flow.BlockAccesses` (``offsets`` (n+1,), ``key``,
``parent``, ``depth``, ``value``, ``next_req`` (A,), ``arrival_s`` (n,)). Every kernel
returns the prefix hits per request, int64 ``(n,)``.

* :func:`lru_replay` — block LRU as vLLM's free-block queue (a request's blocks are
  appended in reverse order, so its last block is evicted first).
* :func:`heap_replay` — evict the smallest ``(priority, tie, seq)`` with a lazy binary heap;
  the priority is set when a block is touched, per ``mode`` (``MODE_*``). With
  ``leaves_only`` only blocks without a cached child are evictable (SGLang radix leaves).
  ``MODE_KNAPSACK`` is the knapsack index of ``models/kv-knapsack.md`` (6): recency credit
  proportional to the reuse probability of the block's class, learned online.
"""
from __future__ import annotations

import heapq

import numpy as np
from numba import njit

MODE_LRU = 0        # priority = arrival time of the last touch, deepest first among ties
MODE_LFU = 1        # priority = touches, then age
MODE_GDSF = 2       # priority = L + touches * value / size, L = priority of the last victim
MODE_PREFIX = 3     # LRU; blocks that branched (shared prefixes) get params[0] s of credit
MODE_SESSION = 4    # LRU; blocks of returning sessions get their inter-turn gap as credit
MODE_LOOKAHEAD = 5  # LRU; blocks a queued request (arrived by now + params[0]) needs are kept
MODE_BELADY = 6     # priority = -next request that uses the block (offline), shallow first
MODE_KNAPSACK = 7   # LRU; credit params[0] s x learned reuse probability of the block's class
MODE_BELADY_DEEP = 8  # Belady, deepest first among blocks next used by the same request
MODE_NAMES = ("lru", "lfu", "gdsf", "prefix", "session", "lookahead", "belady", "knapsack",
              "belady-prefix")
N_CLASSES = 5       # reuse classes: touched once, twice, 3-4, 5+ times; partial last blocks


# ===================================================================================== LRU
@njit(cache=True)
def lru_replay(offsets, key, n_keys, capacity):  # pragma: no cover - numba
    """Block LRU with vLLM's reverse-order free queue; hits per request (n,)."""
    n = offsets.shape[0] - 1
    prv = np.full(n_keys, -1, np.int64)
    nxt = np.full(n_keys, -1, np.int64)
    inc = np.zeros(n_keys, np.bool_)
    head = -1
    tail = -1
    size = 0
    hits = np.zeros(n, np.int64)
    for r in range(n):
        a0 = offsets[r]
        a1 = offsets[r + 1]
        j = a0
        while j < a1 and inc[key[j]]:
            j += 1
        hits[r] = j - a0
        for a in range(a1 - 1, a0 - 1, -1):
            k = key[a]
            if inc[k]:  # unlink
                p = prv[k]
                q = nxt[k]
                if p >= 0:
                    nxt[p] = q
                else:
                    head = q
                if q >= 0:
                    prv[q] = p
                else:
                    tail = p
            else:
                inc[k] = True
                size += 1
            prv[k] = tail  # append at the MRU tail
            nxt[k] = -1
            if tail >= 0:
                nxt[tail] = k
            else:
                head = k
            tail = k
        while size > capacity:
            k = head
            head = nxt[k]
            if head >= 0:
                prv[head] = -1
            else:
                tail = -1
            inc[k] = False
            size -= 1
    return hits


def lru_replay_ref(offsets, key, n_keys, capacity):
    """Plain-Python twin of :func:`lru_replay`."""
    from collections import OrderedDict

    cache: OrderedDict = OrderedDict()
    n = len(offsets) - 1
    hits = np.zeros(n, np.int64)
    for r in range(n):
        ks = [int(k) for k in key[offsets[r]:offsets[r + 1]]]
        h = 0
        while h < len(ks) and ks[h] in cache:
            h += 1
        hits[r] = h
        for k in reversed(ks):
            cache.pop(k, None)
            cache[k] = True
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits


# ===================================================================================== heap
@njit(cache=True)
def _less(p1, t1, s1, p2, t2, s2):  # pragma: no cover - numba
    if p1 != p2:
        return p1 < p2
    if t1 != t2:
        return t1 < t2
    return s1 < s2


@njit(cache=True)
def _push(hp, ht, hs, hk, m, p, t, s, k):  # pragma: no cover - numba
    i = m
    hp[i] = p
    ht[i] = t
    hs[i] = s
    hk[i] = k
    while i > 0:
        par = (i - 1) // 2
        if _less(hp[i], ht[i], hs[i], hp[par], ht[par], hs[par]):
            hp[i], hp[par] = hp[par], hp[i]
            ht[i], ht[par] = ht[par], ht[i]
            hs[i], hs[par] = hs[par], hs[i]
            hk[i], hk[par] = hk[par], hk[i]
            i = par
        else:
            break
    return m + 1


@njit(cache=True)
def _pop(hp, ht, hs, hk, m):  # pragma: no cover - numba
    m -= 1
    hp[0] = hp[m]
    ht[0] = ht[m]
    hs[0] = hs[m]
    hk[0] = hk[m]
    i = 0
    while True:
        lft = 2 * i + 1
        rgt = lft + 1
        best = i
        if lft < m and _less(hp[lft], ht[lft], hs[lft], hp[best], ht[best], hs[best]):
            best = lft
        if rgt < m and _less(hp[rgt], ht[rgt], hs[rgt], hp[best], ht[best], hs[best]):
            best = rgt
        if best == i:
            break
        hp[i], hp[best] = hp[best], hp[i]
        ht[i], ht[best] = ht[best], ht[i]
        hs[i], hs[best] = hs[best], hs[i]
        hk[i], hk[best] = hk[best], hk[i]
        i = best
    return m


@njit(cache=True)
def _reuse_class(count, last_block):  # pragma: no cover - numba
    if last_block:
        return 4
    if count <= 1:
        return 0
    if count == 2:
        return 1
    if count <= 4:
        return 2
    return 3


@njit(cache=True)
def _touch_priority(mode, a, k, now, depth, value, next_req, count, fanout, L, gap_s,
                    last_block, p_class, params):  # pragma: no cover - numba
    """(priority, tie) of block ``k`` touched by access ``a`` at ``now``; smallest goes."""
    if mode == MODE_LFU:
        return float(count[k]), a
    if mode == MODE_GDSF:
        return L + count[k] * value[a], a
    if mode == MODE_BELADY:
        return -float(next_req[a]), depth[a]
    if mode == MODE_BELADY_DEEP:
        return -float(next_req[a]), -depth[a]
    p = now
    if last_block:
        p = now - params[1]  # a partial last block cannot serve a longer prompt
    elif mode == MODE_PREFIX and fanout[k] >= 2:
        p = now + params[0]
    elif mode == MODE_SESSION and gap_s > 0:
        p = now + min(gap_s, params[0])
    elif mode == MODE_KNAPSACK:
        p = now + params[0] * p_class
    return p, -depth[a]


@njit(cache=True)
def heap_replay(offsets, key, parent, depth, value, next_req, partial_last, arrival_s,
                n_keys, capacity, mode, leaves_only, params):  # pragma: no cover - numba
    """Priority eviction with a lazy heap; see the module docstring. ``params``
    float64 (2,): mode credit/window (s), penalty (s) of a partial last block."""
    n = offsets.shape[0] - 1
    A = key.shape[0]
    cap_h = 2 * A + 16
    hp = np.empty(cap_h, np.float64)
    ht = np.empty(cap_h, np.int64)
    hs = np.empty(cap_h, np.int64)
    hk = np.empty(cap_h, np.int64)
    m = 0
    seq = 0
    inc = np.zeros(n_keys, np.bool_)
    cur = np.full(n_keys, -1, np.int64)  # seq of the live heap entry, -1 none
    cprio = np.zeros(n_keys, np.float64)
    ctie = np.zeros(n_keys, np.int64)
    count = np.zeros(n_keys, np.int64)
    nchild = np.zeros(n_keys, np.int64)
    kparent = np.full(n_keys, -1, np.int64)
    fanout = np.zeros(n_keys, np.int64)
    firstchild = np.full(n_keys, -1, np.int64)
    last_touch = np.zeros(n_keys, np.float64)
    lastacc = np.zeros(n_keys, np.int64)
    lastcls = np.zeros(n_keys, np.int64)
    cls_touch = np.zeros(N_CLASSES, np.float64)
    cls_reuse = np.zeros(N_CLASSES, np.float64)
    deferred = np.zeros(n_keys, np.bool_)
    hold = np.empty(A + 1, np.int64)
    L = 0.0
    size = 0
    hits = np.zeros(n, np.int64)
    for r in range(n):
        a0 = offsets[r]
        a1 = offsets[r + 1]
        now = arrival_s[r]
        j = a0
        while j < a1 and inc[key[j]]:
            j += 1
        hits[r] = j - a0
        gap_s = 0.0
        if j - a0 >= 2:  # a returning session: time since its previous turn
            gap_s = now - last_touch[key[j - 1]]
        for a in range(a0, a1):
            k = key[a]
            if count[k] > 0:
                cls_reuse[lastcls[k]] += 1.0
            count[k] += 1
            last_block = a == a1 - 1 and partial_last[r]
            c = _reuse_class(count[k], last_block)
            cls_touch[c] += 1.0
            lastcls[k] = c
            pk = parent[a]
            kparent[k] = pk
            if pk >= 0:
                if firstchild[pk] == -1:
                    firstchild[pk] = k
                    fanout[pk] = 1
                elif firstchild[pk] != k:
                    fanout[pk] = 2
            if not inc[k]:
                inc[k] = True
                size += 1
                if pk >= 0:
                    nchild[pk] += 1
            last_touch[k] = now
            lastacc[k] = a
            p_class = (cls_reuse[c] + 1.0) / (cls_touch[c] + 2.0)
            p, t = _touch_priority(mode, a, k, now, depth, value, next_req, count, fanout, L,
                                   gap_s, last_block, p_class, params)
            cprio[k] = p
            ctie[k] = t
            deferred[k] = False
            cur[k] = seq
            m = _push(hp, ht, hs, hk, m, p, t, seq, k)
            seq += 1
        nhold = 0
        protect = mode == MODE_LOOKAHEAD
        while size > capacity:
            if m == 0:  # everything left is needed by queued requests: evict anyway
                for q in range(nhold):
                    k = hold[q]
                    m = _push(hp, ht, hs, hk, m, cprio[k], ctie[k], cur[k], k)
                nhold = 0
                protect = False
                continue
            p = hp[0]
            s = hs[0]
            k = hk[0]
            m = _pop(hp, ht, hs, hk, m)
            if not inc[k] or cur[k] != s:
                continue
            if leaves_only and nchild[k] > 0:
                deferred[k] = True
                cur[k] = -2
                continue
            if protect:
                nr = next_req[lastacc[k]]  # next request needing k; queued if arrived
                if nr < n and arrival_s[nr] <= now + params[0]:
                    hold[nhold] = k
                    nhold += 1
                    continue
            inc[k] = False
            cur[k] = -1
            size -= 1
            if mode == MODE_GDSF:
                L = p
            pk = kparent[k]
            if pk >= 0:
                nchild[pk] -= 1
                if nchild[pk] == 0 and inc[pk] and deferred[pk]:
                    deferred[pk] = False
                    cur[pk] = seq
                    m = _push(hp, ht, hs, hk, m, cprio[pk], ctie[pk], seq, pk)
                    seq += 1
        for q in range(nhold):
            k = hold[q]
            m = _push(hp, ht, hs, hk, m, cprio[k], ctie[k], cur[k], k)
    return hits


def heap_replay_ref(offsets, key, parent, depth, value, next_req, partial_last, arrival_s,
                    n_keys, capacity, mode, leaves_only, params):
    """Plain-Python twin of :func:`heap_replay` (same priorities and tie-breaks)."""
    n = len(offsets) - 1
    heap: list = []
    seq = 0
    inc = [False] * n_keys
    cur = [-1] * n_keys
    cprio = [0.0] * n_keys
    ctie = [0] * n_keys
    count = [0] * n_keys
    nchild = [0] * n_keys
    kparent = [-1] * n_keys
    fanout = [0] * n_keys
    firstchild = [-1] * n_keys
    last_touch = [0.0] * n_keys
    lastacc = [0] * n_keys
    lastcls = [0] * n_keys
    cls_touch = [0.0] * N_CLASSES
    cls_reuse = [0.0] * N_CLASSES
    deferred = [False] * n_keys
    L = 0.0
    size = 0
    hits = np.zeros(n, np.int64)
    for r in range(n):
        a0, a1 = int(offsets[r]), int(offsets[r + 1])
        now = float(arrival_s[r])
        j = a0
        while j < a1 and inc[key[j]]:
            j += 1
        hits[r] = j - a0
        gap_s = now - last_touch[key[j - 1]] if j - a0 >= 2 else 0.0
        for a in range(a0, a1):
            k = int(key[a])
            if count[k] > 0:
                cls_reuse[lastcls[k]] += 1.0
            count[k] += 1
            last_block = a == a1 - 1 and bool(partial_last[r])
            c = (4 if last_block else 0 if count[k] <= 1 else 1 if count[k] == 2
                 else 2 if count[k] <= 4 else 3)
            cls_touch[c] += 1.0
            lastcls[k] = c
            pk = int(parent[a])
            kparent[k] = pk
            if pk >= 0:
                if firstchild[pk] == -1:
                    firstchild[pk], fanout[pk] = k, 1
                elif firstchild[pk] != k:
                    fanout[pk] = 2
            if not inc[k]:
                inc[k] = True
                size += 1
                if pk >= 0:
                    nchild[pk] += 1
            last_touch[k] = now
            lastacc[k] = a
            p_class = (cls_reuse[c] + 1.0) / (cls_touch[c] + 2.0)
            if mode == MODE_LFU:
                p, t = float(count[k]), a
            elif mode == MODE_GDSF:
                p, t = L + count[k] * float(value[a]), a
            elif mode == MODE_BELADY:
                p, t = -float(next_req[a]), int(depth[a])
            elif mode == MODE_BELADY_DEEP:
                p, t = -float(next_req[a]), -int(depth[a])
            else:
                p, t = now, -int(depth[a])
                if last_block:
                    p = now - params[1]
                elif mode == MODE_PREFIX and fanout[k] >= 2:
                    p = now + params[0]
                elif mode == MODE_SESSION and gap_s > 0:
                    p = now + min(gap_s, params[0])
                elif mode == MODE_KNAPSACK:
                    p = now + params[0] * p_class
            cprio[k], ctie[k], deferred[k], cur[k] = p, t, False, seq
            heapq.heappush(heap, (p, t, seq, k))
            seq += 1
        hold = []
        protect = mode == MODE_LOOKAHEAD
        while size > capacity:
            if not heap:
                for k in hold:
                    heapq.heappush(heap, (cprio[k], ctie[k], cur[k], k))
                hold, protect = [], False
                continue
            p, _, s, k = heapq.heappop(heap)
            if not inc[k] or cur[k] != s:
                continue
            if leaves_only and nchild[k] > 0:
                deferred[k], cur[k] = True, -2
                continue
            if protect:
                nr = int(next_req[lastacc[k]])
                if nr < n and arrival_s[nr] <= now + params[0]:
                    hold.append(k)
                    continue
            inc[k], cur[k] = False, -1
            size -= 1
            if mode == MODE_GDSF:
                L = p
            pk = kparent[k]
            if pk >= 0:
                nchild[pk] -= 1
                if nchild[pk] == 0 and inc[pk] and deferred[pk]:
                    deferred[pk], cur[pk] = False, seq
                    heapq.heappush(heap, (cprio[pk], ctie[pk], seq, pk))
                    seq += 1
        for k in hold:
            heapq.heappush(heap, (cprio[k], ctie[k], cur[k], k))
    return hits
