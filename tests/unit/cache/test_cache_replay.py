"""Replay kernels, evictor specs, bounds and bad input on fixtures and the bundled trace."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import lpserve as lp
from lpserve.evaluate.cache import cache_replay, policy_names, replay_accesses
from lpserve.opt import cache_flow as cf
from lpserve.opt import kv_knapsack as kk
from lpserve.policies import _evict_kernels as K
from lpserve.policies.evictors_kv import EVICTORS, SPECS, make_evictor
from lpserve.policy import EvictorView
from lpserve.trace import Trace, TraceError


@pytest.fixture(scope="module")
def bundled():
    return lp.bundled_trace("mooncake-conv-5min")


def _args(acc, C, s):
    ok = np.diff(acc.offsets) > 0
    partial = np.zeros(acc.n_requests, bool)
    partial[ok] = acc.tokens[acc.offsets[1:][ok] - 1] < acc.block_tokens
    return (acc.offsets, acc.key, acc.parent, acc.depth, acc.value_s, acc.next_request(),
            partial, acc.arrival_s, acc.n_keys, C, s.mode, s.leaves_only, s.params())


def test_kernels_equal_python_twins(bundled):
    acc = cf.block_accesses(bundled)
    for C in (50, 700):
        assert np.array_equal(K.lru_replay(acc.offsets, acc.key, acc.n_keys, C),
                              K.lru_replay_ref(acc.offsets, acc.key, acc.n_keys, C))
        for name in [*SPECS, "belady"]:
            from lpserve.policies.evictors_kv import KVEvictorSpec, spec
            s = spec(name)
            if not isinstance(s, KVEvictorSpec):  # session-aware: tests/unit/cache/test_sessions
                continue
            assert np.array_equal(K.heap_replay(*_args(acc, C, s)),
                                  K.heap_replay_ref(*_args(acc, C, s))), name


def test_belady_kernel_equals_offline_belady(bundled):
    acc = cf.block_accesses(bundled)
    for C in (30, 400):
        assert replay_accesses(acc, C, "belady").hits == int(cf.belady(acc, C).sum())


def test_ordering_on_bundled_trace(bundled):
    acc = cf.block_accesses(bundled)
    C = 800
    r = {p: replay_accesses(acc, C, p).hit_rate for p in policy_names()}
    assert r["infinite"] == pytest.approx(lp.trace.infinite_cache_hit_rate(bundled))
    for p in ["lru", *SPECS, "belady", "belady-prefix", "lp-rounded"]:
        assert r[p] <= r["lp"] + 1e-9, p
    assert r["lp"] <= r["infinite"] + 1e-9
    assert r["knapsack"] >= r["lru"]


def test_lp_certifies_and_matches_milp_on_small_trace(bundled):
    tr = bundled.head(60)
    m = cf.build(tr, 40)
    sol = cf.solve(m)
    res = cf.certify(m, sol)
    assert res["capacity"] <= 1e-6 and res["balance"] <= 1e-6 and res["precedence"] <= 1e-6
    assert res["rounded_vs_lp"] <= 1e-6
    ilp = cf.solve(m, integer=True)
    assert sol.info["value_rounded"] <= ilp.info["value_rounded"] + 1e-9
    assert ilp.info["value_rounded"] <= sol.info["value_lp"] + 1e-6
    mask = cf.export(sol, m.acc)
    assert mask.sum() == sol.primal["hits"].sum()


def test_foo_networkx_equals_highs_and_bounds():
    rng = np.random.default_rng(3)
    T = 60
    obj = rng.integers(0, 8, T)
    size = rng.integers(1, 4, T).astype(float)
    size = np.array([{o: s for o, s in zip(obj, size)}[o] for o in obj])  # size per object
    cost = size.copy()  # byte-miss cost: integer weights, so networkx is exact
    a = cf.foo(np.arange(T), obj, size, cost, 5, backend="networkx")
    b = cf.foo(np.arange(T), obj, size, cost, 5, backend="highs")
    assert a.bound == pytest.approx(b.bound, abs=1e-6)
    assert a.bound <= a.objective + 1e-9 and b.bound <= b.objective + 1e-9


def test_recompute_values_grow_with_depth():
    cost = lp.cost_model()
    offs = np.array([0, 40])
    v = cf.recompute_values_s(np.array([40 * 512]), offs, 512, cost)
    assert np.all(np.diff(v[1:]) > 0)
    tr = lp.bundled_trace("mooncake-conv-5min").head(100)
    r = cache_replay(tr, 200, "gdsf", cost=cost)
    assert r.recompute_s_saved >= 0 and np.isfinite(r.recompute_s_saved)


def test_bad_input():
    tr = Trace.from_arrays(arrival_s=[0.0, 1.0], prompt_tokens=[10, 10], output_tokens=[1, 1])
    with pytest.raises(TraceError, match="no prefix block ids"):
        cache_replay(tr, 10)
    ok = Trace.from_arrays(arrival_s=[0.0, 1.0], prompt_tokens=[20, 20], output_tokens=[1, 1],
                           block_ids=[[1, 2], [1, 2]], block_tokens=16)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="capacity_blocks"):
            cache_replay(ok, bad)
    chain = Trace.from_arrays(arrival_s=[0.0, 1.0, 2.0], prompt_tokens=[20, 20, 20],
                              output_tokens=[1, 1, 1], block_ids=[[1, 2], [3, 4], [5, 2]],
                              block_tokens=16)
    with pytest.raises(cf.ChainError, match="request 2"):
        cache_replay(chain, 4)
    with pytest.raises(KeyError, match="unknown cache policy"):
        cache_replay(ok, 4, "nope")


def _brute_knapsack(par, val, W):
    best = 0.0
    for ys in itertools.product([0, 1], repeat=len(par)):
        if sum(ys) > W or any(ys[i] and par[i] >= 0 and not ys[par[i]] for i in range(len(par))):
            continue
        best = max(best, sum(v for v, y in zip(val, ys) if y))
    return best


def test_knapsack_dp_equals_brute_force_and_lp_bounds_it():
    rng = np.random.default_rng(0)
    for _ in range(40):
        m = int(rng.integers(1, 9))
        par = np.array([-1 if i == 0 or rng.random() < 0.3 else int(rng.integers(0, i))
                        for i in range(m)])
        val = rng.random(m) * 3
        W = int(rng.integers(0, m + 1))
        opt, kept = kk.knapsack_dp(par, val, W)
        assert opt == pytest.approx(_brute_knapsack(par, val, W))
        assert kept.sum() <= W and val[kept].sum() == pytest.approx(opt)
        sol = kk.knapsack_lp(par, val, W)
        assert sol.info["value_lp"] >= opt - 1e-7 >= sol.info["value_rounded"] - 1e-6


def _view(**kw):
    # two chains: 0 <- 1 <- 2 and 3 <- 4, plus 5 whose cached child is in use
    base = dict(now_s=10.0, replica=0, block=np.arange(6), last_access_s=np.arange(6.0),
                hits=np.array([0, 5, 0, 1, 2, 0]), depth=np.array([0, 1, 2, 0, 1, 3]),
                created_s=np.zeros(6), children=np.array([1, 1, 0, 1, 0, 1]),
                parent=np.array([-1, 0, 1, -1, 3, -1]), turn_gap_s=np.zeros(6),
                queued=np.zeros(6, bool))
    base.update(kw)
    return EvictorView(**base)


def test_simulator_adapters_choose_distinct_positions():
    v = _view()
    for name, factory in EVICTORS.items():
        ev = factory()
        out = ev.evict(v, 3)
        assert out.dtype == np.int64 and len(set(out.tolist())) == 3, name
        assert len(set(ev.evict(v, 6).tolist())) == 6, name
    assert EVICTORS["kv-lru"]().evict(v, 2).tolist() == [0, 1]


def test_radix_lru_evicts_leaves_only_and_exposes_parents():
    v = _view()
    ev = make_evictor("radix-lru")
    # leaves are 2 (t=2) and 4 (t=4); evicting 2 makes 1 a leaf (t=1), then 0
    assert ev.evict(v, 3).tolist() == [2, 1, 0]
    # 5 is pinned by a child in use: chosen only once everything else is gone
    assert ev.evict(v, 6).tolist()[-1] == 5
    with pytest.raises(ValueError, match="children/parent"):
        ev.evict(_view(children=None), 1)


def test_session_and_lookahead_adapters():
    gap = np.array([100.0, 0, 0, 0, 0, 0])
    # block 0 (last touched at t=0 by a returning session, gap 100 s) is kept
    assert make_evictor("session", credit_s=50).evict(_view(turn_gap_s=gap), 5).tolist() == \
        [1, 2, 3, 4, 5]
    # the credit is capped at credit_s: 0 + 3 ties block 3 (t=3)
    assert make_evictor("session", credit_s=3).evict(_view(turn_gap_s=gap), 5).tolist() == \
        [1, 2, 0, 3, 4]
    q = np.array([True, False, False, False, False, False])
    assert make_evictor("lookahead").evict(_view(queued=q), 5).tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(KeyError, match="unknown evictor 'nope'"):
        make_evictor("nope")
    with pytest.raises(ValueError, match="credit_s"):
        make_evictor("session", credit_s=-1)
