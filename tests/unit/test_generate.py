"""Generators: seeded determinism, structure of prefixes, sessions and programs."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.trace import TraceError
from lpserve.trace import generate as g


def test_seeded_and_reproducible():
    kw = dict(arrivals=g.Poisson(2.0), prompt=g.LogNormal(500, 1.0), output=g.Zipf(1.2, 300))
    a = g.synthetic(200, seed=4, **kw)
    assert a.digest() == g.synthetic(200, seed=4, **kw).digest()
    assert a.digest() != g.synthetic(200, seed=5, **kw).digest()


@pytest.mark.parametrize("make, match", [
    (lambda: g.Poisson(0.0), "Poisson.rate_per_s must be a finite number > 0"),
    (lambda: g.GammaRenewal(1.0, -2.0), "GammaRenewal.cv"),
    (lambda: g.Uniform(5, 2), "1 <= lo <= hi"),
    (lambda: g.LogNormal(float("nan"), 1.0), "LogNormal.mean"),
    (lambda: g.MMPP((1.0,), (1.0,)), "MMPP needs >= 2 states"),
    (lambda: g.Constant(0), "Constant.tokens"),
    (lambda: g.Empirical(np.array([3, 0])), ">= 1"),
])
def test_bad_specs(make, match):
    with pytest.raises(TraceError, match=match):
        make()


def test_total_split_matches_vidur_workload():
    t = g.synthetic(20000, arrivals=g.Poisson(3.0), seed=42,
                    lengths=g.TotalSplit(g.Uniform(512, 2048), 3.0))
    total = t.prompt_tokens + t.output_tokens
    assert total.min() >= 512 and total.max() <= 2048
    assert (t.prompt_tokens.mean() / t.output_tokens.mean()) == pytest.approx(3.0, rel=0.01)


def test_shared_prefixes_share_exactly_the_full_prefix_blocks():
    base = g.synthetic(300, arrivals=g.Poisson(1.0), prompt=g.Uniform(1, 200),
                       output=g.Constant(4), seed=0)
    t = g.with_shared_prefixes(base, [g.PrefixLevel(2, 40), g.PrefixLevel(3, 30)],
                               share=1.0, block_tokens=16, seed=1)
    assert np.array_equal(t.prompt_tokens, base.prompt_tokens + 70)
    for i in range(len(t)):
        assert len(t.blocks(i)) == -(-t.prompt_tokens[i] // 16)
    # same path -> same first 70 // 16 = 4 blocks; block 4 (tokens 64..79) straddles -> fresh
    path = {}
    for i in range(len(t)):
        key = t.blocks(i)[:4].tolist()
        path.setdefault(tuple(key), set()).add(int(t.blocks(i)[4]))
    assert len(path) <= 6  # 2 x 3 nested choices
    assert all(len(v) == sum(1 for i in range(len(t)) if tuple(t.blocks(i)[:4]) == k)
               for k, v in path.items())
    # first-level choices share the first 2 blocks (32 tokens of the 40-token level)
    firsts = {tuple(t.blocks(i)[:2]) for i in range(len(t))}
    assert len(firsts) == 2
    assert set(t.tenant.tolist()) == {0, 1}


def test_sessions_extend_history():
    t = g.sessions(30, session_arrivals=g.Poisson(0.5), turns=g.Uniform(2, 4),
                   first_prompt=g.Uniform(10, 100), turn_prompt=g.Uniform(5, 20),
                   output=g.Uniform(5, 50), think_time_s=10.0, block_tokens=8, seed=2)
    for s in np.unique(t.session_id):
        idx = np.flatnonzero(t.session_id == s)
        for a, b in zip(idx[:-1], idx[1:]):
            assert t.arrival_s[b] >= t.arrival_s[a]
            assert t.prompt_tokens[b] > t.prompt_tokens[a] + t.output_tokens[a]
            full = t.prompt_tokens[a] // 8
            assert np.array_equal(t.blocks(b)[:full], t.blocks(a)[:full])


def test_agentic_programs_parents_precede_children():
    t = g.agentic_programs(40, program_arrivals=g.Poisson(1.0), stages=g.Uniform(1, 4),
                           fanout=g.Uniform(1, 3), prompt=g.Uniform(10, 50),
                           output=g.Uniform(1, 20), seed=3)
    has = t.parent >= 0
    assert np.all(t.parent[has] < np.flatnonzero(has))
    assert np.all(t.program_id[t.parent[has]] == t.program_id[has])
    assert len(np.unique(t.program_id)) == 40


def test_with_arrivals_keeps_requests():
    base = lp.bundled_trace().head(100)
    t = g.with_arrivals(base, g.GammaRenewal(5.0, 2.0), seed=1)
    assert np.array_equal(t.prompt_tokens, base.prompt_tokens)
