"""The decode-run kernel against its plain-Python twin."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.cost import UnitRoundCost, cost_model
from lpserve.cost._kernels import iteration_time
from lpserve.sim import _kernels as K

_A100 = cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)


@settings(max_examples=80, deadline=None)
@given(m=st.integers(0, 6), data=st.data(), unit=st.booleans())
def test_decode_advance_matches_ref(m, data, unit):
    params = UnitRoundCost(memory_tokens=1000).params if unit else _A100.params
    bt = data.draw(st.sampled_from([1, 4, 16]))
    ctx = np.array(data.draw(st.lists(st.integers(1, 500), min_size=m, max_size=m)), np.int64)
    gen = np.array(data.draw(st.lists(st.integers(1, 5), min_size=m, max_size=m)), np.int64)
    out = gen + np.array(data.draw(st.lists(st.integers(1, 80), min_size=m, max_size=m)),
                         np.int64)
    held = -(-ctx // bt) + np.array(data.draw(st.lists(st.integers(0, 1), min_size=m,
                                                       max_size=m)), np.int64)
    free = data.draw(st.integers(0, 30))
    stop = data.draw(st.sampled_from([np.inf, 0.3, 5.0, 40.0]))
    max_iters = data.draw(st.sampled_from([1, 7, 1 << 40]))
    args = (bt, free, 3, 0.0, stop, max_iters)
    a = [x.copy() for x in (ctx, gen, out, held)]
    b = [x.copy() for x in (ctx, gen, out, held)]
    ra = K.decode_advance(params, *a, *args)
    # the twin with the same cost kernel agrees exactly ...
    rb = K.decode_advance_ref(params, *b, *args, iter_time=iteration_time)
    assert ra == rb
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    # ... and with the plain-Python cost twin up to rounding
    c = [x.copy() for x in (ctx, gen, out, held)]
    rc = K.decode_advance_ref(params, *c, *args)
    if rc[3] == ra[3]:
        assert rc[0] == ra[0] and rc[2] == ra[2]
        assert abs(rc[1] - ra[1]) <= 1e-9 * max(1.0, abs(ra[1]))


def test_decode_advance_stops_at_completion_memory_and_time():
    p = UnitRoundCost(memory_tokens=100).params
    ctx = np.array([16, 5], np.int64)
    n, now, taken, why, _ = K.decode_advance(p, ctx.copy(), np.array([1, 1]),
                                             np.array([10, 4]), np.array([1, 1]), 16, 5, 2,
                                             0.0, np.inf, 1 << 40)
    assert (n, now, why) == (3, 3.0, K.STOP_DONE) and taken == 1
    n, now, taken, why, _ = K.decode_advance(p, ctx.copy(), np.array([1, 1]),
                                             np.array([10, 40]), np.array([1, 1]), 16, 0, 2,
                                             0.0, np.inf, 1 << 40)
    assert (n, why) == (0, K.STOP_MEMORY)
    n, now, taken, why, _ = K.decode_advance(p, np.array([1], np.int64), np.array([1]),
                                             np.array([50]), np.array([4]), 16, 0, 4, 0.0,
                                             2.5, 1 << 40)
    assert (n, now, why) == (3, 3.0, K.STOP_TIME)


def test_decode_advance_time_equals_cost_model_decode_run():
    ctx = np.array([100, 700, 1200], np.int64)
    n, now, *_ = K.decode_advance(_A100.params, ctx.copy(), np.ones(3, np.int64),
                                  np.full(3, 1000, np.int64), np.full(3, 200, np.int64), 16,
                                  0, 0, 0.0, np.inf, 50)
    assert n == 50
    assert abs(now - _A100.decode_run_s(ctx, 50)) < 1e-12 * now


def test_empty_batch_returns_at_once():
    p = UnitRoundCost(memory_tokens=10).params
    e = np.zeros(0, np.int64)
    for fn in (K.decode_advance, K.decode_advance_ref):
        assert fn(p, e.copy(), e.copy(), e.copy(), e.copy(), 16, 0, 0, 2.0, np.inf,
                  1 << 40) == (0, 2.0, 0, K.STOP_DONE, 0.0)
