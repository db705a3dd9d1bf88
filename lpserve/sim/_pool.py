"""Numba kernels of a replica's paged KV pool with hash-chained prefix caching.

The block pool of a replica and the built-in evictors' order (``evictors_kv``, ``LRU``):
four block states (plain free, anonymous used, hashed used, evictable), a LIFO stack of
free slots (first ``0, 1, 2, ...``); its plain-Python model, the oracle of the tests, is
``tests/oracles/blocks.py`` (the same states, slot order and eviction order).
Every cost is per operation, never per cached block: keys live in an open-addressing
table (linear probing, backward-shift deletion) and evictable blocks in lazy binary
heaps, each beside a sorted run that takes the pushes ordering after its last entry
(O(1): blocks released later by last access); stale entries are skipped at the top and
compacted away when a heap or run fills.

An evictor orders evictable blocks by ``(k1, k2, -depth, slot)`` (lower goes first):

=========  =========================================================================
kind       key
=========  =========================================================================
lru        ``k1 = last access``
prefix     ``k1 = last + credit * (depth < protect and hits > 0)`` (prefix-lru)
session    ``k1 = last + min(turn gap, credit)``
gdsf       ``k1 = last / age + (1 + depth / scale) * (hits + 1)``, radix leaves first
radix      ``k1 = last``, radix leaves first (radix-lru)
lfu        ``k1 = hits, k2 = last``, radix leaves first
knapsack   ``k1 = last + credit * p(c)`` with the reuse class ``c = min(hits, 3)`` and
           ``p(c) = (#hits > c + 1) / (#hits >= c + 2)`` over the evictable blocks,
           fixed for one eviction batch (one heap per class, ordered by last access)
lookahead  ``k1 = last + 1e12 * queued`` (blocks the first waiting requests would hit)
external   no heap: an evictor written in Python chooses from an ``EvictorView``
groups     no heap: blocks kept in their session groups (:mod:`lpserve.sim._groups`),
           ordered at each eviction (:mod:`lpserve.sim._session_evict`)
=========  =========================================================================

"Radix leaves first": only blocks without a cached child are taken while there are
such leaves (evicting a leaf can make its parent one, within the same batch); then the
rest by key (SGLang's radix cache). Heaps: 0 holds every evictable block (k2 = 0 unless
lfu); 1 holds leaves (leaf kinds); knapsack uses heaps 0-3, one per class. Taking
blocks off the heaps in that order, and the Python evictor's pause, are
:mod:`lpserve.sim._evict_kernels`.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np
from numba import njit

from lpserve.sim import _groups as GR
from lpserve.sim import _keytable as KT
from lpserve.sim._keytable import mix64  # noqa: F401 - the pool's key hash
from lpserve.sim._structs import POOL_FIELDS, new_pool

# evictor kinds
EV_LRU, EV_PREFIX, EV_SESSION, EV_GDSF, EV_RADIX, EV_LFU, EV_KNAPSACK, EV_LOOKAHEAD, \
    EV_EXTERNAL, EV_GROUPS = range(10)
EVICTOR_KINDS = {"lru": EV_LRU, "prefix-lru": EV_PREFIX, "session": EV_SESSION,
                 "gdsf": EV_GDSF, "radix-lru": EV_RADIX, "lfu": EV_LFU,
                 "knapsack": EV_KNAPSACK, "lookahead": EV_LOOKAHEAD,
                 "session-groups": EV_GROUPS}
N_HEAPS = 4
# heap h: a binary heap (rows h of the heap arrays, hsize[h] entries) and a sorted run
# (rows Q0 + h, a ring from hsize[Q0 + h] of hsize[2 Q0 + h] entries); hsize[3 Q0 + h]:
# the top heap_top found is the run's head
Q0 = N_HEAPS

# ist: int state
P_TOTAL, P_PLAIN, P_ANON, P_HASHED, P_EVICTABLE, P_FSP, P_MASK, P_KIND, P_CACHING, \
    P_STAMP = range(10)
P_KNAP = 10  # five counts: evictable blocks with hits 0, 1, 2, 3 and > 3
N_PIST = 15
# si rows (int64 per slot)
S_REF, S_DEPTH, S_HITS, S_HASKEY, S_KEY, S_PKEY, S_STAMP, S_THREAD, S_WAIT = range(9)
N_SI = 9 + GR.N_SI_GROUPS  # then a session group's rows (_groups.S_GROUP, ...)
# sf rows (float64 per slot)
F_LAST, F_CREATED, F_GAP = range(3)
N_SF = 3
# evictor parameters
K_CREDIT, K_PROTECT, K_AGE, K_SCALE = range(4)

NOKEY = np.iinfo(np.int64).min  # parent key of a prompt's first block
PoolArrays = namedtuple("PoolArrays", POOL_FIELDS)  # the kernels take pool_struct() of them


def pool_struct(arrays: "PoolArrays") -> Any:
    """The kernels' structure over the pool's arrays (they share memory)."""
    return new_pool(*arrays)


def new_pool_arrays(total_blocks: int, prefix_caching: bool, kind: int = EV_LRU,
                    params: tuple[float, ...] = (0.0, 0.0, 1.0, 1.0),
                    session: Any = None) -> PoolArrays:
    """The arrays of an empty pool of ``total_blocks`` blocks with evictor ``kind`` and its
    parameters ``(credit_s, protect_depth, age_s, depth_scale)``; ``session``: the arrays
    a session-aware evictor shares with the pool (kind ``session-groups``,
    :meth:`lpserve.policies.evictors_sessions.SessionEvictor.kernel_arrays`)."""
    total = int(total_blocks)
    cap = 16
    while cap < 4 * total:
        cap *= 2
    hcap = 2 * total + 64
    ist = np.zeros(N_PIST, np.int64)
    ist[P_TOTAL] = total
    ist[P_PLAIN] = total
    ist[P_FSP] = total
    ist[P_MASK] = cap - 1
    ist[P_KIND] = kind
    ist[P_CACHING] = int(bool(prefix_caching))
    si = np.zeros((N_SI, total), np.int64)
    si[S_STAMP] = si[S_THREAD] = si[S_WAIT] = si[GR.S_GROUP] = -1
    si[S_PKEY] = NOKEY
    gi, gt = GR.new_group_arrays(total, kind == EV_GROUPS)
    if session is None:
        session = (np.zeros(1), np.zeros((1, 1)), np.zeros((1, 1, 1)), np.zeros((1, 1)),
                   np.zeros(1, np.int64), np.zeros(1), np.zeros((1, 1, 1)),
                   np.zeros((1, 1, 1)), np.zeros((1, 1)), np.zeros((1, 1), np.int64))
    return PoolArrays(ist=ist, si=si, sf=np.zeros((N_SF, total)),
                fstack=np.arange(total - 1, -1, -1, dtype=np.int64),
                hk=np.zeros(cap, np.int64), hs=np.full(cap, -1, np.int64),
                hc=np.zeros(cap, np.int64), hu=np.zeros(cap, np.int64),
                hk1=np.zeros((2 * N_HEAPS, hcap)), hk2=np.zeros((2 * N_HEAPS, hcap)),
                hneg=np.zeros((2 * N_HEAPS, hcap), np.int64),
                hslot=np.zeros((2 * N_HEAPS, hcap), np.int64),
                hstamp=np.zeros((2 * N_HEAPS, hcap), np.int64),
                hsize=np.zeros(4 * N_HEAPS, np.int64), kp=np.asarray(params, np.float64),
                mark=np.zeros(total, np.int64), gi=gi, gt=gt,
                **dict(zip(POOL_FIELDS[-10:], session)))


# ===================================================================================== keys
@njit(cache=True)
def cached_slot(p, key):
    """Slot holding ``key`` (-1 if not cached)."""
    j = KT.find(p.hu, p.hk, key)
    return -1 if j < 0 else p.hs[j]


@njit(cache=True)
def n_children(p, s):
    """Cached blocks whose prefix chain ends in the block of slot ``s``."""
    j = KT.find(p.hu, p.hk, p.si[S_KEY, s])
    return 0 if j < 0 else p.hc[j]


# ===================================================================================== heaps
# (the kernels read each pool array once per call: every attribute read is a refcount)
@njit(cache=True)
def _before(a1, a2, an, asl, b1, b2, bn, bsl):
    """Whether the entry with keys ``(a1, a2, an, asl)`` orders before ``(b1, ...)``."""
    if a1 != b1:
        return a1 < b1
    if a2 != b2:
        return a2 < b2
    if an != bn:
        return an < bn
    return asl < bsl


@njit(cache=True)
def _less(k1, k2, neg, slot, a, b):
    """Whether entry ``a`` of one heap (its rows ``k1, k2, neg, slot``) orders before
    ``b``."""
    return _before(k1[a], k2[a], neg[a], slot[a], k1[b], k2[b], neg[b], slot[b])


@njit(cache=True)
def _swap_rows(k1, k2, neg, slot, stamp, a, b):
    """Swap entries ``a`` and ``b`` of one heap's rows."""
    k1[a], k1[b] = k1[b], k1[a]
    k2[a], k2[b] = k2[b], k2[a]
    neg[a], neg[b] = neg[b], neg[a]
    slot[a], slot[b] = slot[b], slot[a]
    stamp[a], stamp[b] = stamp[b], stamp[a]


