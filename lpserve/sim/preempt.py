"""Preemption decisions of a replica: which running requests give way to outranking
waiting ones (``EngineConfig.priority_preemption``), the bound that keeps a decode run
from crossing such a decision, the victim of a memory preemption, and the view a
per-victim :class:`~lpserve.policy.hooks.PreemptionDecider` decides on
(``models/simulator.md``; the swap arithmetic is :mod:`lpserve.cost.preemption`).

Every function takes what it needs as arguments and returns its answer; the replica
(:mod:`lpserve.sim.replica`) carries it out.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from lpserve.cost import iteration_time
from lpserve.cost.preemption import compressed_host_blocks, swap_one_way_s
from lpserve.policy import PreemptionView
from lpserve.policy.checks import check_preemption_choice

__all__ = ["free_cap", "outranked_victims", "preemption_mode", "preemption_view",
           "worst_running"]

_BIG = 1 << 62


def worst_running(running: Sequence[int], ranks: dict[int, float]) -> int:
    """The running request with the worst ``(rank, position)`` (-1 if none): the victim of
    a memory preemption and of priority preemption."""
    best, key = -1, None
    for pos, i in enumerate(running):
        k = (ranks.get(i, math.inf), pos)
        if key is None or k > key:
            best, key = i, k
    return best


def outranked_victims(waiting: Sequence[int], running: Sequence[int],
                      ranks: dict[int, float], seats: int, free_blocks: int,
                      max_need: int, need: Callable[[int], int],
                      freed: Callable[[int, dict[int, int]], int]) -> list[int]:
    """``EngineConfig.priority_preemption``: the running requests to preempt, in order.

    For each waiting request in rank order (``+inf`` excluded) that cannot be admitted
    (no seat, or ``free_blocks`` short of its ``need``), the worst-ranked running requests
    are preempted while their rank is strictly worse than the waiting one's; a waiting
    request whose need exceeds ``max_need`` is skipped, and the scan stops at the first
    waiting request that does not outrank every victim so far. ``freed(v, taken)`` is the
    blocks preempting ``v`` frees after the victims before it (``taken`` counts the
    references those victims dropped per block).
    """
    order = sorted((ranks[i], pos, i) for pos, i in enumerate(waiting) if ranks[i] != math.inf)
    alive = list(running)
    victims: list[int] = []
    taken: dict[int, int] = {}
    floor = math.inf  # best rank among the victims so far
    for r, _, w in order:
        if r >= floor:
            break
        nd = need(w)
        if nd > max_need:
            continue
        while seats < 1 or free_blocks < nd:
            v = worst_running(alive, ranks)
            if v < 0 or ranks.get(v, math.inf) <= r:
                return victims
            alive.remove(v)
            victims.append(v)
            floor = min(floor, ranks.get(v, math.inf))
            seats += 1
            free_blocks += freed(v, taken)
        seats -= 1
        free_blocks -= nd
    return victims


def free_cap(running: Sequence[int], waiting: Sequence[int], ranks: dict[int, float],
             need: Callable[[int], int], available_blocks: int, max_need: int) -> int:
    """Most blocks a decode run may take before :func:`outranked_victims` could name a
    victim: the waiting requests that outrank a running one take free KV in rank order,
    and a preemption fires once it no longer covers their needs, which the reference
    mode checks every iteration. Conservative (all their needs together), so a run only
    ever stops early, never late; the needs do not change within a run (the run takes
    only plain free blocks, so no cached prefix is evicted). ``available_blocks`` is free
    plus evictable minus the watermark. Negative when the planner's blocks for the run's
    first iteration already crossed it: then only that iteration may run."""
    worst = max((ranks.get(i, math.inf) for i in running), default=-math.inf)
    needs = [n for n in (need(w) for w in waiting
                         if ranks[w] != math.inf and ranks[w] < worst) if n <= max_need]
    if not needs:
        return _BIG
    return available_blocks - sum(needs)


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


def preemption_mode(rep: Any, v: int, held: int) -> str:
    """The preemption mode of victim ``v`` of replica ``rep`` holding ``held`` blocks (the
    engine's, or its decider's choice, checked)."""
    d = rep.eng.preemption_decider
    if d is None:
        return rep.eng.preemption
    view = preemption_view(
        now_s=rep.now, replica=rep.index, request=v,
        context_tokens=int(rep.S.computed[v]), held_blocks=held, block_tokens=rep.bt,
        host_free_blocks=rep.host_free, eng=rep.eng, cost=rep.cost,
        params=rep.params)
    return check_preemption_choice(d.decide(view), rep.ctx.who("preemption_decider"))
