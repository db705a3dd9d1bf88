"""The read-only views a compiled replica builds for its policy's hooks written in Python:
the scheduler's candidates, the budget controller's iterations, a preemption decider's
victim (the view types are in :mod:`lpserve.policy`).

Each function reads the replica it is given and returns a fresh view; nothing here
changes the replica.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from lpserve.arrays import readonly
from lpserve.cost import iteration_time
from lpserve.cost.preemption import compressed_host_blocks, swap_one_way_s
from lpserve.policy import (
    BudgetView,
    DecodeRunView,
    IterationView,
    PreemptionView,
    RequestEvent,
    SchedulerView,
)
from lpserve.sim.state import WAITING

__all__ = ["budget_view", "cached_estimate", "decode_run_view", "iteration_view",
           "preemption_view", "request_event", "scheduler_view"]

PREFIX_ESTIMATE_MAX = 256  # waiting requests whose cached prefix is estimated or matched


def cached_estimate(rep: Any, cand: Sequence[int]) -> np.ndarray:
    """Prompt tokens of each candidate found in ``rep``'s prefix cache (int64).

    As SGLang (``WAITING_QUEUE_PREFIX_MATCH_MAX``), only the first
    ``PREFIX_ESTIMATE_MAX`` candidates are matched against the cache, and only waiting
    ones that are not swapped out; the rest read 0.
    """
    out = np.zeros(len(cand), np.int64)
    bm, S = rep.bm, rep.S
    if not rep.eng.prefix_caching or bm.used - bm.anon_used + bm.evictable == 0:
        return out
    for k, i in enumerate(cand[:PREFIX_ESTIMATE_MAX]):
        if S.status[i] == WAITING and not S.swapped[i]:
            out[k] = rep.cached_prefix_tokens(i)
    return out


def scheduler_view(rep: Any, cand: Sequence[int]) -> SchedulerView:
    """The :class:`~lpserve.policy.SchedulerView` of ``rep``'s candidates ``cand``
    (waiting ones first, then running, as ``rep`` lists them)."""
    S, ctx = rep.S, rep.ctx
    idx = np.asarray(cand, np.int64)
    tr = S.trace
    return SchedulerView(
        now_s=rep.now, replica=rep.index, request=readonly(idx),
        arrival_s=readonly(S.arrival[idx]), prompt_tokens=readonly(S.prompt[idx]),
        generated_tokens=readonly(S.gen[idx]), computed_tokens=readonly(S.computed[idx]),
        cached_tokens=readonly(cached_estimate(rep, cand)),
        running=readonly(np.arange(len(cand)) >= len(rep.waiting)),
        swapped=readonly(S.swapped[idx]), preemptions=readonly(S.preempt[idx]),
        first_scheduled_s=readonly(S.first_sched[idx]), tenant=readonly(S.tenant[idx]),
        session_id=readonly(S.session[idx]),
        predicted_lo=None if ctx.pred_lo is None else readonly(ctx.pred_lo[idx]),
        predicted_hi=None if ctx.pred_hi is None else readonly(ctx.pred_hi[idx]),
        output_tokens=readonly(S.out[idx]) if ctx.policy.meta.clairvoyant else None,
        free_blocks=rep.bm.available, total_blocks=rep.bm.total, block_tokens=rep.bt,
        program_id=None if tr.program_id is None else readonly(tr.program_id[idx]),
        parent=None if tr.parent is None else readonly(tr.parent[idx]))


def budget_view(rep: Any, decodes: Sequence[int], cap_tokens: int) -> BudgetView:
    """The :class:`~lpserve.policy.BudgetView` of ``rep``'s next decode-first iteration
    with these ``decodes`` and at most ``cap_tokens`` prefill tokens."""
    S = rep.S
    cand = rep.waiting + rep.running
    idx = np.asarray(cand, np.int64)
    ranks = rep.ranks() if cand else {}
    return BudgetView(
        now_s=rep.now, replica=rep.key, cost_params=readonly(rep.params),
        block_tokens=rep.bt, used_blocks=rep.bm.used, total_blocks=rep.bm.total,
        cap_tokens=int(cap_tokens),
        decode_context=readonly(S.computed[np.asarray(decodes, np.int64)]),
        request=readonly(idx), tenant=readonly(S.tenant[idx]),
        left_tokens=readonly(S.prompt[idx] + S.gen[idx] - S.computed[idx]),
        computed_tokens=readonly(S.computed[idx]),
        waiting=readonly(np.arange(len(cand)) < len(rep.waiting)),
        resumable=readonly(S.swapped[idx] | S.kv_remote[idx]),
        rank=readonly(np.array([ranks[i] for i in cand], np.float64)))


def iteration_view(rep: Any, dt_s: float, chunk_tokens: np.ndarray,
                   chunk_cached: np.ndarray, decode_context: np.ndarray,
                   produced: Sequence[int]) -> IterationView:
    """The :class:`~lpserve.policy.IterationView` of the iteration ``rep`` just ran
    (``decode_context``: the decodes' contexts before it; ``produced``: requests that
    produce a token in it, before their outputs are counted)."""
    d = np.asarray(produced, np.int64)
    return IterationView(
        now_s=rep.now, dt_s=float(dt_s), replica=rep.key, cost_params=readonly(rep.params),
        used_blocks=rep.bm.used, total_blocks=rep.bm.total,
        chunk_tokens=readonly(chunk_tokens), chunk_cached=readonly(chunk_cached),
        decode_context=readonly(decode_context, copy=True), produced_request=readonly(d),
        produced_generated=readonly(rep.S.gen[d]))


def decode_run_view(rep: Any, request: np.ndarray, context: np.ndarray,
                    held_blocks: np.ndarray, max_iters: int) -> DecodeRunView:
    """The :class:`~lpserve.policy.DecodeRunView` of a decode run starting now."""
    return DecodeRunView(
        now_s=rep.now, replica=rep.key, cost_params=readonly(rep.params),
        used_blocks=rep.bm.used, total_blocks=rep.bm.total, request=readonly(request),
        context=readonly(context, copy=True), held_blocks=readonly(held_blocks, copy=True),
        max_iters=int(max_iters))


def request_event(rep: Any, kind: str, i: int) -> RequestEvent:
    """Request ``i`` ``"arrive"``-d at or ``"finish"``-ed on ``rep`` now: the event an
    evictor that observes requests is told (the finished request's prompt block keys and
    wait kind; nothing of them on arrival)."""
    S, fin = rep.S, kind == "finish"
    p = int(S.prompt[i])
    return RequestEvent(
        kind, rep.now, rep.index, i, int(S.thread[i]), int(S.wait[i]) if fin else -1,
        p, p + int(S.gen[i]) if fin else p, rep.bt, rep.bm.total,
        tuple(S.block_keys(i, rep.bt)) if fin else ())


def preemption_view(*, now_s: float, replica: int, request: int, context_tokens: int,
                    held_blocks: int, block_tokens: int, host_free_blocks: int, eng: Any,
                    cost: Any, params: np.ndarray) -> PreemptionView:
    """The :class:`~lpserve.policy.hooks.PreemptionView` of one victim, priced by ``cost``
    (``models/kv-compression-swap.md`` (1)-(5))."""
    ctx = int(context_tokens)
    rec = float(iteration_time(params, np.array([ctx], np.int64), np.zeros(1, np.int64),
                               np.zeros(0, np.int64))) if ctx else 0.0
    ratio = float(eng.compression_ratio)
    return PreemptionView(
        now_s=now_s, replica=replica, request=int(request), context_tokens=ctx,
        held_blocks=int(held_blocks), block_tokens=block_tokens,
        host_free_blocks=int(host_free_blocks), compression_ratio=ratio,
        compression_accuracy_cost=float(eng.compression_accuracy_cost),
        recompute_s=rec,
        swap_s=2.0 * swap_one_way_s(cost, held_blocks, block_tokens, "swap", ratio),
        compress_swap_s=2.0 * swap_one_way_s(cost, held_blocks, block_tokens, "compress-swap",
                                             ratio),
        swap_host_blocks=int(held_blocks),
        compress_host_blocks=compressed_host_blocks(held_blocks, ratio))