@njit(cache=True)
def _sift_up(p, h, i):
    """Move entry ``i`` of heap ``h`` up to its place."""
    k1, k2, neg, slot, stamp = p.hk1[h], p.hk2[h], p.hneg[h], p.hslot[h], p.hstamp[h]
    while i > 0:
        par = (i - 1) >> 1
        if _less(k1, k2, neg, slot, i, par):
            _swap_rows(k1, k2, neg, slot, stamp, i, par)
            i = par
        else:
            break


@njit(cache=True)
def _sift_down(p, h, i):
    """Move entry ``i`` of heap ``h`` down to its place."""
    n = p.hsize[h]
    k1, k2, neg, slot, stamp = p.hk1[h], p.hk2[h], p.hneg[h], p.hslot[h], p.hstamp[h]
    while True:
        le = 2 * i + 1
        if le >= n:
            break
        c = le
        if le + 1 < n and _less(k1, k2, neg, slot, le + 1, le):
            c = le + 1
        if _less(k1, k2, neg, slot, c, i):
            _swap_rows(k1, k2, neg, slot, stamp, c, i)
            i = c
        else:
            break


@njit(cache=True)
def _valid(p, r, pos):
    """Whether entry ``pos`` of row ``r`` (heap ``r`` or the run of heap ``r - Q0``) is
    current: its slot still evictable with the same stamp, and (heap 1, leaf kinds) still
    without a cached child."""
    s = p.hslot[r, pos]
    si = p.si
    if si[S_HASKEY, s] == 0 or si[S_REF, s] != 0 or si[S_STAMP, s] != p.hstamp[r, pos]:
        return False
    if (r == 1 or r == Q0 + 1) and p.ist[P_KIND] != EV_KNAPSACK and n_children(p, s) != 0:
        return False
    return True


