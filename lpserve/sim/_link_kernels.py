"""The host link's copy queue of a replica (numba; ``models/simulator.md`` (26)-(31)); its
plain-Python model, the oracle of the tests, is ``tests/oracles/host_link.py``.

One copy runs at a time; a free link starts the queued copy that comes first in the link
order (``fifo``, ``priority``, ``llf``, ``rmlq``) among those that can start. A request has
at most one copy on its replica's link, so copies are indexed by request: ``q_*[i]`` hold
request ``i``'s copy while it is queued (in ``queue[:li[L_NQ]]``) or running
(``li[L_ACTIVE] == i``).

The replica drives the link (:func:`pop_end`, :func:`start_order`, :func:`start`): a copy
that ends frees or lands its KV, and a swap-in takes its GPU blocks when it starts, both of
which the replica applies (``transfer.tick``). ``Link`` (``LINK_FIELDS``, the StructRef in
:mod:`lpserve.sim._structs`): ``li`` (int64, ``L_*``), ``lf`` (float64, ``LF_*``), then per
request (``n``): ``queue`` the queued requests in no order; ``q_kind`` ``KIND_OUT`` /
``KIND_IN``; ``q_blocks`` the GPU blocks the copy moves; ``q_seq`` its issue order;
``q_then`` 1 when a swap-in puts its request into the batch; ``q_dur`` its link seconds;
``q_issued`` when it was issued (s); ``q_rank`` the scheduler's rank then (``priority``);
``q_dl`` the request's deadline then (s; ``llf``, ``rmlq``); ``quant_s`` (K,) the seconds
to quantize (or dequantize) ``k`` blocks for a compressed swap, made by the replica
(:mod:`lpserve.sim._swap_kernels`; one zero without compress-and-swap).
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit

from lpserve.sim._structs import LINK_FIELDS, new_link

__all__ = ["Link", "ORDER_CODES", "RMLQ_BASE_S", "RMLQ_LEVELS", "link_struct", "enqueue",
           "next_end_s", "pop_end", "start_order", "start", "key"]

#: the reverse multi-level queue of ``link_order="rmlq"``: level ``k`` holds copies whose
#: laxity is in ``[base * 2**k, base * 2**(k+1))`` (level 0 below ``2 * base``, the last
#: level everything above, including copies without a deadline); lower levels start first
RMLQ_BASE_S = 0.01
RMLQ_LEVELS = 8

#: the arrays of one link (Python side; the kernels take the structure over them)
Link = namedtuple("Link", LINK_FIELDS)
#: ``EngineConfig.link_order`` -> code
ORDER_CODES = {"fifo": 0, "priority": 1, "llf": 2, "rmlq": 3}
ORDER_FIFO, ORDER_PRIORITY, ORDER_LLF, ORDER_RMLQ = range(4)
#: copy kinds
KIND_OUT, KIND_IN = 0, 1
# li: order, running request (-1: idle), queued count, issue counter, copies started,
# blocks of swap-outs not ended (freed at their ends), blocks of swap-ins not started
L_ORDER, L_ACTIVE, L_NQ, L_SEQ, L_COPIES, L_FREEING, L_PROMISED = range(7)
N_LI = 7
# lf: start and end of the running copy (s), summed copy time (s)
LF_START, LF_END, LF_BUSY = range(3)
N_LF = 3


def link_struct(order: str, n_requests: int,
                quant_s: np.ndarray | None = None) -> tuple[Link, object]:
    """``(arrays, struct)`` of an idle link with ``order`` for a run of ``n_requests``;
    ``quant_s``: the (de)quantize seconds of ``k`` blocks (default: none needed)."""
    if order not in ORDER_CODES:
        raise ValueError(f"link_order must be one of {sorted(ORDER_CODES)}, got {order!r}")
    n = max(int(n_requests), 1)
    li = np.zeros(N_LI, np.int64)
    li[L_ORDER], li[L_ACTIVE] = ORDER_CODES[order], -1
    ints = [np.zeros(n, np.int64) for _ in range(5)]
    floats = [np.zeros(n) for _ in range(4)]
    q = np.zeros(1) if quant_s is None else np.ascontiguousarray(quant_s, np.float64)
    a = Link(li, np.zeros(N_LF), *ints, *floats, q)
    return a, new_link(*a)


@njit(cache=True)
def enqueue(link, kind, i, blocks, duration_s, now_s, rank, deadline_s, then_run):
    """Queue request ``i``'s copy issued at ``now_s`` (``transfer.HostLink.enqueue``)."""
    li = link.li
    li[L_SEQ] += 1
    link.q_kind[i] = kind
    link.q_blocks[i] = blocks
    link.q_seq[i] = li[L_SEQ]
    link.q_then[i] = 1 if then_run else 0
    link.q_dur[i] = duration_s
    link.q_issued[i] = now_s
    link.q_rank[i] = rank
    link.q_dl[i] = deadline_s
    link.queue[li[L_NQ]] = i
    li[L_NQ] += 1
    if kind == KIND_OUT:
        li[L_FREEING] += blocks
    else:
        li[L_PROMISED] += blocks


