"""WAIT and Nested WAIT on the abstract round model, as plain reference simulations
(``models/wait-fluid.md``; Ao, Luo, Simchi-Levi, Wang, arXiv 2504.11320).

Round model: every iteration takes one unit; a request admitted in iteration ``t`` holds
its prompt ``l`` during ``t`` (its prefill), produces its first token at the end of ``t``
and, having produced ``p`` tokens, holds ``l + p`` in the next iteration; it finishes
when it has produced ``o``. Memory ``M`` tokens.

* :func:`wait_round` -- known lengths: type ``j`` releases ``n_j`` requests per iteration
  once ``n_j`` wait (the same rule as :class:`lpserve.policies.wait.WAIT`).
* :func:`nested_wait_round` -- unknown lengths. Decoding is cut into segments at the
  distinct output lengths ``d_1 < ... < d_K`` of the type mix: segment ``k`` runs from
  ``d_{k-1}`` to ``d_k`` produced tokens. A new request enters segment 1 in a cohort of
  ``n_1`` once ``n_1`` wait (WAIT's accumulation); a request that reaches ``d_{k-1}``
  tokens without finishing pauses (its KV stays resident) at the entry of segment ``k``,
  and at most ``n_k`` enter per iteration; inside a segment requests advance freely. The
  caps follow the survival of the mix, ``n_k = floor(n_1 q_k)`` with
  ``q_k = min(1, q_{k-1} (P_k / P_{k-1} + margin_k))`` (``P_k`` the share of arrivals with
  more than ``d_{k-1}`` tokens; the structure of the authors' public scheduler), ``n_1``
  the largest with ``sum_k n_k m_k + buffer <= M`` (``m_k`` the memory one request per
  stage of segment ``k`` holds), and ``buffer`` tokens kept for paused requests
  (:func:`nested_wait_caps`; ``models/wait-fluid.md`` (7)-(9), margins and buffer
  derived there). If memory still runs out, the newest running request is
  evicted and restarts from scratch (counted).

Both return the tokens produced and requests finished by the horizon, the peak memory
and the evictions; lpserve's engine cannot pause a running request with its KV resident,
which Nested WAIT needs, so Nested WAIT exists only here.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

__all__ = ["nested_wait_caps", "nested_wait_round", "wait_round"]


def _requests(arrival_round: Any, prompt_tokens: Any, output_tokens: Any):
    a = np.asarray(arrival_round, np.int64)
    s = np.asarray(prompt_tokens, np.int64)
    o = np.asarray(output_tokens, np.int64)
    if not (a.shape == s.shape == o.shape and a.ndim == 1):
        raise ValueError("wait_round: arrival_round, prompt_tokens and output_tokens must be "
                         "1-D of one length")
    if np.any(s < 1) or np.any(o < 1) or np.any(a < 0) or np.any(np.diff(a) < 0):
        raise ValueError("wait_round: tokens must be >= 1 and arrival rounds sorted, >= 0")
    return a, s, o


def wait_round(arrival_round: Any, prompt_tokens: Any, output_tokens: Any,
               thresholds: dict[tuple[int, int], int], memory_tokens: int,
               horizon: int) -> dict[str, Any]:
    """WAIT with known lengths for ``horizon`` iterations (types without a threshold use
    1). Returns ``tokens``, ``finished``, ``peak_memory``, ``overflow`` (iterations whose
    memory exceeded ``memory_tokens``; WAIT never evicts)."""
    a, s, o = _requests(arrival_round, prompt_tokens, output_tokens)
    queues: dict[tuple[int, int], deque] = {}
    running: list[list[int]] = []          # [index, produced]
    nxt = tokens = finished = peak = overflow = 0
    for t in range(int(horizon)):
        while nxt < a.size and a[nxt] <= t:
            queues.setdefault((int(s[nxt]), int(o[nxt])), deque()).append(nxt)
            nxt += 1
        for key, q in queues.items():
            n = thresholds.get(key, 1)
            if n > 0 and len(q) >= n:
                running.extend([q.popleft(), 0] for _ in range(n))
        mem = sum(int(s[i]) + p for i, p in running)
        peak = max(peak, mem)
        overflow += mem > memory_tokens
        for r in running:
            r[1] += 1
        tokens += len(running)
        done = [r for r in running if r[1] >= o[r[0]]]
        finished += len(done)
        running = [r for r in running if r[1] < o[r[0]]]
    return {"tokens": tokens, "finished": finished, "peak_memory": peak,
            "overflow": overflow}


def nested_wait_caps(prompt_tokens: Any, output_tokens: Any, rate: Any, memory_tokens: int,
                     *, margin: float | None = None, buffer_tokens: int | None = None,
                     horizon: int = 1000, delta: float = 0.01) -> dict[str, Any]:
    """Segments and per-iteration entry caps of Nested WAIT (module docstring) for a type
    mix (prompt, output, arrival rate per type).

    ``margin=None`` sets each segment's margin to one standard deviation of the share of a
    cohort that survives into it, ``sqrt(r_k (1 - r_k) / n_{k-1})`` with
    ``r_k = P_k / P_{k-1}`` (``models/wait-fluid.md`` (8)); ``buffer_tokens=None`` keeps
    room for ``b_k = ceil(sqrt(n_{k-1} r_k (1 - r_k)) / 2 * ln(horizon / delta))`` paused
    requests at each gate, each holding at most ``l_max + d_{k-1}`` tokens ((9): the level
    a queue with that drift and variance exceeds within ``horizon`` iterations with
    probability about ``delta``). Both shrink relative to the caps as memory grows.

    Returns ``bounds`` (``[d_0 = 0, d_1, ..., d_K]``), ``caps`` (``n_k``), ``survival``
    (``P_k``), ``margins``, ``buffer_tokens`` and ``memory`` (``sum n_k m_k``).
    """
    s = np.asarray(prompt_tokens, np.int64)
    o = np.asarray(output_tokens, np.int64)
    lam = np.asarray(rate, float)
    if not (s.shape == o.shape == lam.shape and s.size) or np.any(lam < 0) or lam.sum() <= 0:
        raise ValueError("nested_wait_caps: one prompt, output and rate > 0 per type")
    if (margin is not None and not margin >= 0) or (buffer_tokens is not None
                                                    and buffer_tokens < 0):
        raise ValueError(f"nested_wait_caps: margin and buffer_tokens must be >= 0, got "
                         f"{margin}, {buffer_tokens}")
    if not (horizon >= 1 and 0 < delta < 1):
        raise ValueError(f"nested_wait_caps: horizon >= 1 and 0 < delta < 1, got {horizon}, "
                         f"{delta}")
    d = np.r_[0, np.unique(o)]
    L = int(s.max())
    surv = np.array([lam[o > d[k - 1]].sum() / lam.sum() for k in range(1, d.size)])
    r = np.r_[1.0, surv[1:] / surv[:-1]]
    m = np.array([sum(L + p for p in range(int(d[k - 1]), int(d[k])))
                  for k in range(1, d.size)], float)
    n_prev = np.full(surv.size, float(memory_tokens) / max(float(m.sum()), 1.0))
    for _ in range(20):  # caps and margins depend on each other: iterate to a fixed point
        mar = np.zeros(surv.size)
        mar[1:] = margin if margin is not None else \
            np.sqrt(r[1:] * (1 - r[1:]) / np.maximum(n_prev[1:], 1.0))
        q = [1.0]
        for k in range(1, surv.size):
            q.append(min(1.0, q[-1] * (r[k] + mar[k])))
        if buffer_tokens is not None:
            buf = float(buffer_tokens)
        else:
            cnt = np.ceil(np.sqrt(n_prev[1:] * r[1:] * (1 - r[1:])) / 2.0
                          * math.log(horizon / delta))
            buf = float(np.sum(cnt * (L + d[1:-1])))
        room = float(memory_tokens) - buf
        n1 = int(math.floor(room / float(np.dot(q, m)))) if room > 0 else 0
        while n1 > 0 and sum(math.floor(n1 * qk + 1e-9) * mk for qk, mk in zip(q, m)) > room:
            n1 -= 1
        caps = [int(math.floor(n1 * qk + 1e-9)) for qk in q]
        new_prev = np.r_[float(n1), np.asarray(caps[:-1], float)]
        if np.array_equal(new_prev, n_prev):
            break
        n_prev = new_prev
    return {"bounds": d.tolist(), "caps": caps, "survival": surv.tolist(),
            "margins": mar.tolist(), "buffer_tokens": int(buf),
            "memory": int(sum(c * mk for c, mk in zip(caps, m)))}


def nested_wait_round(arrival_round: Any, prompt_tokens: Any, output_tokens: Any,
                      bounds: list[int], caps: list[int], memory_tokens: int,
                      horizon: int) -> dict[str, Any]:
    """Nested WAIT for ``horizon`` iterations with segment ``bounds`` and entry ``caps``
    from :func:`nested_wait_caps`. The policy never reads an output length: a request
    learns it has finished when it produces its last token. Returns ``tokens``,
    ``finished``, ``peak_memory``, ``evictions`` and ``max_paused``."""
    a, s, o = _requests(arrival_round, prompt_tokens, output_tokens)
    K = len(caps)
    if len(bounds) != K + 1 or bounds[0] != 0:
        raise ValueError("nested_wait_round: bounds must be [0, d_1, ..., d_K] with one cap "
                         "per segment")
    new: deque = deque()
    paused: list[deque] = [deque() for _ in range(K)]   # entry of segment k (k >= 1)
    running: list[list[int]] = []                        # [index, produced, segment]
    produced = np.zeros(a.size, np.int64)
    nxt = tokens = finished = peak = evictions = max_paused = 0
    for t in range(int(horizon)):
        while nxt < a.size and a[nxt] <= t:
            new.append(nxt)
            nxt += 1
        if caps[0] > 0 and len(new) >= caps[0]:
            running.extend([new.popleft(), 0, 0] for _ in range(caps[0]))
        for k in range(1, K):
            for _ in range(min(caps[k], len(paused[k]))):
                i = paused[k].popleft()
                running.append([i, int(produced[i]), k])
        held = sum(len(p) for p in paused)
        max_paused = max(max_paused, held)
        mem = sum(int(s[r[0]]) + r[1] for r in running) + \
            sum(int(s[i]) + int(produced[i]) for p in paused for i in p)
        while mem > memory_tokens and running:   # evict the newest running request
            i, p, _ = running.pop()
            mem -= int(s[i]) + p
            produced[i] = 0
            new.appendleft(i)
            evictions += 1
        peak = max(peak, mem)
        keep = []
        for r in running:
            r[1] += 1
            tokens += 1
            i = r[0]
            produced[i] = r[1]
            if r[1] >= o[i]:
                finished += 1
            elif r[2] + 1 < K and r[1] >= bounds[r[2] + 1]:
                paused[r[2] + 1].append(i)               # pause at the next segment's gate
            else:
                keep.append(r)
        running = keep
    return {"tokens": tokens, "finished": finished, "peak_memory": peak,
            "evictions": evictions, "max_paused": max_paused}