@njit(cache=True)
def _put(p, r, pos, k1, k2, neg, s, stamp):
    """Write an entry at position ``pos`` of row ``r`` of the heap arrays."""
    p.hk1[r, pos], p.hk2[r, pos], p.hneg[r, pos] = k1, k2, neg
    p.hslot[r, pos], p.hstamp[r, pos] = s, stamp


@njit(cache=True)
def _move(p, r, dst, src):
    """Copy entry ``src`` of row ``r`` to position ``dst``."""
    _put(p, r, dst, p.hk1[r, src], p.hk2[r, src], p.hneg[r, src], p.hslot[r, src],
         p.hstamp[r, src])


@njit(cache=True)
def _compact(p, h):
    """Drop stale entries and re-heapify (when the heap is full)."""
    n = p.hsize[h]
    m = 0
    for pos in range(n):
        if _valid(p, h, pos):
            _move(p, h, m, pos)
            m += 1
    p.hsize[h] = m
    for i in range(m // 2 - 1, -1, -1):
        _sift_down(p, h, i)


@njit(cache=True)
def _run_compact(p, h):
    """Drop the stale entries of heap ``h``'s sorted run (when its ring is full), in
    order."""
    hs, r, cap = p.hsize, Q0 + h, p.hk1.shape[1]
    head, n = hs[Q0 + h], hs[2 * Q0 + h]
    m = 0
    for k in range(n):
        src = (head + k) % cap
        if _valid(p, r, src):
            _move(p, r, (head + m) % cap, src)  # in ring order, reads lead writes
            m += 1
    hs[2 * Q0 + h] = m


@njit(cache=True)
def _run_append(p, h, k1, k2, neg, s, stamp):
    """Append the entry to heap ``h``'s sorted run if it orders after the run's last
    entry (or the run is empty) and the ring has room; False otherwise."""
    hs, r, cap = p.hsize, Q0 + h, p.hk1.shape[1]
    if hs[2 * Q0 + h] >= cap:
        _run_compact(p, h)
    n = hs[2 * Q0 + h]
    if n >= cap:
        return False
    if n > 0:
        t = (hs[Q0 + h] + n - 1) % cap
        if _before(k1, k2, neg, s, p.hk1[r, t], p.hk2[r, t], p.hneg[r, t], p.hslot[r, t]):
            return False
    _put(p, r, (hs[Q0 + h] + n) % cap, k1, k2, neg, s, stamp)
    hs[2 * Q0 + h] = n + 1
    return True


@njit(cache=True)
def heap_push(p, h, k1, k2, s):
    """Push slot ``s`` on heap ``h`` with keys ``(k1, k2)`` (its depth and stamp now): at
    the end of the heap's sorted run when it orders after its last entry (blocks released
    later by last access: O(1)), else into the binary heap."""
    neg = -p.si[S_DEPTH, s]
    stamp = p.si[S_STAMP, s]
    if _run_append(p, h, k1, k2, neg, s, stamp):
        return
    if p.hsize[h] >= p.hk1.shape[1]:
        _compact(p, h)
    i = p.hsize[h]
    _put(p, h, i, k1, k2, neg, s, stamp)
    p.hsize[h] = i + 1
    _sift_up(p, h, i)


@njit(cache=True)
def _heap_pop(p, h):
    """Drop the entry at the top of the binary heap ``h`` (valid or stale)."""
    n = p.hsize[h] - 1
    _swap_rows(p.hk1[h], p.hk2[h], p.hneg[h], p.hslot[h], p.hstamp[h], np.int64(0), n)
    p.hsize[h] = n
    if n > 0:
        _sift_down(p, h, np.int64(0))


@njit(cache=True)
def heap_top(p, h):
    """Find heap ``h``'s first valid entry, the lower of its binary heap's top and its
    sorted run's head after discarding stale entries: 0 (read it with :func:`top_entry`,
    drop it with :func:`heap_pop`), or -1 when heap ``h`` is empty."""
    hs, r, cap = p.hsize, Q0 + h, p.hk1.shape[1]
    while hs[2 * Q0 + h] > 0 and not _valid(p, r, hs[Q0 + h]):
        hs[Q0 + h] = (hs[Q0 + h] + 1) % cap
        hs[2 * Q0 + h] -= 1
    while hs[h] > 0 and not _valid(p, h, np.int64(0)):
        _heap_pop(p, h)
    if hs[2 * Q0 + h] == 0 and hs[h] == 0:
        return -1
    q = hs[Q0 + h]
    run_first = hs[2 * Q0 + h] > 0 and (hs[h] == 0 or _before(
        p.hk1[r, q], p.hk2[r, q], p.hneg[r, q], p.hslot[r, q],
        p.hk1[h, 0], p.hk2[h, 0], p.hneg[h, 0], p.hslot[h, 0]))
    hs[3 * Q0 + h] = 1 if run_first else 0
    return 0


@njit(cache=True)
def top_entry(p, h):
    """``(k1, -depth, slot)`` of the entry :func:`heap_top` found for heap ``h``."""
    r, pos = (Q0 + h, p.hsize[Q0 + h]) if p.hsize[3 * Q0 + h] else (h, np.int64(0))
    return p.hk1[r, pos], p.hneg[r, pos], p.hslot[r, pos]


@njit(cache=True)
def heap_pop(p, h):
    """Drop the entry :func:`heap_top` found for heap ``h``."""
    hs = p.hsize
    if hs[3 * Q0 + h]:
        hs[Q0 + h] = (hs[Q0 + h] + 1) % p.hk1.shape[1]
        hs[2 * Q0 + h] -= 1
        hs[3 * Q0 + h] = 0
    else:
        _heap_pop(p, h)


# ===================================================================================== keys of an evictor
@njit(cache=True)
def _score(p, s):
    """The first key ``k1`` of evictable slot ``s`` under the pool's evictor kind (the
    module's table; knapsack and lookahead order by last access)."""
    kind = p.ist[P_KIND]
    last = p.sf[F_LAST, s]
    kp = p.kp
    if kind == EV_PREFIX:
        bonus = kp[K_CREDIT] if (p.si[S_DEPTH, s] < kp[K_PROTECT] and p.si[S_HITS, s] > 0) \
            else 0.0
        return last + bonus
    if kind == EV_SESSION:
        return last + min(p.sf[F_GAP, s], kp[K_CREDIT])
    if kind == EV_GDSF:
        value = (1.0 + p.si[S_DEPTH, s] / kp[K_SCALE]) * (p.si[S_HITS, s] + 1.0)
        return last / kp[K_AGE] + value
    if kind == EV_LFU:
        return float(p.si[S_HITS, s])
    return last


@njit(cache=True)
def _hits_bucket(hits):
    """Knapsack count bucket of a block with ``hits`` hits: 0, 1, 2, 3, or 4 for more."""
    return hits if hits < 4 else 4


@njit(cache=True)
def _became_evictable(p, s):
    """Slot ``s`` just turned evictable: push its heap entries."""
    p.ist[P_STAMP] += 1
    p.si[S_STAMP, s] = p.ist[P_STAMP]
    kind = p.ist[P_KIND]
    if kind == EV_EXTERNAL:  # an evictor written in Python chooses from a view
        return
    if kind == EV_GROUPS:
        GR.join(p.gi, p.gt, p.si, s, p.si[S_THREAD, s], p.si[S_WAIT, s], p.sf[F_LAST, s])
        return
    if kind == EV_KNAPSACK:
        h = p.si[S_HITS, s]
        p.ist[P_KNAP + _hits_bucket(h)] += 1
        heap_push(p, h if h < 3 else 3, p.sf[F_LAST, s], 0.0, s)
        return
    k2 = p.sf[F_LAST, s] if kind == EV_LFU else 0.0
    k1 = _score(p, s)
    heap_push(p, np.int64(0), k1, k2, s)
    if (kind == EV_GDSF or kind == EV_RADIX or kind == EV_LFU) and n_children(p, s) == 0:
        heap_push(p, np.int64(1), k1, k2, s)


@njit(cache=True)
def _left_evictable(p, s):
    """Slot ``s`` stops being evictable (acquired or dropped): its entries go stale."""
    if p.si[S_STAMP, s] >= 0 and p.ist[P_KIND] == EV_KNAPSACK:
        p.ist[P_KNAP + _hits_bucket(p.si[S_HITS, s])] -= 1
    elif p.ist[P_KIND] == EV_GROUPS:
        GR.leave(p.gi, p.gt, p.si, s)
    p.si[S_STAMP, s] = -1


@njit(cache=True)
def _became_leaf(p, s):
    """The last cached child of slot ``s`` was dropped."""
    kind = p.ist[P_KIND]
    if (kind == EV_GDSF or kind == EV_RADIX or kind == EV_LFU) and \
            p.si[S_HASKEY, s] and p.si[S_REF, s] == 0:
        k2 = p.sf[F_LAST, s] if kind == EV_LFU else 0.0
        heap_push(p, np.int64(1), _score(p, s), k2, s)


# ===================================================================================== pool ops
@njit(cache=True)
def available(p):
    """Blocks an allocation can get (plain free + evictable)."""
    return p.ist[P_PLAIN] + p.ist[P_EVICTABLE]


@njit(cache=True)
def used(p):
    """Blocks in use (anonymous + hashed used)."""
    return p.ist[P_ANON] + p.ist[P_HASHED]


@njit(cache=True)
def match(p, keys, n_keys, out):
    """Slots of the longest cached leading run of ``keys[:n_keys]`` (written to ``out``);
    returns its length."""
    m = 0
    for k in range(n_keys):
        s = cached_slot(p, keys[k])
        if s < 0:
            break
        out[m] = s
        m += 1
    return m


@njit(cache=True)
def acquire(p, slots, n, now_s, gap_s):
    """Take a reference on the cached blocks ``slots[:n]`` (a prefix hit)."""
    for k in range(n):
        s = slots[k]
        if p.si[S_REF, s] == 0:
            p.ist[P_EVICTABLE] -= 1
            p.ist[P_HASHED] += 1
            _left_evictable(p, s)
        p.si[S_REF, s] += 1
        p.si[S_HITS, s] += 1
        p.sf[F_LAST, s] = now_s
        p.sf[F_GAP, s] = gap_s


@njit(cache=True)
def take_anon(p, n):
    """Take ``n`` plain free blocks as anonymous used blocks (False if too few)."""
    if n > p.ist[P_PLAIN]:
        return False
    p.ist[P_PLAIN] -= n
    p.ist[P_ANON] += n
    return True


@njit(cache=True)
def take_hashed(p, key, depth, now_s, parent_key, gap_s):
    """One plain free block for a full prompt block ``key`` whose chain ends in
    ``parent_key`` (:data:`NOKEY` for a prompt's first block); the slot, or -1 when the
    block stays anonymous (caching off, or the key is cached already)."""
    if p.ist[P_CACHING] == 0 or cached_slot(p, key) >= 0:
        take_anon(p, np.int64(1))
        return -1
    p.ist[P_PLAIN] -= 1
    p.ist[P_HASHED] += 1
    p.ist[P_FSP] -= 1
    s = p.fstack[p.ist[P_FSP]]
    j = KT.get_or_add(p.hu, p.hk, p.hs, p.hc, key)
    p.hs[j] = s
    si, sf = p.si, p.sf
    si[S_KEY, s] = key
    si[S_HASKEY, s] = 1
    si[S_REF, s] = 1
    si[S_HITS, s] = 0
    si[S_DEPTH, s] = depth
    si[S_PKEY, s] = parent_key
    si[S_STAMP, s] = -1
    sf[F_CREATED, s] = now_s
    sf[F_LAST, s] = now_s
    sf[F_GAP, s] = gap_s
    if parent_key != NOKEY:
        jp = KT.get_or_add(p.hu, p.hk, p.hs, p.hc, parent_key)
        p.hc[jp] += 1
    return s


@njit(cache=True)
def _drop(p, s):
    """Slot ``s`` loses its key and returns to the free stack."""
    key = p.si[S_KEY, s]
    pk = p.si[S_PKEY, s]
    _left_evictable(p, s)
    if pk != NOKEY:
        jp = KT.find(p.hu, p.hk, pk)
        p.hc[jp] -= 1
        if p.hc[jp] == 0:
            ps = p.hs[jp]
            if ps >= 0:
                _became_leaf(p, ps)
            KT.drop_if_empty(p.hu, p.hk, p.hs, p.hc, jp)
    j = KT.find(p.hu, p.hk, key)
    p.hs[j] = -1
    KT.drop_if_empty(p.hu, p.hk, p.hs, p.hc, j)
    p.si[S_HASKEY, s] = 0
    p.si[S_PKEY, s] = NOKEY
    p.fstack[p.ist[P_FSP]] = s
    p.ist[P_FSP] += 1


@njit(cache=True)
def release(p, slots, n, n_anon, now_s, thread, wait_kind):
    """Drop one request's references: its hashed ``slots[:n]`` and ``n_anon`` blocks; the
    request's ``thread`` and ``wait_kind`` (-1: none) label the blocks it leaves
    evictable (``EvictorView.thread``, ``wait_kind``)."""
    p.ist[P_ANON] -= n_anon
    p.ist[P_PLAIN] += n_anon
    back = p.ist[P_CACHING] != 0  # deepest first: a release joins the sorted runs in order
    for j in range(n):
        s = slots[n - 1 - j if back else j]
        p.si[S_REF, s] -= 1
        if p.si[S_REF, s] == 0:
            p.ist[P_HASHED] -= 1
            p.sf[F_LAST, s] = now_s
            p.si[S_THREAD, s] = thread
            p.si[S_WAIT, s] = wait_kind
            if p.ist[P_CACHING]:
                p.ist[P_EVICTABLE] += 1
                _became_evictable(p, s)
            else:
                _drop(p, s)
                p.ist[P_PLAIN] += 1


@njit(cache=True)
def evict_one(p, s):
    """Evictable slot ``s`` loses its key and becomes plain free."""
    _drop(p, s)
    p.ist[P_EVICTABLE] -= 1
    p.ist[P_PLAIN] += 1
