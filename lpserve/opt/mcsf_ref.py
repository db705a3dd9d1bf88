"""MC-SF (Memory-Constrained Shortest First) of Jaillet et al. (arXiv 2502.07115) on the
abstract round model, as a plain reference algorithm.

Each round ``t``: requests already started keep running; arrived, unstarted requests are
sorted by predicted output length (ties by arrival round, then index) and the longest
prefix of that order is started such that, for every future round up to the last
predicted completion, the committed memory stays within ``M`` (``models/schedule-ip.md``
(10)). The first request that does not fit stops the round. With predictions
``predicted >= output`` the realized memory never exceeds ``M``.

Used as the incumbent that warm-starts and windows the scheduling IP, and as the online
algorithm whose ratio to the IP optimum ``tests/slow/test_opt_mcsf.py`` measures.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.opt.budget import Deadline, TimeLimitReached
from lpserve.opt.exact import KVProblem


def mcsf_schedule(problem: KVProblem, predicted_tokens: Any = None,
                  priority: Any = None, deadline: Deadline | None = None) -> np.ndarray:
    """Start round of each request under MC-SF, int64 shape ``(n,)``.

    Args:
        problem: the instance.
        predicted_tokens: õ_i, predicted output lengths (tokens), shape ``(n,)``; each
            must be ``>= output_tokens[i]`` for the memory guarantee (defaults to the true
            lengths).
        priority: order key per request (lower first), shape ``(n,)``; default the
            predicted length (MC-SF). Arrival round gives MC-Benchmark (FCFS with the same
            memory check).
        deadline: a :class:`~lpserve.opt.budget.Deadline`, checked every round and every
            trial start; :class:`~lpserve.opt.budget.TimeLimitReached` once it passed.

    Raises ValueError naming the request if ``s_i + õ_i > M`` (it could never start) or a
    prediction is below the true length.
    """
    n, M = problem.n, problem.memory_tokens
    a = problem.arrival_round.tolist()
    s = problem.prompt_tokens.tolist()
    o = problem.output_tokens.tolist()
    if predicted_tokens is None:
        p = list(o)
    else:
        pa = np.asarray(predicted_tokens)
        if pa.shape != (n,):
            raise ValueError(f"predicted_tokens must have shape ({n},), got {pa.shape}")
        p = [int(x) for x in pa]
        low = [i for i in range(n) if p[i] < o[i]]
        if low:
            raise ValueError(f"predicted_tokens[{low[0]}] = {p[low[0]]} is below the true "
                             f"output {o[low[0]]}; MC-SF needs predictions >= outputs")
    key = list(p) if priority is None else [float(x) for x in np.asarray(priority)]
    if len(key) != n:
        raise ValueError(f"priority must have shape ({n},), got {np.shape(priority)}")
    for i in range(n):
        if s[i] + p[i] > M:
            raise ValueError(f"request {i} needs s + predicted = {s[i] + p[i]} tokens > "
                             f"memory_tokens {M}; it can never start")
    order_all = sorted(range(n), key=lambda i: (a[i], i))
    start = [-1] * n
    running: list[int] = []        # started, predicted not yet finished
    waiting: list[int] = []        # arrived, not started
    nxt, t, left = 0, 0, n
    check = deadline.check if deadline is not None and deadline.limited else None
    while left:
        if check is not None:
            check("running the memory-check greedy")
        while nxt < n and a[order_all[nxt]] <= t:
            waiting.append(order_all[nxt])
            nxt += 1
        running = [i for i in running if start[i] + p[i] > t]
        if not waiting:
            if not running and nxt < n:
                t = a[order_all[nxt]]
                continue
            t += 1
            continue
        waiting.sort(key=lambda i: (key[i], a[i], i))
        committed = [(s[i], start[i], p[i]) for i in running]   # (s, start, predicted)
        chosen: list[int] = []
        for j in waiting:
            if check is not None:
                check("running the memory-check greedy")
            trial = committed + [(s[j], t, p[j])]
            if _fits(trial, t, M):
                committed = trial
                chosen.append(j)
            else:
                break
        for j in chosen:
            start[j] = t
            running.append(j)
            left -= 1
        if chosen:
            chosen_set = set(chosen)
            waiting = [i for i in waiting if i not in chosen_set]
        t += 1
    return np.asarray(start, dtype=np.int64)


def _fits(committed: list[tuple[int, int, int]], t: int, M: int) -> bool:
    """Memory of ``committed`` (s, start, predicted) within M at every round after ``t``;
    the curve rises between completions, so checking each predicted completion suffices.
    Quadratic in the batch: plain Python for small batches, numpy above 24."""
    if len(committed) > 24:
        c = np.asarray(committed, np.int64)
        sc, kc, pc = c[:, 0], c[:, 1], c[:, 2]
        r = kc + pc
        r = r[r > t]
        act = (kc[None, :] < r[:, None]) & (r[:, None] <= (kc + pc)[None, :])
        load = np.where(act, sc[None, :] + r[:, None] - kc[None, :], 0).sum(axis=1)
        return bool(load.size == 0 or load.max() <= M)
    for _, k0, p0 in committed:
        r = k0 + p0
        if r <= t:
            continue
        tot = 0
        for sc, kc, pc in committed:
            if kc < r <= kc + pc:
                tot += sc + r - kc
        if tot > M:
            return False
    return True


def mcsf_latency(problem: KVProblem, predicted_tokens: Any = None) -> int:
    """Total latency (rounds) of MC-SF on ``problem`` (true lengths decide completions)."""
    k = mcsf_schedule(problem, predicted_tokens)
    return int(np.sum(k + problem.output_tokens - problem.arrival_round))


def best_memory_safe_schedule(problem: KVProblem,
                              deadline: Deadline | None = None) -> np.ndarray:
    """The best (least total latency) of the memory-check greedy under several orders:
    predicted length (MC-SF), peak s + o, area s o + o^2 / 2, and arrival (MC-Benchmark).
    Used as the IP's incumbent and to size its start windows. Past ``deadline`` it raises
    :class:`~lpserve.opt.budget.TimeLimitReached` whose ``partial["incumbent"]`` is the
    best schedule of the orders finished so far (None if none finished)."""
    o, s = problem.output_tokens, problem.prompt_tokens
    best, best_v = None, None
    for key in (o, s + o, problem.area_token_rounds(), problem.arrival_round):
        try:
            k = mcsf_schedule(problem, priority=key, deadline=deadline)
        except TimeLimitReached as exc:
            raise TimeLimitReached("searching the greedy schedules",
                                   {"incumbent": best}) from exc
        v = int(np.sum(k + o - problem.arrival_round))
        if best_v is None or v < best_v:
            best, best_v = k, v
    return best
