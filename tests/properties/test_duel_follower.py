"""The ttl-pin duel's real cache follows its leader (proofs/kv-duel-follower.md): on random
session traces, with duel thresholds low enough to switch often,

* before the first switch the real cache hits exactly what LRU hits (lemma 2);
* between two switches, at most ``E_s`` requests (the blocks the new leader held and the
  real cache did not) hit less in the real cache than in the leader, each by at most the
  leader's hit (lemma 3), so the real cache's hits are at least the leaders' minus
  ``sum_s E_s * m`` (theorem);
* the real cache always finds enough blocks to evict (lemma 1: the kernel raises otherwise);
* no online evictor that ever holds other blocks than LRU never loses to it
  (proposition 4): the construction of the proof, run on ttl-pin.
"""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.opt import cache_flow as cf
from lpserve.policies import _evict_kernels as EK
from lpserve.policies.evictors_sessions import SESSION_SPECS, replay_session_hits
from lpserve.trace import Trace
from tests.properties.test_session_bounds import session_traces

SPEC = SESSION_SPECS["ttl-pin"].with_(min_n=1, refit=1)


def _check_follower(acc, C, z):
    d = np.zeros((acc.n_requests, 5), np.int64)
    real = replay_session_hits(acc, C, SPEC.with_(duel_alpha=z, duel_scale=100.0), diag=d)
    gap = d[:, 4]  # blocks the leader holds and the real cache does not, after each request
    lru = EK.lru_replay(acc.offsets, acc.key, acc.n_keys, C)
    assert np.array_equal(d[:, 0], lru)  # the LRU shadow is LRU
    sw = np.flatnonzero(d[:, 3] >= 0)
    first = int(sw[0]) if sw.size else acc.n_requests
    lead_hits = np.where(np.r_[0, d[:-1, 2]].astype(bool), d[:, 1], d[:, 0])
    assert np.array_equal(real[:first + 1], lru[:first + 1])  # lemma 2
    assert np.all(gap[:first] == 0)
    agree = np.flatnonzero(gap[:-1] == 0) + 1  # equal sets before r: equal hits at r
    assert np.array_equal(real[agree], lead_hits[agree]) if agree.size else True
    m = int(np.diff(acc.offsets).max(initial=0))
    bound = 0
    for k, s in enumerate(sw):
        end = int(sw[k + 1]) if k + 1 < sw.size else acc.n_requests - 1
        per = slice(int(s) + 1, end + 1)
        short = lead_hits[per] - real[per]
        E = int(d[s, 3])
        assert E == gap[s]
        assert np.all(np.diff(gap[s:end]) <= 0), s  # lemma 3: never grows between switches
        assert np.sum(short > 0) <= E, (s, E)  # lemma 3
        assert np.all(short <= lead_hits[per])
        bound += E * m
    assert real.sum() >= lead_hits.sum() - bound  # theorem
    assert np.array_equal(real, replay_session_hits(acc, C, SPEC.with_(duel_alpha=z, duel_scale=100.0),
                                                    reference=True))  # the twin agrees
    return sw.size


@settings(max_examples=60, deadline=None)
@given(session_traces(max_sessions=4, max_turns=6), st.integers(2, 10),
       st.sampled_from([1.0, 0.5, 0.05]))
def test_real_cache_follows_its_leader(tr, C, z):
    _check_follower(cf.block_accesses(tr), C, z)


def test_follower_on_composed_sessions_switches_and_keeps_its_bounds():
    """The bundled sessions on one clock, with a boundary loose enough (level 1, a scale of
    100 capacities) that the leader changes several times."""
    from lpserve.trace.loaders import bundled_sessions
    from lpserve.trace.sessions import compose

    acc = cf.block_accesses(compose(bundled_sessions(), rate_per_s=1 / 8, seed=0))
    assert _check_follower(acc, 4000, 1.0) >= 3


def _unit_trace(blocks, sids, times, wks) -> Trace:
    """Requests of one block each (every block its own chain root: classic paging)."""
    return Trace.from_arrays(arrival_s=np.asarray(times, float),
                             prompt_tokens=np.full(len(blocks), 16),
                             output_tokens=np.ones(len(blocks), int),
                             block_ids=[[int(b)] for b in blocks], block_tokens=16,
                             session_id=np.asarray(sids), wait_kind=np.asarray(wks))


def _held(blocks, sids, times, wks, C, spec, alphabet):
    """Blocks each cache holds after the requests: a probe request of block ``b`` one
    second later hits iff ``b`` is held (hits never depend on later requests)."""
    out = {"lru": set(), "ttl": set()}
    for b in alphabet:
        acc = cf.block_accesses(_unit_trace([*blocks, b], [*sids, 10_000],
                                            [*times, times[-1] + 1.0], [*wks, -1]))
        if EK.lru_replay(acc.offsets, acc.key, acc.n_keys, C)[-1]:
            out["lru"].add(b)
        if replay_session_hits(acc, C, spec)[-1]:
            out["ttl"].add(b)
    return out["lru"], out["ttl"]


def test_an_evictor_that_deviates_from_lru_loses_on_an_extension():
    """Proposition 4's construction on unit-block requests: after the first request at
    which duel-free ttl-pin holds other blocks than LRU (their hits were equal until then),
    one more request of a block LRU holds and ttl-pin does not makes ttl-pin lose."""
    spec = SPEC.with_(duel_alpha=0.0)
    applied = 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        n, C, alphabet = 30, 3, list(range(7))
        blocks = rng.integers(0, len(alphabet), n).tolist()
        sids = rng.integers(0, 3, n).tolist()
        times = np.cumsum(rng.choice([1.0, 4.0, 30.0], n)).tolist()
        wks = rng.choice([0, 1], n).tolist()
        for k in range(1, n + 1):
            lru_set, ttl_set = _held(blocks[:k], sids[:k], times[:k], wks[:k], C, spec,
                                     alphabet)
            if lru_set != ttl_set:
                break
        else:
            continue
        applied += 1
        b = sorted(lru_set - ttl_set)[0]
        acc = cf.block_accesses(_unit_trace([*blocks[:k], b], [*sids[:k], 10_000],
                                            [*times[:k], times[k - 1] + 1.0],
                                            [*wks[:k], -1]))
        lru = EK.lru_replay(acc.offsets, acc.key, acc.n_keys, C)
        ttl = replay_session_hits(acc, C, spec)
        assert np.array_equal(lru[:k], ttl[:k]), seed  # equal caches, equal hits
        assert ttl.sum() == lru.sum() - 1, seed
    assert applied >= 5, applied


def test_duel_boundary_is_crossed_at_most_alpha_of_the_time_without_a_leader():
    """Eq. (4b) under its null (per-request differences symmetric: neither shadow leads):
    over 4,000 looks, the share of runs whose evidence ever crosses the boundary stays below
    its level. A fixed threshold (the boundary without its mixture term) is crossed more
    often the longer one looks (law of the iterated logarithm)."""
    import math

    from lpserve.policies import _group_kernels as G

    rng = np.random.default_rng(0)
    runs, n, alpha = 3000, 4000, 0.2
    for y in (1.0, 1e4):
        w = rng.lognormal(3.0, 1.5, (runs, n)) * (rng.random((runs, n)) < 0.3)
        x = w * rng.choice([-1.0, 1.0], (runs, n))
        D, V = np.cumsum(x, 1), np.cumsum(x * x, 1)
        crossed = np.mean((D > G.duel_bound.py_func(V, y, alpha)).any(1))
        se = math.sqrt(alpha * (1 - alpha) / runs)
        assert crossed <= alpha + 3 * se, (y, crossed)
