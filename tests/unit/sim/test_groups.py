"""The pool's session groups (``sim/_groups.py``) against a plain model: after any sequence
of releases and hits, the live groups are exactly the evictable blocks grouped by
(thread, release time, wait kind), listed in time order, with ids reused only after the
list is compacted (a small pool compacts many times; reading the live groups compacts a
list that holds more dead groups than live ones)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.sim import _groups as GR

N_SI = 12


def _live(gi, gt, si):
    """{(thread, time, wait): set of slots} of the live groups, and the time order check."""
    out = {}
    order = gi[GR.GI_ORDER, :gi[GR.GI_STATE, GR.ST_ORDER]]
    times = gt[GR.GT_T, order]
    assert np.all(np.diff(times) >= 0)  # creation order is time order
    buf = np.empty(si.shape[1], np.int64)
    for g in order.tolist():
        if gi[GR.GI_COUNT, g] > 0:
            m = GR.members(gi, si, g, buf)
            assert m == gi[GR.GI_COUNT, g]
            key = (int(gi[GR.GI_THREAD, g]), float(gt[GR.GT_T, g]), int(gi[GR.GI_WAIT, g]))
            assert key not in out  # one live group per key
            out[key] = set(buf[:m].tolist())
            assert all(si[GR.S_GROUP, s] == g for s in out[key])
    return out


def _check(total, steps):
    """Apply ``steps`` (time advance, thread, wait kind, slot pick) to a pool of ``total``
    blocks and compare the live groups with the model's."""
    gi, gt = GR.new_group_arrays(total, True)
    si = np.full((N_SI, total), -1, np.int64)
    model: dict[int, tuple] = {}  # evictable slot -> (thread, time, wait)
    now = 0.0
    for adv, thread, wait, pick in steps:
        now += adv  # releases come in time order (often at the same instant)
        s = pick % total
        if s in model:  # hit again or evicted: it leaves its group
            GR.leave(gi, gt, si, s)
            del model[s]
        else:  # released by a request of `thread`
            GR.join(gi, gt, si, s, thread, wait, now)
            model[s] = (thread, now, wait)
        if pick % 7 == 0:  # an eviction reads the live groups
            _read_live(gi, gt)
    want: dict[tuple, set] = {}
    for s, key in model.items():
        want.setdefault(key, set()).add(s)
    assert _live(gi, gt, si) == want
    assert gi[GR.GI_STATE, GR.ST_LIVE] == len(want)


def _read_live(gi, gt):
    """live_groups (which may compact the list) lists the live groups in time order, and
    the list then holds at most as many dead groups as live ones (plus 16)."""
    before = [g for g in gi[GR.GI_ORDER, :gi[GR.GI_STATE, GR.ST_ORDER]].tolist()
              if gi[GR.GI_COUNT, g] > 0]
    out = np.empty(gi.shape[1], np.int64)
    G = GR.live_groups(gi, out)
    assert out[:G].tolist() == before
    assert gi[GR.GI_STATE, GR.ST_ORDER] <= 2 * G + 16


STEP = st.tuples(st.integers(0, 2), st.integers(-1, 2), st.integers(-1, 1),
                 st.integers(0, 99))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.lists(STEP, min_size=1, max_size=300))
def test_groups_are_the_evictable_blocks_by_thread_time_and_wait(total, steps):
    _check(total, steps)


@pytest.mark.parametrize("total,seed", [(2, 0), (5, 1), (12, 2), (40, 3)])
def test_groups_stay_exact_through_many_compactions(total, seed):
    """Thousands of releases in a small pool: the id list is compacted many times."""
    rng = np.random.default_rng(seed)
    steps = list(zip(rng.integers(0, 3, 3000).tolist(), rng.integers(-1, 3, 3000).tolist(),
                     rng.integers(-1, 2, 3000).tolist(), rng.integers(0, 99, 3000).tolist()))
    _check(total, steps)
