"""The compiled KV pool (lpserve/sim/_pool.py) against its plain-Python model: the block
manager of tests/oracles/blocks.py with the built-in evictors, on random operation
sequences: the same slots, counts, keys and eviction order."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.policies.evictors_kv import make_evictor
from lpserve.policy import LRU
from lpserve.sim import _evict_kernels as E
from lpserve.sim import _pool as P
from tests.oracles.blocks import BlockManager, choose_evictions

KINDS = {"lru": None, "kv-lru": "lru", "prefix-lru": "prefix-lru", "session": "session",
         "gdsf": "gdsf", "radix-lru": "radix-lru", "lfu": "lfu", "knapsack": "knapsack",
         "lookahead": "lookahead"}


def _evictor(name):
    return LRU() if name == "lru" else make_evictor(KINDS[name])


def _params(ev):
    p = getattr(ev, "params", {}) or {}
    return (float(p.get("credit_s", 0.0)), float(p.get("protect_depth", 0.0)),
            float(p.get("age_s", 1.0)), float(p.get("depth_scale", 1.0)))


def _run(name, seed, total, steps):
    rng = np.random.default_rng(seed)
    ev = _evictor(name)
    kind = P.EVICTOR_KINDS["lru" if name == "kv-lru" else name]
    bm = BlockManager(total, 16, True)
    arrs = P.new_pool_arrays(total, True, kind, _params(ev))
    pool = P.pool_struct(arrs)
    # a few prompt trees: request r's chain of keys is a path in a random tree
    holders: list[tuple[list[int], int]] = []   # (hashed slots, anon) per live request
    now = 0.0
    evicted_py, evicted_nb = [], []
    out = np.empty(64, np.int64)
    for _ in range(steps):
        now += float(rng.integers(0, 3))  # equal times on purpose
        op = rng.random()
        if op < 0.5:  # a request: match a chain, acquire hits, allocate the rest
            root = int(rng.integers(0, 4))
            length = int(rng.integers(1, 9))
            branch = int(rng.integers(0, 3))
            keys = [int(P.mix64(root * 1000 + (k if k < 3 else 100 * branch + k)))
                    for k in range(length)]
            hits = bm.match(keys)
            m = P.match(pool, np.asarray(keys, np.int64), len(keys), out)
            assert hits == out[:m].tolist()
            need = length - len(hits)
            n_hit_free = int(np.sum(bm.ref[hits] == 0)) if hits else 0
            anon = int(rng.integers(0, 3))
            if bm.available - n_hit_free < need + anon:
                continue
            gap = float(rng.integers(0, 5))
            bm.acquire(hits, now, gap)
            P.acquire(pool, np.asarray(hits, np.int64), len(hits), now, gap)
            want = need + anon
            if bm.plain_free < want:  # make room
                k = min(bm.evictable, max(want - bm.plain_free, 4))
                queued = np.asarray(hits[:1], np.int64)
                sl = choose_evictions(bm, ev, k, now_s=now, replica=0,
                                      queued=queued if ev.reads_queue else None, who="t")
                bm.evict(sl)
                evicted_py.extend(sl)
                before = arrs.fstack.copy(), int(arrs.ist[P.P_FSP])
                E.evict(pool, k, queued, queued.size)
                fsp = int(arrs.ist[P.P_FSP])
                evicted_nb.extend(arrs.fstack[before[1]:fsp].tolist())
            slots = list(hits)
            bm.take_anon(anon)
            assert P.take_anon(pool, anon)
            for j in range(len(hits), length):
                s1 = bm.take_hashed(keys[j], j, now, keys[j - 1] if j else None, gap)
                s2 = P.take_hashed(pool, keys[j], j, now, keys[j - 1] if j else P.NOKEY, gap)
                assert s1 == s2
                if s1 < 0:  # already cached: taken as an anonymous block
                    anon += 1
                else:
                    slots.append(s1)
            holders.append((slots, anon))
        elif holders:  # a request leaves
            k = int(rng.integers(0, len(holders)))
            slots, anon = holders.pop(k)
            bm.release(slots, anon, now)
            P.release(pool, np.asarray(slots, np.int64), len(slots), anon, now, -1, -1)
        bm.check()
        ist = arrs.ist
        assert (bm.plain_free, bm.anon_used, bm.hashed_used, bm.evictable) == (
            ist[P.P_PLAIN], ist[P.P_ANON], ist[P.P_HASHED], ist[P.P_EVICTABLE])
        assert evicted_py == evicted_nb
        assert np.array_equal(bm.ref, arrs.si[P.S_REF])
        assert np.array_equal(bm.has_key, arrs.si[P.S_HASKEY] == 1)
        keyed = np.flatnonzero(bm.has_key)
        assert np.array_equal(bm.n_children[keyed],
                              [P.n_children(pool, s) for s in keyed.tolist()])
    return len(evicted_py)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_pool_matches_block_manager_and_evictor(name):
    n = sum(_run(name, seed, total, 300) for seed, total in ((1, 12), (2, 24), (3, 40)))
    assert n > 20  # the sequences do evict


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), total=st.integers(4, 48),
       name=st.sampled_from(sorted(KINDS)))
def test_pool_twin_on_random_sequences(seed, total, name):
    _run(name, seed, total, 150)


@pytest.mark.parametrize("name", ["lru", "radix-lru", "knapsack", "lookahead"])
def test_sorted_runs_wrap_and_compact(name):
    """A small pool over a long sequence: each heap's sorted run (the ring beside the
    binary heap) wraps around its array many times and is compacted when stale entries
    fill it; the eviction order stays the block manager's."""
    assert _run(name, 5, 6, 3000) > 100