@njit(cache=True)
def key(link, i, t):
    """The primary sort key of queued request ``i``'s copy at time ``t`` under the link
    order (lower starts first; ties by issue order, ``q_seq``)."""
    order = link.li[L_ORDER]
    if order == ORDER_FIFO:
        return 0.0
    if order == ORDER_PRIORITY:
        return link.q_rank[i]
    if order == ORDER_LLF:  # laxity at t is deadline - t - duration: t is common
        return link.q_dl[i] - link.q_dur[i]
    lax = link.q_dl[i] - t - link.q_dur[i]
    if not math.isfinite(lax):
        return float(RMLQ_LEVELS - 1)
    level = int(math.floor(math.log2(max(lax, RMLQ_BASE_S) / RMLQ_BASE_S)))
    return float(min(max(level, 0), RMLQ_LEVELS - 1))


@njit(cache=True)
def next_end_s(link):
    """End of the running copy (``inf`` if the link is idle)."""
    return link.lf[LF_END] if link.li[L_ACTIVE] >= 0 else math.inf


@njit(cache=True)
def pop_end(link, now_s):
    """The request whose running copy ends by ``now_s`` (-1 if none), taken off the link;
    its end time is ``link.lf[LF_END]``. A swap-out's blocks leave ``L_FREEING``."""
    i = link.li[L_ACTIVE]
    if i < 0 or link.lf[LF_END] > now_s:
        return -1
    link.li[L_ACTIVE] = -1
    if link.q_kind[i] == KIND_OUT:
        link.li[L_FREEING] -= link.q_blocks[i]
    return i


@njit(cache=True)
def start_order(link, t):
    """The queued requests in the order their copies would start at ``t`` (by the link
    order's key, then issue order)."""
    n = link.li[L_NQ]
    ids = link.queue[:n].copy()
    k1 = np.empty(n)
    k2 = np.empty(n, np.int64)
    for j in range(n):
        k1[j] = key(link, ids[j], t)
        k2[j] = link.q_seq[ids[j]]
    o = np.argsort(k2, kind="mergesort")
    o = o[np.argsort(k1[o], kind="mergesort")]
    return ids[o]


@njit(cache=True)
def start(link, i, t):
    """Start queued request ``i``'s copy at ``t`` (the link is idle)."""
    li = link.li
    n = li[L_NQ]
    for j in range(n):
        if link.queue[j] == i:
            link.queue[j] = link.queue[n - 1]
            break
    li[L_NQ] = n - 1
    if link.q_kind[i] == KIND_IN:
        li[L_PROMISED] -= link.q_blocks[i]
    li[L_ACTIVE] = i
    li[L_COPIES] += 1
    link.lf[LF_START] = t
    link.lf[LF_END] = t + link.q_dur[i]
    link.lf[LF_BUSY] += link.q_dur[i]
