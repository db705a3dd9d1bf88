"""The compiled engine's CPU KV offload (``lpserve/sim/_offload_kernels.py``) against the
plain-Python model (``tests/oracles/offload.py``), operation by operation."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.sim import _offload_kernels as O
from tests.oracles.offload import GIB, HostTier

COST = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b")
BLOCK_BYTES = COST.kv_bytes_per_token * 16


def _tier(capacity: int, max_keys: int, key_bound: int, n_requests: int = 4):
    gib = capacity * BLOCK_BYTES / GIB
    return O.offload_struct(gib, COST, 16, 1.0, n_requests, max_keys, key_bound)


_ops = st.lists(st.tuples(st.sampled_from(["touch", "match"]),
                          st.lists(st.integers(0, 30), min_size=0, max_size=9),
                          st.integers(0, 4)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), _ops)
def test_the_compiled_tier_is_the_python_tier(capacity, ops):
    """Every touch (stores, LRU moves, drops beyond the capacity) and every leading-run
    match of the compiled tier equals :class:`HostTier`'s; the counters agree."""
    ref = HostTier(capacity)
    arrays, off = _tier(capacity, max_keys=9, key_bound=31)
    for op, keys, start in ops:
        k = np.asarray(keys, np.int64)
        if op == "touch":
            ref.touch(keys)
            O.touch(off, k, 0, k.size)
        else:
            assert O.match(off, k, min(start, k.size), k.size) == ref.match(keys, start)
        st_ = O.CompiledOffload(arrays).stats()
        assert (st_["stored_blocks"], st_["dropped_blocks"]) == (ref.n_stored, ref.n_dropped)
        assert arrays.oi[O.O_N] == len(ref)
    held = [key for key in range(31) if key in ref]
    assert [key for key in range(31)
            if O.match(off, np.array([key], np.int64), 0, 1)] == held


def test_loads_queue_on_one_stream_and_a_readmission_replaces_a_load():
    """Loads run one after another; a request admitted again while its load runs (it was
    preempted) loses it, so the replica no longer wakes at that load's end; a queue of
    replaced loads is compacted in place, however many there are."""
    arrays, off = _tier(64, max_keys=8, key_bound=64, n_requests=2)
    one = float(COST.swap_time_s(4, 16))
    assert O.admit_load(off, 0, 4, 64, 0, 0.0) == one
    assert O.admit_load(off, 1, 4, 64, 0, 0.0) == 2 * one  # after request 0's load
    assert O.next_end(off, 0.0) == one
    assert O.loading(off, 0, 0.0) and O.loading(off, 1, one)
    assert O.admit_load(off, 0, 0, 64, 64, one / 2) == 0.0  # readmitted, nothing to load
    assert not O.loading(off, 0, one / 2)
    assert O.next_end(off, one / 2) == 2 * one  # request 0's old end is gone
    for k in range(20):  # far more loads than the queue's 2n + 2 entries
        O.admit_load(off, k % 2, 1, 16, 0, 10.0 + k)
    assert arrays.oi[O.O_QT] - arrays.oi[O.O_QH] <= arrays.qt.size
    assert O.next_end(off, 29.0) == arrays.load_end[1]
    assert O.next_end(off, math.inf) == math.inf
    st_ = O.CompiledOffload(arrays).stats()
    assert st_["loaded_blocks"] == 28 and st_["hit_tokens"] == 2 * 64 + 20 * 16


def test_a_tier_of_no_block_is_refused():
    """A tier too small for one block is refused as by the plain-Python model."""
    import pytest

    with pytest.raises(ValueError, match=r"kv_offload_gib=1e-06 holds no KV block of 16"):
        O.offload_struct(1e-6, COST, 16, 1.0, 1, 4, 4)
