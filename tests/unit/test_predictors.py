"""Output-length predictors: intervals contain what they claim, learning is online only."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lpserve.predictors import History, IntervalClasses, NoisyOracle, Oracle, make_predictor

truths = st.lists(st.integers(1, 100000), min_size=1, max_size=50).map(np.asarray)


@given(truths, st.floats(0.05, 0.95))
def test_interval_classes_contain_truth_with_ratio_alpha(t, alpha):
    p = IntervalClasses(alpha=alpha)
    p.reset(np.random.default_rng(0))
    pr = p.predict(np.ones_like(t), _truth=t)
    assert np.all(pr.lo <= t) and np.all(t <= pr.hi)
    assert np.all(pr.lo <= pr.point) and np.all(pr.point <= pr.hi)
    big = pr.lo >= 50  # away from integer rounding at tiny lengths
    assert np.all(pr.lo[big] / pr.hi[big] >= alpha * 0.9)


def test_oracle_and_noisy_oracle():
    t = np.array([10, 100, 1000])
    o = Oracle()
    o.reset(np.random.default_rng(0))
    assert o.predict(t, _truth=t).point.tolist() == [10, 100, 1000]
    n = NoisyOracle(sigma=0.0)
    n.reset(np.random.default_rng(0))
    assert n.predict(t, _truth=t).point.tolist() == [10, 100, 1000]
    n = NoisyOracle(sigma=0.5, interval_z=2.0)
    n.reset(np.random.default_rng(1))
    big = np.full(20000, 1000)
    pr = n.predict(big, _truth=big)
    # log-error sd matches sigma; a +-2 sigma interval around the point covers ~95 %
    assert np.log(pr.point / 1000).std() == pytest.approx(0.5, rel=0.05)
    assert np.mean((pr.lo <= 1000) & (1000 <= pr.hi)) == pytest.approx(0.954, abs=0.02)
    with pytest.raises(RuntimeError, match="call reset"):
        NoisyOracle().predict(t, _truth=t)


def test_history_learns_only_from_observations():
    h = History(min_samples=5, prior=(10, 500, 100))
    h.reset(np.random.default_rng(0))
    first = h.predict(np.array([1000, 4000]), np.array([0, 1]))
    assert first.point.tolist() == [100, 100]  # the prior, before any completion
    h.observe(np.full(10, 1000), np.zeros(10, int), np.arange(1, 11) * 10)
    pr = h.predict(np.array([1000, 1023, 4000]), np.array([0, 1, 1]))
    assert pr.point[0] == 55 and pr.lo[0] <= 20 and pr.hi[0] >= 90
    assert pr.point[1] == 55  # same prompt bucket, other tenant: falls back to the bucket
    assert pr.point[2] == 55  # other bucket: falls back to all completions
    h.reset(np.random.default_rng(0))
    assert h.predict(np.array([1000]), np.array([0])).point.tolist() == [100]


def test_bad_parameters_named():
    with pytest.raises(ValueError, match="alpha must be in"):
        IntervalClasses(alpha=1.5)
    with pytest.raises(ValueError, match="unknown predictor 'x'; known: oracle"):
        make_predictor("x")
    with pytest.raises(ValueError, match="prior"):
        History(prior=(10, 5, 7))
