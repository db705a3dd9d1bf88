"""Exact optima of tiny scheduling instances, by enumeration or dynamic programming.

These are the oracles the property tests compare formulations and online policies
against. Nothing here calls a solver, so a bug in a MIP model cannot hide behind the same
bug in its checker.

* :class:`KVProblem` — the KV-constrained round model of Jaillet et al.
  (``models/schedule-ip.md`` (1)–(4)); :func:`kv_optimal` solves it by dynamic
  programming over rounds (``models/schedule-ip.md`` (9)).
* single machine, integer data: :func:`preemptive_flow_optimal` (1|r_j,pmtn|ΣF_j, DP over
  unit slots), :func:`srpt_flow`, :func:`nonpreemptive_flow_optimal` (1|r_j|ΣF_j, all
  orders), :func:`weighted_completion_optimal` (1|r_j|Σw_jC_j, all orders) and
  :func:`wspt_order` (Smith's rule).
"""
from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np


def _int_array(values: Any, field: str, *, minimum: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{field} must be a 1-D array, got shape {arr.shape}")
    if arr.size and (not np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{field} must hold integers, got dtype {arr.dtype}")
    if arr.size and np.any(arr != np.round(arr)):
        raise ValueError(f"{field} must hold integers, got {arr[arr != np.round(arr)][0]!r}")
    out = arr.astype(np.int64)
    if out.size and out.min() < minimum:
        bad = int(np.argmin(out))
        raise ValueError(f"{field}[{bad}] must be >= {minimum}, got {out[bad]}")
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class KVProblem:
    """One worker with KV memory ``memory_tokens``; request ``i`` arrives in round
    ``arrival_round[i]``, holds ``prompt_tokens[i] + j`` tokens while producing its
    ``j``-th output token, and runs every round from its start until it finishes
    (``models/schedule-ip.md`` (3a), Jaillet et al.'s convention). A simulated request with
    prompt ``p`` holds ``p + j - 1`` (the newest token's KV is written when it is fed back,
    ``models/simulator.md`` (2)), so :meth:`from_instance` sets ``s_i = p_i - 1``.

    Attributes (arrays shape ``(n,)``, int64):
        arrival_round: a_i, first round in which i may start (>= 0).
        prompt_tokens: s_i (>= 0).
        output_tokens: o_i (>= 1).
        memory_tokens: M (>= 1).
    """

    arrival_round: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    memory_tokens: int

    @classmethod
    def from_arrays(cls, arrival_round: Any, prompt_tokens: Any, output_tokens: Any,
                    memory_tokens: int) -> "KVProblem":
        """A validated problem from array-likes: ``arrival_round >= 0``,
        ``prompt_tokens >= 0`` and ``output_tokens >= 1`` (integers of one length ``n``) and an
        integer ``memory_tokens >= 1``; a ValueError names the first bad field."""
        a = _int_array(arrival_round, "arrival_round", minimum=0)
        s = _int_array(prompt_tokens, "prompt_tokens", minimum=0)
        o = _int_array(output_tokens, "output_tokens", minimum=1)
        if not (a.shape == s.shape == o.shape):
            raise ValueError(f"arrival_round, prompt_tokens, output_tokens must have one "
                             f"length, got {a.size}, {s.size}, {o.size}")
        if isinstance(memory_tokens, bool) or int(memory_tokens) != memory_tokens \
                or memory_tokens < 1:
            raise ValueError(f"memory_tokens must be a positive integer, got {memory_tokens!r}")
        return cls(a, s, o, int(memory_tokens))

    @classmethod
    def from_instance(cls, instance: Any, memory_tokens: int | None = None,
                      round_s: float = 1.0) -> "KVProblem":
        """The abstract model of ``instance`` as the simulator runs it: rounds of
        ``round_s`` seconds, arrivals rounded up to the next round boundary, ``s_i`` the
        prompt minus one (the KV a request holds besides the token it is producing,
        ``models/schedule-ip.md`` (3b)); ``memory_tokens`` defaults to the instance's
        ``UnitRoundCost(memory_tokens=M)``."""
        if memory_tokens is None:
            cost = getattr(instance, "cost", None)
            memory_tokens = getattr(cost, "memory_tokens", None)
            if memory_tokens is None:
                raise ValueError("memory_tokens: the instance has no UnitRoundCost "
                                 f"(cost={cost!r}); pass memory_tokens=M")
        if not round_s > 0:
            raise ValueError(f"round_s must be > 0, got {round_s!r}")
        t = instance.trace
        arr = np.ceil(np.asarray(t.arrival_s, dtype=np.float64) / round_s - 1e-9)
        prompt = np.asarray(t.prompt_tokens, np.int64)
        return cls.from_arrays(np.maximum(arr, 0), prompt - 1, t.output_tokens,
                               int(memory_tokens))

    @property
    def n(self) -> int:
        """Number of requests."""
        return int(self.arrival_round.size)

    def peak_tokens(self) -> np.ndarray:
        """s_i + o_i, each request's peak KV (tokens), shape (n,)."""
        return self.prompt_tokens + self.output_tokens

    def oversized(self) -> np.ndarray:
        """Indices of requests whose peak exceeds memory (the instance is infeasible)."""
        return np.flatnonzero(self.peak_tokens() > self.memory_tokens)

    def area_token_rounds(self) -> np.ndarray:
        """sum_{j=1..o_i} (s_i + j) = s_i o_i + o_i (o_i + 1) / 2, shape (n,)
        (``models/lower-bounds.md`` (2))."""
        s, o = self.prompt_tokens, self.output_tokens
        return s * o + o * (o + 1) // 2


def memory_profile(problem: KVProblem, start_round: Any) -> np.ndarray:
    """Tokens held in each round ``r = 0..T`` by the schedule ``start_round`` (shape
    ``(T + 1,)``, ``T = max(start + o)``): request i holds s_i + (r - k_i) in rounds
    ``k_i + 1 .. k_i + o_i`` (``models/schedule-ip.md`` (3))."""
    k = np.asarray(start_round, dtype=np.int64)
    o, s = problem.output_tokens, problem.prompt_tokens
    T = int((k + o).max()) if k.size else 0
    mem = np.zeros(T + 1, dtype=np.int64)
    for i in range(k.size):
        r = np.arange(k[i] + 1, k[i] + o[i] + 1)
        mem[r] += s[i] + (r - k[i])
    return mem


def total_latency(problem: KVProblem, start_round: Any) -> int:
    """sum_i (k_i + o_i - a_i) in rounds (``models/schedule-ip.md`` (1))."""
    k = np.asarray(start_round, dtype=np.int64)
    return int(np.sum(k + problem.output_tokens - problem.arrival_round))


def check_schedule(problem: KVProblem, start_round: Any) -> list[str]:
    """Violations of the model by ``start_round`` (empty when feasible)."""
    k = np.asarray(start_round, dtype=np.int64)
    errs = []
    if k.shape != (problem.n,):
        return [f"start_round has shape {k.shape}, expected ({problem.n},)"]
    early = np.flatnonzero(k < problem.arrival_round)
    errs += [f"request {i} starts in round {k[i]} before its arrival "
             f"{problem.arrival_round[i]}" for i in early]
    mem = memory_profile(problem, k)
    over = np.flatnonzero(mem > problem.memory_tokens)
    errs += [f"round {r} holds {mem[r]} tokens > memory {problem.memory_tokens}" for r in over]
    return errs


def kv_optimal(problem: KVProblem, max_states: int = 3_000_000) -> tuple[int, np.ndarray]:
    """Minimum total latency (rounds) and optimal start rounds, by dynamic programming
    over rounds (``models/schedule-ip.md`` (9)).

    State: the round (capped at the last arrival, after which the cost-to-go is
    time-invariant), the set of unstarted requests and the elapsed rounds of the running
    ones. Every feasible start set is tried each round, except idling with an empty
    machine once everything has arrived (shifting such a schedule one round earlier is
    feasible and strictly better). Exponential: meant for n <= ~8.

    Raises ValueError if a request's peak exceeds memory (no schedule exists) or the
    state space exceeds ``max_states``.
    """
    bad = problem.oversized()
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"request {i} needs {int(problem.peak_tokens()[i])} tokens > "
                         f"memory_tokens {problem.memory_tokens}: infeasible")
    a = problem.arrival_round.tolist()
    s = problem.prompt_tokens.tolist()
    o = problem.output_tokens.tolist()
    M, n = problem.memory_tokens, problem.n
    if n == 0:
        return 0, np.zeros(0, dtype=np.int64)
    a_max = max(a)
    memo: dict[tuple, tuple[float, tuple]] = {}

    def fits(committed: list[tuple[int, int]]) -> bool:
        # memory in future round t + d is sum over (i, e) with e + d <= o_i of s_i + e + d;
        # it is piecewise increasing, so check d at each completion
        for i0, e0 in committed:
            d = o[i0] - e0
            tot = 0
            for i, e in committed:
                if e + d <= o[i]:
                    tot += s[i] + e + d
            if tot > M:
                return False
        return True

    def value(t: int, unstarted: frozenset, running: tuple) -> tuple[float, tuple]:
        # (min over schedules of sum_{i unstarted} (k_i - t), the start set U chosen at t)
        key = (min(t, a_max), unstarted, running)
        hit = memo.get(key)
        if hit is not None:
            return hit
        if len(memo) > max_states:
            raise ValueError(f"kv_optimal: more than max_states={max_states} states; "
                             f"the instance (n={n}) is too large for enumeration")
        if not unstarted:
            return 0, ()
        avail = sorted(i for i in unstarted if a[i] <= t)
        best = (math.inf, ())
        base = list(running)

        def options(pos: int, chosen: list[int]):
            yield chosen
            for q in range(pos, len(avail)):
                cand = chosen + [avail[q]]
                if fits(base + [(i, 0) for i in cand]):
                    yield from options(q + 1, cand)

        for U in options(0, []):
            if not U and not running and t >= a_max:
                continue  # idling an empty machine after the last arrival is dominated
            rest = unstarted.difference(U)
            nxt = tuple(sorted((i, e + 1) for i, e in base + [(i, 0) for i in U]
                               if e + 1 < o[i]))
            v = value(t + 1, rest, nxt)[0] + len(rest)
            if v < best[0]:
                best = (v, tuple(U))
        memo[key] = best
        return best

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        v, _ = value(0, frozenset(range(n)), ())
        start = _replay_plan(problem, value)
    finally:
        sys.setrecursionlimit(old)
    return int(v + sum(o) - sum(a)), start


def _replay_plan(problem: KVProblem, value: Any) -> np.ndarray:
    """Walk the memoized decisions from round 0 and record each start round."""
    o = problem.output_tokens.tolist()
    n = problem.n
    start = np.full(n, -1, dtype=np.int64)
    t, unstarted, running = 0, frozenset(range(n)), ()
    while unstarted:
        U = value(t, unstarted, running)[1]
        for i in U:
            start[i] = t
        rest = unstarted.difference(U)
        running = tuple(sorted((i, e + 1) for i, e in list(running) + [(i, 0) for i in U]
                               if e + 1 < o[i]))
        unstarted, t = rest, t + 1
    return start


# ============================================================ single machine, integer data
def _jobs(release: Any, proc: Any) -> tuple[list[int], list[int]]:
    p = _int_array(proc, "proc", minimum=1).tolist()
    r = (_int_array(release, "release", minimum=0).tolist() if release is not None
         else [0] * len(p))
    if len(r) != len(p):
        raise ValueError(f"release has {len(r)} entries but proc has {len(p)}")
    return r, p


def srpt_flow(release: Any, proc: Any) -> int:
    """Total flow time sum_j (C_j - r_j) of Shortest Remaining Processing Time on unit
    slots (ties by index); optimal for 1|r_j,pmtn|ΣF_j (Schrage 1968)."""
    r, p = _jobs(release, proc)
    rem, t, flow = list(p), 0, 0
    left = len(p)
    while left:
        avail = [j for j in range(len(p)) if r[j] <= t and rem[j] > 0]
        if not avail:
            t = min(r[j] for j in range(len(p)) if rem[j] > 0)
            continue
        j = min(avail, key=lambda q: (rem[q], q))
        rem[j] -= 1
        t += 1
        if rem[j] == 0:
            flow += t - r[j]
            left -= 1
    return flow


def preemptive_flow_optimal(release: Any, proc: Any) -> int:
    """Minimum total flow time with preemption at integer times, by DP over unit slots
    (state: time capped at the last release, remaining work vector)."""
    r, p = _jobs(release, proc)
    n, r_max = len(p), max(r) if r else 0
    memo: dict[tuple, int] = {}

    def V(t: int, rem: tuple) -> int:
        # cost-to-go = number of released, unfinished jobs summed over future unit slots
        if not any(rem):
            return 0
        key = (min(t, r_max), rem)
        if key in memo:
            return memo[key]
        in_sys = sum(1 for j in range(n) if rem[j] > 0 and r[j] <= t)
        avail = [j for j in range(n) if rem[j] > 0 and r[j] <= t]
        best = math.inf
        if not avail:
            best = V(t + 1, rem)
        for j in avail:
            nxt = list(rem)
            nxt[j] -= 1
            best = min(best, in_sys + V(t + 1, tuple(nxt)))
        memo[key] = best
        return best

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        return int(V(0, tuple(p)))
    finally:
        sys.setrecursionlimit(old)


def _sequence_completions(order: tuple[int, ...], r: list[int], p: list[int]) -> list[int]:
    t, c = 0, [0] * len(p)
    for j in order:
        t = max(t, r[j]) + p[j]
        c[j] = t
    return c


def nonpreemptive_flow_optimal(release: Any, proc: Any) -> tuple[int, tuple[int, ...]]:
    """Minimum total flow time without preemption (1|r_j|ΣF_j) over all n! orders, each
    job started as early as its order allows (optimal for a fixed order)."""
    r, p = _jobs(release, proc)
    best = (math.inf, ())
    for order in itertools.permutations(range(len(p))):
        c = _sequence_completions(order, r, p)
        v = sum(c[j] - r[j] for j in range(len(p)))
        if v < best[0]:
            best = (v, order)
    return int(best[0]), best[1]


def weighted_completion_optimal(proc: Any, weight: Any, release: Any = None
                                ) -> tuple[float, tuple[int, ...]]:
    """Minimum sum_j w_j C_j without preemption over all n! orders (1|r_j|Σw_jC_j;
    1||Σw_jC_j when ``release`` is None)."""
    r, p = _jobs(release, proc)
    w = np.asarray(weight, dtype=np.float64)
    if w.shape != (len(p),) or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError(f"weight must be {len(p)} finite non-negative numbers, got {weight!r}")
    best = (math.inf, ())
    for order in itertools.permutations(range(len(p))):
        c = _sequence_completions(order, r, p)
        v = float(np.dot(w, c))
        if v < best[0] - 1e-12:
            best = (v, order)
    return best[0], best[1]


def wspt_order(proc: Any, weight: Any) -> tuple[int, ...]:
    """Smith's rule: non-decreasing p_j / w_j (ties by index); optimal for 1||Σw_jC_j."""
    _, p = _jobs(None, proc)
    w = np.asarray(weight, dtype=np.float64)
    ratio = [p[j] / w[j] if w[j] > 0 else math.inf for j in range(len(p))]
    return tuple(sorted(range(len(p)), key=lambda j: (ratio[j], j)))


def weighted_completion(order: Any, proc: Any, weight: Any, release: Any = None) -> float:
    """sum_j w_j C_j of the non-preemptive schedule following ``order``."""
    r, p = _jobs(release, proc)
    c = _sequence_completions(tuple(order), r, p)
    return float(np.dot(np.asarray(weight, dtype=np.float64), c))
