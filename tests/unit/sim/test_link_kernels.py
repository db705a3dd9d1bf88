"""The compiled host link's copy queue (``lpserve/sim/_link_kernels.py``) against its
plain-Python model (``tests/oracles/host_link.py``): the same copies issued at the same times, with the
same start rule (a swap-in starts only when enough GPU blocks are free; a swap-out frees
its blocks at its end), start and end in the same order at the same times, in every link
order."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.sim import _link_kernels as L
from tests.oracles.host_link import HostLink

ORDERS = tuple(L.ORDER_CODES)

copy_st = st.tuples(
    st.sampled_from((0.0, 0.0, 0.004, 0.02)),    # time since the previous issue (s)
    st.sampled_from(("out", "in")),
    st.integers(1, 6),                          # blocks
    st.sampled_from((0.005, 0.01, 0.03)),       # duration (s)
    st.sampled_from((0.0, 1.0, 2.0, math.inf)),  # rank
    st.sampled_from((0.0, 0.02, 0.05, 0.1, math.inf)),  # deadline after the issue (s)
    st.booleans(),                              # then_run
)


def _python_run(order: str, copies: list, free0: int) -> tuple[list, tuple]:
    link, free, log = HostLink(order), [free0], []

    def start(c, t):
        if c.kind == "in":
            if free[0] < c.blocks:
                return False
            free[0] -= c.blocks
        log.append(("start", c.request, t))
        return True

    def end(c, t):
        if c.kind == "out":
            free[0] += c.blocks
        log.append(("end", c.request, t))

    now = 0.0
    for i, (gap, kind, blocks, dur, rank, dl, then) in enumerate(copies):
        now += gap
        link.advance(now, start, end)
        link.enqueue(kind, i, blocks, dur, now, rank, now + dl, then)
        link.advance(now, start, end)
    link.advance(math.inf, start, end)
    return log, (link.n_copies, link.freeing, link.promised, round(link.busy_s, 12))


def _kernel_tick(a: L.Link, link, now: float, free: list, log: list) -> None:
    """``HostLink.advance`` through the kernel's primitives, as the replica drives them
    (``a``: the arrays of ``link``)."""
    t = now
    while True:
        i = L.pop_end(link, now)
        if a.li[L.L_ACTIVE] >= 0:
            return  # the running copy ends after now
        if i >= 0:
            t = float(a.lf[L.LF_END])
            if a.q_kind[i] == L.KIND_OUT:
                free[0] += int(a.q_blocks[i])
            log.append(("end", int(i), t))
        started = False
        for j in L.start_order(link, t):
            if a.q_kind[j] == L.KIND_IN:
                if free[0] < a.q_blocks[j]:
                    continue
                free[0] -= int(a.q_blocks[j])
            L.start(link, j, t)
            log.append(("start", int(j), t))
            started = True
            break
        if not started:
            return


def _kernel_run(order: str, copies: list, free0: int) -> tuple[list, tuple]:
    a, link = L.link_struct(order, len(copies))
    free, log = [free0], []
    now = 0.0
    for i, (gap, kind, blocks, dur, rank, dl, then) in enumerate(copies):
        now += gap
        _kernel_tick(a, link, now, free, log)
        L.enqueue(link, L.KIND_OUT if kind == "out" else L.KIND_IN, i, blocks, dur, now,
                  rank, now + dl, then)
        _kernel_tick(a, link, now, free, log)
    _kernel_tick(a, link, math.inf, free, log)
    return log, (int(a.li[L.L_COPIES]), int(a.li[L.L_FREEING]), int(a.li[L.L_PROMISED]),
                 round(float(a.lf[L.LF_BUSY]), 12))


@settings(max_examples=60, deadline=None)
@given(order=st.sampled_from(ORDERS), copies=st.lists(copy_st, min_size=1, max_size=25),
       free0=st.integers(0, 8))
def test_the_kernel_link_starts_and_ends_copies_as_the_host_link(order, copies, free0):
    assert _kernel_run(order, copies, free0) == _python_run(order, copies, free0)


@pytest.mark.parametrize("order, expected", [
    ("fifo", [0, 1, 2, 3]),          # issue order
    ("priority", [2, 0, 1, 3]),      # rank, then issue order
    ("llf", [1, 0, 2, 3]),           # deadline - duration, then issue order
    ("rmlq", [1, 0, 2, 3]),          # laxity level, then issue order
])
def test_each_link_order_starts_its_first_copy_first(order, expected):
    a, link = L.link_struct(order, 4)
    for i, (rank, dl, dur) in enumerate(((1.0, 0.5, 0.01), (1.0, 0.5, 0.2),
                                         (0.0, 2.0, 0.01), (math.inf, math.inf, 0.01))):
        L.enqueue(link, L.KIND_OUT, i, 1, dur, 0.0, rank, dl, False)
    assert L.start_order(link, 0.0).tolist() == expected


def test_rmlq_levels_follow_the_laxity():
    """Level k holds laxities in [base 2^k, base 2^(k+1)); below 2 base is level 0, and no
    deadline (inf) or a laxity past the last level is the last level."""
    a, link = L.link_struct("rmlq", 4)
    for i, lax in enumerate((0.0, 0.05, 1e3, math.inf)):
        L.enqueue(link, L.KIND_OUT, i, 1, 0.01, 0.0, 0.0, lax + 0.01, False)
    got = [L.key(link, i, 0.0) for i in range(4)]
    assert got == [0.0, float(math.floor(math.log2(0.05 / L.RMLQ_BASE_S))),
                   float(L.RMLQ_LEVELS - 1), float(L.RMLQ_LEVELS - 1)]


def test_an_unknown_link_order_is_refused():
    with pytest.raises(ValueError, match="link_order must be one of"):
        L.link_struct("lifo", 3)


def test_the_link_counts_blocks_in_flight():
    """Swap-outs' blocks are freeing until they end; swap-ins' promised until they start."""
    a, link = L.link_struct("fifo", 3)
    L.enqueue(link, L.KIND_OUT, 0, 4, 0.1, 0.0, 0.0, math.inf, False)
    L.enqueue(link, L.KIND_IN, 1, 3, 0.1, 0.0, 0.0, math.inf, True)
    assert (a.li[L.L_FREEING], a.li[L.L_PROMISED]) == (4, 3)
    L.start(link, 0, 0.0)
    assert L.next_end_s(link) == pytest.approx(0.1)
    assert L.pop_end(link, 0.05) == -1
    assert L.pop_end(link, 0.1) == 0 and a.li[L.L_FREEING] == 0
    L.start(link, 1, 0.1)
    assert a.li[L.L_PROMISED] == 0 and np.array_equal(L.start_order(link, 0.1), [])
