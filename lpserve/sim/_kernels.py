"""Numba kernels of the simulator, each beside a plain-Python ``_ref`` twin.

``decode_advance`` advances a fixed batch of decoding requests through whole runs of
iterations between two events, with exact per-iteration times from the cost kernel.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from lpserve.cost import iteration_time, iteration_time_ref

# why a run of decode iterations stopped
STOP_LIMIT = 0    # max_iters reached
STOP_TIME = 1     # the next iteration would start at or after stop_s
STOP_MEMORY = 2   # the next iteration needs more new blocks than are free without eviction
STOP_DONE = 3     # a request produced its last token in the iteration just run


@njit(cache=True)
def decode_advance(params, ctx, gen, out, held, block_tokens, free_blocks, used_blocks,
                   now_s, stop_s, max_iters):
    """Run pure-decode iterations of one batch in place until an event.

    Args:
        params: cost-model parameters (float64), see ``lpserve.cost.iteration_time``.
        ctx: int64 ``(m,)`` tokens in KV per request (the decode context); +1 per iteration.
        gen: int64 ``(m,)`` output tokens produced so far; +1 per iteration.
        out: int64 ``(m,)`` output tokens each request will produce in total.
        held: int64 ``(m,)`` KV blocks held; +1 when an iteration's token needs a new block.
        block_tokens: tokens per KV block.
        free_blocks: blocks that can be taken without eviction.
        used_blocks: blocks in use on the replica at the start (for the utilization integral).
        now_s: start time of the next iteration (s).
        stop_s: no iteration starts at or after this time (s).
        max_iters: most iterations to run.

    An empty batch returns at once with ``STOP_DONE``.

    Returns:
        ``(n_iters, now_s, new_blocks, stop_reason, used_block_seconds)``: iterations run,
        end time of the last one, blocks taken, one of the ``STOP_*`` codes, and the
        integral of blocks in use over the run (block * s).
    """
    empty = np.zeros(0, np.int64)
    m = ctx.shape[0]
    n = 0
    taken = 0
    area = 0.0
    reason = STOP_LIMIT
    if m == 0:  # an empty batch takes no time: nothing to run
        return n, now_s, taken, STOP_DONE, area
    while n < max_iters:
        if now_s >= stop_s:
            reason = STOP_TIME
            break
        need = 0
        for j in range(m):
            if ctx[j] + 1 > held[j] * block_tokens:
                need += 1
        if taken + need > free_blocks:
            reason = STOP_MEMORY
            break
        dt = iteration_time(params, empty, empty, ctx)
        now_s += dt
        done = False
        for j in range(m):
            if ctx[j] + 1 > held[j] * block_tokens:
                held[j] += 1
            ctx[j] += 1
            gen[j] += 1
            if gen[j] >= out[j]:
                done = True
        taken += need
        area += (used_blocks + taken) * dt
        n += 1
        if done:
            reason = STOP_DONE
            break
    return n, now_s, taken, reason, area


def decode_advance_ref(params, ctx, gen, out, held, block_tokens, free_blocks, used_blocks,
                       now_s, stop_s, max_iters, iter_time=iteration_time_ref):
    """Plain-Python twin of :func:`decode_advance` (same arguments and results)."""
    m = len(ctx)
    n = taken = 0
    area = 0.0
    reason = STOP_LIMIT
    if m == 0:
        return n, now_s, taken, STOP_DONE, area
    while n < max_iters:
        if now_s >= stop_s:
            reason = STOP_TIME
            break
        grows = [ctx[j] + 1 > held[j] * block_tokens for j in range(m)]
        if taken + sum(grows) > free_blocks:
            reason = STOP_MEMORY
            break
        dt = float(iter_time(params, np.zeros(0, np.int64), np.zeros(0, np.int64),
                             np.asarray(ctx, np.int64)))
        now_s += dt
        for j in range(m):
            held[j] += int(grows[j])
            ctx[j] += 1
            gen[j] += 1
        taken += sum(grows)
        area += (used_blocks + taken) * dt
        n += 1
        if any(gen[j] >= out[j] for j in range(m)):
            reason = STOP_DONE
            break
    return n, now_s, taken, reason, area
