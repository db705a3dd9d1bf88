"""Trace: construction, validation, slicing, rate scaling, statistics."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.trace import TraceError, infinite_cache_hit_rate


def small(**kw):
    base = dict(arrival_s=[0.0, 1.0, 1.0, 4.0], prompt_tokens=[10, 20, 30, 40],
                output_tokens=[1, 2, 3, 4])
    base.update(kw)
    return lp.Trace.from_arrays(**base)


def test_arrays_are_read_only():
    t = small()
    with pytest.raises(ValueError):
        t.prompt_tokens[0] = 5
    assert t.arrival_s.dtype == np.float64 and t.prompt_tokens.dtype == np.int64


@pytest.mark.parametrize("kw, match", [
    (dict(prompt_tokens=[10, 0, 30, 40]), r"'prompt_tokens' row 1 must be >= 1, got 0"),
    (dict(output_tokens=[1, 2, -3, 4]), r"'output_tokens' row 2 must be >= 1, got -3"),
    (dict(arrival_s=[0.0, float("nan"), 1.0, 4.0]), r"'arrival_s' row 1 is not finite"),
    (dict(prompt_tokens=[10, 2.5, 30, 40]), r"row 1 is not an integer: 2.5"),
    (dict(output_tokens=[1, 2, 3]), r"'output_tokens' has 3 values, expected 4"),
    (dict(arrival_s=[0.0, 2.0, 1.0, 4.0]), r"out of order at row 2"),
    (dict(parent=[-1, 0, 2, 1]), r"'parent' row 2 must point to an earlier request"),
    (dict(predicted_lo=[1, 1, 5, 1], predicted_hi=[2, 2, 4, 2]), r"lo 5 > hi 4"),
    (dict(predicted_lo=[1, 1, 1, 1]), "both predicted_lo and predicted_hi"),
    (dict(block_ids=[[0], [0, 1]], block_tokens=16), "block_ids has 2 lists, expected 4"),
    (dict(block_ids=[[0], [0], [1], [2]]), "block_ids given without block_tokens"),
])
def test_invalid_fields_are_named(kw, match):
    with pytest.raises(TraceError, match=match):
        small(**kw)


def test_sort_remaps_parents_and_blocks():
    t = lp.Trace.from_arrays(arrival_s=[2.0, 0.0, 1.0], prompt_tokens=[3, 1, 2],
                             output_tokens=[1, 1, 1], parent=[-1, -1, 1],
                             block_ids=[[7], [5], [5, 6]], block_tokens=2, sort=True)
    assert t.prompt_tokens.tolist() == [1, 2, 3]
    assert t.parent.tolist() == [-1, 0, -1]
    assert t.block_lists() == [[5], [5, 6], [7]]
    assert t.report.n_reordered == 3


def test_slicing_and_windows():
    t = small(block_ids=[[0], [0, 1], [2], [0, 1, 3]], block_tokens=16,
              parent=[-1, 0, 1, 2])
    h = t.head(2)
    assert len(h) == 2 and h.block_lists() == [[0], [0, 1]]
    s = t.slice(1, 3)
    assert s.prompt_tokens.tolist() == [20, 30] and s.parent.tolist() == [-1, 0]
    w = t.window(1.0, 4.0)
    assert w.prompt_tokens.tolist() == [20, 30]
    assert len(t.window(5.0, 6.0)) == 0
    with pytest.raises(TraceError):
        t.window(3.0, 1.0)


def test_scale_rate_exact():
    t = small()
    s = t.scale_rate(2.0)
    assert np.allclose(np.diff(s.arrival_s), np.diff(t.arrival_s) / 2.0)
    assert s.arrival_s[0] == t.arrival_s[0]
    r = t.with_rate(3.0)
    assert r.rate_per_s == pytest.approx(3.0)
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(TraceError):
            t.scale_rate(bad)


def test_concat():
    a, b = small(), small()
    c = lp.Trace.concat([a, b], gap_s=1.0)
    assert len(c) == 8 and c.arrival_s[4] == 5.0
    with pytest.raises(TraceError, match="present in some traces only"):
        lp.Trace.concat([a, small(session_id=[1, 1, 2, 2])], gap_s=0.0)
    with pytest.raises(TraceError, match="out of order"):
        lp.Trace.concat([a, b])  # b starts before a ends


def test_stats_keys_and_values():
    t = small(block_ids=[[0], [0, 1], [2], [0, 1, 3]], block_tokens=16)
    s = t.stats()
    assert s["n_requests"] == 4 and s["duration_s"] == 4.0 and s["rate_per_s"] == 0.75
    assert s["prompt_tokens"]["p50"] == 25.0 and s["output_tokens"]["max"] == 4.0
    assert set(s["prompt_tokens"]) == {"mean", "p50", "p90", "p99", "max"}
    # hits: req1 block 0 (1), req3 blocks 0,1 (2) -> 3 of 7 blocks
    assert s["infinite_cache_hit_rate"] == pytest.approx(3 / 7)
    assert s["distinct_blocks"] == 4


def test_hit_rate_needs_whole_prefix():
    # block 1 of request 1 was seen, but after a different first block: no hit there
    t = lp.Trace.from_arrays(arrival_s=[0, 1], prompt_tokens=[2, 2], output_tokens=[1, 1],
                             block_ids=[[0, 1], [2, 1]], block_tokens=1)
    assert infinite_cache_hit_rate(t) == 0.0


def test_digest_stable_and_sensitive():
    assert small().digest() == small().digest()
    assert small().digest() != small(output_tokens=[1, 2, 3, 5]).digest()


def test_to_pandas_roundtrip():
    t = small(session_id=[1, 1, 2, -1])
    df = t.to_pandas()
    assert list(df.columns) == ["arrival_s", "prompt_tokens", "output_tokens", "session_id"]
    back = lp.Trace.from_arrays(**{c: df[c].to_numpy() for c in df.columns})
    assert back.digest() == t.digest()


@pytest.mark.parametrize("values, match", [
    ([1e30], r"'prompt_tokens' row 0 is too large: 1e\+30"),
    ([10 ** 20], r"'prompt_tokens' row 0 is too large: 100000000000000000000"),
    (np.array([2 ** 63 + 5], np.uint64), r"'prompt_tokens' row 0 is too large"),
    ([2 ** 53], r"'prompt_tokens' row 0 is too large: 9007199254740992"),
])
def test_counts_are_range_checked_before_the_cast(values, match):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in cast"
        with pytest.raises(TraceError, match=match):
            lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=values, output_tokens=[1])


def test_arrival_times_beyond_2_to_the_33_seconds_are_refused():
    with pytest.raises(TraceError, match=r"'arrival_s' row 1 = 1e\+300 is beyond"):
        lp.Trace.from_arrays(arrival_s=[0.0, 1e300], prompt_tokens=[1, 1], output_tokens=[1, 1])
