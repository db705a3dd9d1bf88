"""Session-aware evictors: the group kernel against its Python twin and LRU, what it learns,
non-anticipation, and the simulator adapters."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt import cache_flow as cf
from lpserve.policies import _evict_kernels as EK
from lpserve.policies import _group_kernels as G
from lpserve.policies.evictors_sessions import (
    SESSION_SPECS,
    SessionEvictorSpec,
    fit_duel_state,
    fit_wait_stats,
    replay_session_hits,
)
from lpserve.testing import check_policy
from lpserve.trace import Trace
from lpserve.trace import generate as g
from lpserve.trace.loaders import bundled_sessions
from lpserve.trace.sessions import compose, split

MODES = [SessionEvictorSpec("group-lru", G.MODE_GLRU), *SESSION_SPECS.values()]
SLOW = pytest.mark.slow
#: the default tier runs ttl-pin (the evictor the targets are checked on); the slow tier
#: runs every mode
def _modes(names):
    return [pytest.param(n, marks=() if n == "ttl-pin" else SLOW) for n in names]


@pytest.fixture(scope="module")
def stream():
    """Twelve bundled sessions on one clock (Poisson starts, one every 30 s on average)."""
    return compose(bundled_sessions().take(np.arange(12)), rate_per_s=1 / 30, seed=0)


@pytest.mark.parametrize("name", _modes([m.name for m in MODES]))
def test_kernel_equals_python_twin(stream, name):
    spec = {m.name: m for m in MODES}[name]
    acc = cf.block_accesses(stream)
    prior = fit_wait_stats(cf.block_accesses(compose(bundled_sessions().take(
        np.arange(12, 43)), rate_per_s=1 / 30, seed=1)))
    for C, sp in ((300, spec), (2500, spec.with_(prior=prior, min_n=3, refit=4))):
        assert np.array_equal(replay_session_hits(acc, C, sp),
                              replay_session_hits(acc, C, sp, reference=True)), (sp.name, C)


def test_group_lru_is_lru_and_no_threads_means_lru(stream):
    moon = lp.bundled_trace("mooncake-conv-5min")  # no session or program ids
    for tr, caps in ((stream, (400, 3000)), (moon, (60, 900))):
        acc = cf.block_accesses(tr)
        for C in caps:
            lru = EK.lru_replay(acc.offsets, acc.key, acc.n_keys, C)
            assert np.array_equal(replay_session_hits(acc, C, MODES[0]), lru)
            if tr is moon:
                for name in ("ttl-pin", "reuse-decay", "return-knapsack"):
                    assert np.array_equal(replay_session_hits(acc, C, SESSION_SPECS[name]),
                                          lru), name


@pytest.mark.parametrize("name", sorted(SESSION_SPECS))
def test_replay_does_not_anticipate(stream, name):
    """Hits of the first k requests do not change when the later requests are removed."""
    full = replay_session_hits(cf.block_accesses(stream), 800, SESSION_SPECS[name])
    for k in (60, 150, 240):
        part = replay_session_hits(cf.block_accesses(stream.head(k)), 800,
                                   SESSION_SPECS[name])
        assert np.array_equal(full[:k], part), k


def test_ttl_pin_beats_lru_when_sessions_compete(stream):
    """Warm-started on the other 31 bundled sessions, ttl-pin keeps the sessions that are
    in a tool loop where LRU lets every session push the others out; its duel, started
    from the state it reached on those sessions at the same load and capacity, follows
    ttl-pin from the first request (67 requests are too few to switch on evidence)."""
    acc = cf.block_accesses(compose(bundled_sessions().take(np.arange(12)), rate_per_s=1 / 4,
                                    seed=0))
    other = bundled_sessions().take(np.arange(12, 43))
    prior = fit_wait_stats(cf.block_accesses(compose(other, rate_per_s=1 / 30, seed=1)))
    fit_acc = cf.block_accesses(compose(other, rate_per_s=1 / 4, seed=1))
    for C in (1500, 3000):
        lru = EK.lru_replay(acc.offsets, acc.key, acc.n_keys, C).sum()
        sp = SESSION_SPECS["ttl-pin"].with_(prior=prior, min_n=5)
        pure = replay_session_hits(acc, C, sp.with_(duel_alpha=0.0))
        assert pure.sum() > 1.2 * lru
        cold = replay_session_hits(acc, C, sp)
        assert np.array_equal(cold, EK.lru_replay(acc.offsets, acc.key, acc.n_keys, C))
        start = fit_duel_state(fit_acc, C, sp)
        assert start[0] == 1.0  # ttl-pin led the duel on the other sessions
        assert np.array_equal(replay_session_hits(acc, C, sp.with_(duel_start=start)), pure)


def test_duel_parameters_are_checked_and_its_state_carried_over(stream):
    base = SESSION_SPECS["ttl-pin"]
    for bad in ({"duel_alpha": -1.0}, {"duel_alpha": float("nan")}, {"duel_alpha": 1.5}, {"duel_scale": 0.0}, {"duel_start": (2, 0.0, 0.0)},
                {"duel_start": (1, 0.0, -1.0)}, {"duel_start": (0, float("inf"), 0.0)},
                {"duel_start": (1, 0.0)}):
        with pytest.raises(ValueError, match="duel_"):
            base.with_(**bad)
    with pytest.raises(ValueError, match="runs no duel"):
        fit_duel_state(cf.block_accesses(stream), 500, base.with_(duel_alpha=0.0))
    acc = cf.block_accesses(stream)
    sp = base.with_(min_n=1, refit=1, duel_alpha=1.0, duel_scale=100.0)
    d = np.zeros((acc.n_requests, 4), np.int64)
    replay_session_hits(acc, 500, sp, diag=d)
    sw = np.flatnonzero(d[:, 3] >= 0)
    assert sw.size >= 1
    lead, D, V = fit_duel_state(acc, 500, sp)
    x = (d[sw[-1] + 1:, 1] - d[sw[-1] + 1:, 0]) * (-1 if d[-1, 2] else 1)
    assert (lead, D, V) == (float(d[-1, 2]), float(x.sum()), float((x * x).sum()))
    with pytest.raises(ValueError, match="diag must be int64"):
        replay_session_hits(acc, 500, sp, diag=np.zeros((3, 4), np.int64))


def test_adapter_evicts_first_what_the_leading_shadow_dropped():
    """The simulator's duel (4c): of two idle blocks in LRU order, the one the leading (LRU)
    shadow still holds stays, the one it dropped goes first, though it is more recent."""
    from lpserve.policies.evictors_sessions import SessionEvictor
    from lpserve.policy import EvictorView, RequestEvent

    ev = SessionEvictor(SESSION_SPECS["ttl-pin"])
    assert ev.reads_keys and not SessionEvictor(SESSION_SPECS["ttl-pin"].with_(
        duel_alpha=0.0)).reads_keys
    for t, keys in ((0.0, ("a",)), (1.0, ("b",)), (2.0, ("c",))):  # shadows of 2 blocks
        ev.observe(RequestEvent("finish", t, 0, int(t), int(t), 0, 64, 64, 64, 2, keys))
    f = lambda *x: np.asarray(x, np.float64)
    view = EvictorView(now_s=3.0, replica=0, block=np.array([0, 1]),
                       last_access_s=f(0.5, 0.2), hits=np.zeros(2, np.int64),
                       depth=np.zeros(2, np.int64), created_s=f(0.0, 0.0),
                       thread=np.array([5, 6]), wait_kind=np.array([0, 0]), block_tokens=64)
    assert ev.evict(view, 1).tolist() == [1]  # no keys: LRU order
    keyed = EvictorView(**{**view.__dict__, "key": ("a", "b")})
    assert ev.evict(keyed, 1).tolist() == [0]  # "a" was dropped by the LRU shadow


def test_wait_statistics_and_fits_by_hand():
    K, J, B = G.N_CLASSES, G.TTL_GRID_S.size, G.AGE_EDGES_S.size - 1
    H, O, R, X, NE = (np.zeros((K, J)), np.zeros((K, J)), np.zeros((K, B)), np.zeros((K, B)),
                      np.zeros((K, 3)))
    for gap in (12.0, 12.0, 25.0, np.inf):  # three returns and one no-return, 10 blocks each
        G.record_wait(H, O, R, X, NE, 1, gap, 10.0, 3600.0, G.AGE_EDGES_S, G.TTL_GRID_S)
    j15, j30 = list(G.TTL_GRID_S).index(15.0), list(G.TTL_GRID_S).index(30.0)
    assert H[1, j15] == 20 and O[1, j15] == 10 * (12 + 12 + 15 + 15)
    assert H[1, j30] == 30 and O[1, j30] == 10 * (12 + 12 + 25 + 30)
    assert NE[1].tolist() == [4.0, 3.0, 49.0]
    tau, dens = G.fit_ttl(H, O, 1.0, NE, G.TTL_GRID_S)
    best = np.argmax(np.where(O[1] > 0, H[1] / np.maximum(O[1], 1e-12), 0))
    assert tau[1] == G.TTL_GRID_S[best] and tau[0] == tau[2] == 0.0
    assert dens[1] == pytest.approx(H[1, best] / O[1, best])
    # the exponential reuse score decays with idle time
    s = [G.decay_score(NE, 1, a, 60.0, 1.0) for a in (0.0, 10.0, 100.0, 1000.0)]
    assert all(x > y for x, y in zip(s, s[1:]))
    p, th = 4 / 6, 4 / (49 + G.PRIOR_GAP_S)
    assert s[0] == pytest.approx(p * (1 - np.exp(-th * 60.0)))
    assert G.predicted_gap(NE, np.zeros((1, K)), -1, 1) == pytest.approx(49 / 3)


def _session_instance(seed=3, kv_fraction=0.2):
    """Generated chat sessions with wait kinds: tool calls inside a session, a user turn
    after its last request."""
    tr = g.sessions(30, session_arrivals=g.Poisson(1.0), turns=g.Uniform(3, 8),
                    first_prompt=g.Uniform(300, 1500), turn_prompt=g.Uniform(20, 200),
                    output=g.Uniform(10, 80), think_time_s=4.0, block_tokens=16, seed=seed)
    sid = np.asarray(tr.session_id)
    last = np.r_[sid[1:] != sid[:-1], True]
    last = np.array([i == np.flatnonzero(sid == sid[i]).max() for i in range(tr.n)])
    wk = np.where(last, 1, 0)
    t = Trace.from_arrays(arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                          output_tokens=tr.output_tokens, block_ids=tr.block_lists(),
                          block_tokens=16, session_id=sid, wait_kind=wk, name="chat-waits")
    return lp.Instance(trace=t, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                   gpu_memory_fraction=kv_fraction))


@pytest.mark.parametrize("name", _modes(sorted(SESSION_SPECS)))
def test_adapters_run_in_the_simulator(name):
    inst = _session_instance()
    pol = lp.make_policy(f"vllm-chunked+{name}", min_n=3, refit=4)
    res = lp.simulate(inst, pol, seed=1, check=True)
    assert np.all(res.arrays["status"] == "finished")
    assert res.summary()["prefix_hit_rate"] > 0.05
    assert pol.evictor._st.NE[:, 0].sum() > 0  # it learned from ended waits


@pytest.mark.parametrize("names", [pytest.param(("ttl-pin",)), pytest.param(
    ("reuse-decay", "return-knapsack"), marks=SLOW)])
def test_adapters_without_threads_match_lru_in_the_simulator(names):
    inst = _session_instance()
    tr = inst.trace
    bare = Trace.from_arrays(arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                             output_tokens=tr.output_tokens, block_ids=tr.block_lists(),
                             block_tokens=16)
    inst = inst.with_(trace=bare)
    ref = lp.simulate(inst, lp.make_policy("vllm-chunked", evictor="lru"), seed=1).arrays
    for name in names:
        got = lp.simulate(inst, lp.make_policy(f"vllm-chunked+{name}"), seed=1).arrays
        for k in ("first_token_s", "finish_s", "cached_prompt_tokens"):
            assert np.array_equal(got[k], ref[k], equal_nan=True), (name, k)


@pytest.mark.parametrize("name", _modes(["ttl-pin", "return-knapsack", "reuse-decay",
                                          "tail-lru"]))
def test_conformance_on_sessions_with_wait_kinds(name):
    """The public suite (non-anticipation included) on instances that carry threads and wait
    kinds, so the learned parts are exercised."""
    insts = {"loaded": _session_instance(3, 0.2), "light": _session_instance(4, 0.9)}
    make = lambda: lp.make_policy(f"vllm-chunked+{name}", min_n=3, refit=4)
    rep = check_policy(make(), make=make, instances=insts)
    assert rep["checks"]["non-anticipation"] == "ok"


def test_split_and_prior_from_held_apart_sessions():
    fit, held = split(bundled_sessions(), 0.5, seed=0)
    prior = fit_wait_stats(cf.block_accesses(compose(fit, rate_per_s=1 / 30, seed=0)))
    assert prior.n_waits.sum() > 50
    acc = cf.block_accesses(compose(held, rate_per_s=1 / 30, seed=1))
    sp = SESSION_SPECS["ttl-pin"].with_(prior=prior)
    h = replay_session_hits(acc, 1000, sp)
    assert np.array_equal(h, replay_session_hits(acc, 1000, sp))  # the prior is not consumed


def test_belady_prefix_kernel_equals_offline_belady(stream):
    from lpserve.evaluate.cache import replay_accesses
    from lpserve.policies.evictors_kv import OFFLINE_SPECS

    for tr in (stream.head(80), lp.bundled_trace("mooncake-conv-5min").head(300)):
        acc = cf.block_accesses(tr)
        for C in (300, 2000):
            ref = cf.belady(acc, C, tie="deep")
            args = (acc.offsets, acc.key, acc.parent, acc.depth, acc.value_s,
                    acc.next_request(), np.zeros(acc.n_requests, bool), acc.arrival_s,
                    acc.n_keys, C, OFFLINE_SPECS["belady-prefix"].mode, False,
                    OFFLINE_SPECS["belady-prefix"].params())
            assert np.array_equal(EK.heap_replay(*args), ref)
            assert np.array_equal(EK.heap_replay_ref(*args), ref)
            assert replay_accesses(acc, C, "belady-prefix").hits == int(ref.sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_rows_numbers_groups_as_numpy_unique(seed):
    """The evictor adapters group blocks by (thread, last access, wait class) with
    ``group_rows``; its numbering must be ``np.unique(axis=1)``'s, which the adapters'
    tie order (and so their results) was defined with."""
    from lpserve.arrays import group_rows

    rng = np.random.default_rng(seed)
    n = 500
    th = rng.integers(-1, 6, n)
    t = rng.choice(np.array([0.0, 0.5, 1.25, 7.0, 1e6]), n)
    cls = rng.integers(0, 3, n)
    first, gid = group_rows(th, t.view(np.int64), cls)
    _, f_np, g_np = np.unique(np.stack([th, t.view(np.int64), cls]), axis=1,
                              return_index=True, return_inverse=True)
    assert np.array_equal(first, f_np) and np.array_equal(gid, g_np.reshape(-1))
    assert group_rows(np.zeros(0, np.int64))[0].size == 0


@pytest.mark.parametrize("mode", [G.MODE_GLRU, G.MODE_TTL, G.MODE_DECAY, G.MODE_TAIL,
                                  G.MODE_INDEX])
def test_group_keys_kernel_equals_twin_and_scalar_key(mode):
    """``group_keys`` (the simulator adapters' vectorized keys) gives ``group_key``'s
    primary and secondary key of every group, compiled and interpreted alike."""
    rng = np.random.default_rng(mode)
    n = 40
    cls = rng.integers(0, G.N_CLASSES, n)
    t_g = rng.uniform(0.0, 100.0, n)
    expiry = t_g + rng.uniform(-5.0, 30.0, n)
    value = rng.uniform(0.0, 200.0, n)
    NE = rng.uniform(1.0, 5.0, (G.N_CLASSES, 3))
    B = G.AGE_EDGES_S.shape[0] - 1
    pi = rng.uniform(0.1, 1.0, (G.N_CLASSES, B))
    mu = rng.uniform(0.5, 2.0, (G.N_CLASSES, B))
    params = SessionEvictorSpec("x", mode).params(16)
    args = (mode, cls, t_g, 80.0, expiry, value, NE, pi, mu, G.AGE_EDGES_S, params)
    prim, sec = G.group_keys(*args)
    prim_py, sec_py = G.group_keys.py_func(*args)
    assert np.array_equal(prim, prim_py) and np.array_equal(sec, sec_py)
    for k in range(n):
        p, s, _ = G.group_key(mode, cls[k], t_g[k], 80.0, expiry[k], 0, 0, value[k], NE, pi,
                              mu, G.AGE_EDGES_S, params)
        assert (prim[k], sec[k]) == (p, s)


def test_the_packed_selection_is_the_stable_lexsort():
    """The evictors take their blocks through one packed int64 key and a partition; the
    first k rows must be those of the stable lexsort by (kept, before, group rank, deepest
    first), ties included (equal depths in one group), for every k."""
    from lpserve.policies.evictors_sessions import _smallest

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 60))
        late = rng.random(n) < 0.3
        before = rng.random(n) < 0.5
        grank = rng.integers(0, 4, n)
        depth = rng.integers(0, 5, n)
        want = np.lexsort((-depth, grank, before, late))
        for k in (0, 1, 3, n // 2, n, n + 2):
            got = _smallest(k, late, before, grank, depth)
            assert got.dtype == np.int64 and np.array_equal(got, want[:k])
    wide = np.arange(5, dtype=np.int64) * (1 << 17)  # depths past the packed key: lexsort
    z = np.zeros(5, bool)
    assert np.array_equal(_smallest(2, z, z, np.zeros(5, np.int64), wide), [4, 3])
