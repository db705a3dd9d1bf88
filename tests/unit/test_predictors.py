"""Output-length predictors: intervals contain what they claim, learning is online only."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lpserve.cluster import Cluster
from lpserve.policies.predictors import (
    History,
    IntervalClasses,
    NoisyOracle,
    Oracle,
    make_predictor,
)
from lpserve.policy import PredictorView

CLUSTER = Cluster(gpu="a100-80gb", llm="llama-2-7b")


def _view(prompt, tenant=None, truth=None) -> PredictorView:
    p = np.asarray(prompt, np.int64)
    return PredictorView(now_s=0.0, request=np.arange(p.size), prompt_tokens=p,
                         tenant=np.full(p.size, -1) if tenant is None else np.asarray(tenant),
                         output_tokens=None if truth is None else np.asarray(truth))

truths = st.lists(st.integers(1, 100000), min_size=1, max_size=50).map(np.asarray)


@given(truths, st.floats(0.05, 0.95))
def test_interval_classes_contain_truth_with_ratio_alpha(t, alpha):
    p = IntervalClasses(alpha=alpha)
    p.reset(CLUSTER, np.random.default_rng(0))
    pr = p.predict(_view(np.ones_like(t), truth=t))
    assert np.all(pr.lo <= t) and np.all(t <= pr.hi)
    assert np.all(pr.lo <= pr.point) and np.all(pr.point <= pr.hi)
    big = pr.lo >= 50  # away from integer rounding at tiny lengths
    assert np.all(pr.lo[big] / pr.hi[big] >= alpha * 0.9)


def test_oracle_and_noisy_oracle():
    t = np.array([10, 100, 1000])
    o = Oracle()
    o.reset(CLUSTER, np.random.default_rng(0))
    assert o.predict(_view(t, truth=t)).point.tolist() == [10, 100, 1000]
    n = NoisyOracle(sigma=0.0)
    n.reset(CLUSTER, np.random.default_rng(0))
    assert n.predict(_view(t, truth=t)).point.tolist() == [10, 100, 1000]
    n = NoisyOracle(sigma=0.5, interval_z=2.0)
    n.reset(CLUSTER, np.random.default_rng(1))
    big = np.full(20000, 1000)
    pr = n.predict(_view(big, truth=big))
    # log-error sd matches sigma; a +-2 sigma interval around the point covers ~95 %
    assert np.log(pr.point / 1000).std() == pytest.approx(0.5, rel=0.05)
    assert np.mean((pr.lo <= 1000) & (1000 <= pr.hi)) == pytest.approx(0.954, abs=0.02)
    with pytest.raises(RuntimeError, match="call reset"):
        NoisyOracle().predict(_view(t, truth=t))


def test_history_learns_only_from_observations():
    h = History(min_samples=5, prior=(10, 500, 100))
    h.reset(CLUSTER, np.random.default_rng(0))
    first = h.predict(_view([1000, 4000], [0, 1]))
    assert first.point.tolist() == [100, 100]  # the prior, before any completion
    h.observe(_view(np.full(10, 1000), np.zeros(10, int), np.arange(1, 11) * 10))
    pr = h.predict(_view([1000, 1023, 4000], [0, 1, 1]))
    assert pr.point[0] == 55 and pr.lo[0] <= 20 and pr.hi[0] >= 90
    assert pr.point[1] == 55  # same prompt bucket, other tenant: falls back to the bucket
    assert pr.point[2] == 55  # other bucket: falls back to all completions
    h.reset(CLUSTER, np.random.default_rng(0))
    assert h.predict(_view([1000], [0])).point.tolist() == [100]


def test_bad_parameters_named():
    with pytest.raises(ValueError, match="alpha must be in"):
        IntervalClasses(alpha=1.5)
    with pytest.raises(ValueError, match="unknown predictor 'x'; known: oracle"):
        make_predictor("x")
    with pytest.raises(ValueError, match="prior"):
        History(prior=(10, 5, 7))
    with pytest.raises(ValueError, match="clairvoyant: its view needs the true output_tokens"):
        Oracle().predict(_view([10]))


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=60),
       st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]))
def test_sorted_window_quantile_is_numpys(values, q):
    from lpserve.kernels.history import quantile_sorted

    srt = np.sort(np.asarray(values, np.int64))
    assert quantile_sorted(srt, srt.size, q) == float(np.quantile(np.asarray(values), q))


def test_history_window_keeps_the_newest_completions():
    """After more completions than the window, predictions are the quantiles of the newest
    ``window`` only (the sorted copy drops exactly the value that left the window)."""
    rng = np.random.default_rng(4)
    h = History(min_samples=5, window=40)
    h.reset(None, rng)
    seen = []
    for _ in range(30):
        out = rng.integers(1, 3000, 7)
        seen.extend(out.tolist())
        h.observe(PredictorView(now_s=0.0, request=np.arange(7), prompt_tokens=np.full(7, 100),
                                tenant=np.zeros(7, np.int64), output_tokens=out))
        pred = h.predict(PredictorView(now_s=0.0, request=np.arange(1),
                                       prompt_tokens=np.array([100]),
                                       tenant=np.zeros(1, np.int64), output_tokens=None))
        last = np.asarray(seen[-40:])
        q = np.quantile(last, [0.1, 0.5, 0.9])
        assert (int(pred.lo[0]), int(pred.hi[0]), int(pred.point[0])) == (
            max(1, int(np.floor(q[0]))), max(1, int(np.ceil(q[2]))), max(1, int(round(q[1]))))


def _by_definition(seen, prompt, tenant, h):
    """History's prediction from its definition: numpy quantiles of the newest ``window``
    completions of the most specific bucket holding ``min_samples`` of them."""
    b = int(np.floor(np.log2(max(prompt, 1))))
    for match in (lambda p, t: int(np.floor(np.log2(p))) == b and t == tenant,
                  lambda p, t: int(np.floor(np.log2(p))) == b, lambda p, t: True):
        last = [o for p, t, o in seen if match(p, t)][-h.window:]
        if len(last) >= h.min_samples:
            q = np.quantile(np.asarray(last), [h.q_lo, 0.5, h.q_hi])
            return (max(1, int(np.floor(q[0]))), max(1, int(np.ceil(q[2]))),
                    max(1, int(round(q[1]))))
    return h.prior


@given(st.lists(st.lists(st.tuples(st.integers(1, 4000), st.integers(0, 2),
                                   st.integers(1, 3000)), max_size=9), max_size=12),
       st.integers(1, 5), st.integers(5, 12), st.sampled_from([0.0, 0.1, 0.5]),
       st.sampled_from([0.5, 0.9, 1.0]))
def test_history_is_its_definition(batches, min_samples, window, q_lo, q_hi):
    """Every prediction equals the definition's after each batch of completions, across
    tenants, prompt buckets, fallbacks and full windows; a pickled copy goes on alike."""
    import pickle

    h = History(min_samples=min_samples, window=window, q_lo=q_lo, q_hi=q_hi)
    h.reset(CLUSTER, np.random.default_rng(0))
    queries = [(1, 0), (700, 1), (1023, 2), (3000, 0), (4000, 5)]
    seen = []
    for batch in batches:
        if batch:
            p, t, o = (np.asarray(x, np.int64) for x in zip(*batch))
            h.observe(_view(p, t, o))
            seen.extend(batch)
        got = h.predict(_view([q[0] for q in queries], [q[1] for q in queries]))
        for k, (p, t) in enumerate(queries):
            assert (got.lo[k], got.hi[k], got.point[k]) == _by_definition(seen, p, t, h)
    copy = pickle.loads(pickle.dumps(h))
    more = _view([64, 64], [0, 0], [5, 7])
    h.observe(more)
    copy.observe(more)
    a, b = (x.predict(_view([64, 2000], [0, 1])) for x in (h, copy))
    assert a.lo.tolist() == b.lo.tolist() and a.point.tolist() == b.point.tolist()


def test_history_reads_its_fields_at_each_call():
    """A field changed after construction takes effect (nothing derived from it is kept)."""
    h = History(min_samples=5, prior=(10, 500, 100))
    h.reset(CLUSTER, np.random.default_rng(0))
    h.observe(_view([1000, 1000], [0, 0], [40, 60]))
    assert h.predict(_view([1000], [0])).point.tolist() == [100]  # two of five: the prior
    h.min_samples = 2
    assert h.predict(_view([1000], [0])).point.tolist() == [50]
