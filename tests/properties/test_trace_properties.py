"""Property tests of traces and generators (hypothesis)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.trace import generate as g
from tests.strategies import traces


@given(traces(min_size=2), st.floats(0.01, 100.0))
def test_rate_scaling_preserves_order_and_scales_mean_gap_exactly(t, factor):
    s = t.scale_rate(factor)
    assert np.all(np.diff(s.arrival_s) >= 0)
    assert np.array_equal(np.argsort(s.arrival_s, kind="stable"),
                          np.argsort(t.arrival_s, kind="stable"))
    gaps_t, gaps_s = np.diff(t.arrival_s), np.diff(s.arrival_s)
    assert gaps_s.mean() == pytest.approx(gaps_t.mean() / factor, rel=1e-9, abs=1e-9)
    assert s.prompt_tokens is not None and s.digest() != "" and len(s) == len(t)


@given(traces(), st.data())
def test_slicing_and_concat_round_trip(t, data):
    k = data.draw(st.integers(0, len(t)))
    a, b = t.head(k), t.slice(k)
    back = lp.Trace.concat([a, b])
    if t.parent is None:
        assert back.digest() == t.digest()
    else:  # a link from the second part to the first is cut by the split (documented)
        cut = (np.arange(len(t)) >= k) & (t.parent >= 0) & (t.parent < k)
        assert np.array_equal(back.parent, np.where(cut, -1, t.parent))
        for f in ("arrival_s", "prompt_tokens", "output_tokens", "session_id", "tenant",
                  "predicted_lo", "predicted_hi", "block_flat", "block_offsets"):
            x, y = getattr(back, f), getattr(t, f)
            assert (x is None and y is None) or np.array_equal(x, y)


@given(traces(min_size=1))
def test_window_partitions_the_trace(t):
    mid = float(np.median(t.arrival_s))
    lo = t.window(t.arrival_s[0], mid)
    hi = t.window(mid, t.arrival_s[-1] + 1.0)
    assert len(lo) + len(hi) == len(t)


@given(traces(blocks=True))
def test_infinite_cache_hit_rate_is_a_rate(t):
    r = t.stats()["infinite_cache_hit_rate"]
    assert math.isnan(r) or 0.0 <= r <= 1.0


# generators hit their targets -------------------------------------------------------
@settings(max_examples=10)
@given(st.floats(0.1, 50.0), st.integers(0, 2**31 - 1))
def test_poisson_rate_and_cv(rate, seed):
    t = g.synthetic(20000, arrivals=g.Poisson(rate), prompt=g.Constant(1),
                    output=g.Constant(1), seed=seed)
    gaps = np.diff(t.arrival_s)
    # mean gap: 20k samples, sd of the mean = 0.7% of the mean; allow 4 sd
    assert t.rate_per_s == pytest.approx(rate, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


@settings(max_examples=10)
@given(st.floats(0.1, 50.0), st.floats(0.3, 4.0), st.integers(0, 2**31 - 1))
def test_gamma_rate_and_cv(rate, cv, seed):
    t = g.synthetic(40000, arrivals=g.GammaRenewal(rate, cv), prompt=g.Constant(1),
                    output=g.Constant(1), seed=seed)
    gaps = np.diff(t.arrival_s)
    assert 1 / gaps.mean() == pytest.approx(rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.12)


@settings(max_examples=8)
@given(st.floats(0.5, 20.0), st.floats(0.5, 20.0), st.integers(0, 2**31 - 1))
def test_mmpp_long_run_rate(r1, r2, seed):
    m = g.MMPP((r1, r2, 3.0), (1.0, 2.0, 0.5))
    t = g.synthetic(200000, arrivals=m, prompt=g.Constant(1), output=g.Constant(1),
                    seed=seed)
    # >= 9,000 state periods: the share of time per state has sd < 1 %, so the rate
    # estimate has sd < 1.5 %; allow about 3 sd
    assert t.rate_per_s == pytest.approx(m.mean_rate_per_s, rel=0.045)


@settings(max_examples=10)
@given(st.floats(50, 5000), st.floats(0.2, 2.0), st.integers(0, 2**31 - 1))
def test_lognormal_moments(mean, cv, seed):
    x = g.LogNormal(mean, cv).sample(100000, np.random.default_rng(seed))
    assert x.mean() == pytest.approx(mean, rel=0.03 + 0.5 / mean)
    # the sample sd of a heavy tail converges slowly: allow 15 %
    assert x.std() / x.mean() == pytest.approx(cv, rel=0.15)


@settings(max_examples=10)
@given(st.integers(1, 1000), st.integers(0, 1000), st.integers(0, 2**31 - 1))
def test_uniform_and_zipf(lo, width, seed):
    rng = np.random.default_rng(seed)
    u = g.Uniform(lo, lo + width).sample(50000, rng)
    assert u.min() >= lo and u.max() <= lo + width
    assert u.mean() == pytest.approx(lo + width / 2, rel=0.01)
    z = g.Zipf(1.5, 50)
    s = z.sample(50000, rng)
    assert np.mean(s == 1) == pytest.approx(z.probabilities()[0], abs=0.01)
