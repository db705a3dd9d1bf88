"""Sessions between turns, seen from a router (``models/routing-lp.md`` (21)).

An agentic or chat session sends its next request after the previous one finished and
the client thought, ran a tool or waited for its user. Until it comes back, its context
sits in the prefix cache of the replica that served its last request, and that replica
is where it will go: anything queued there when it returns delays it.
:class:`SessionReturns` keeps, from the requests a router routed and the completions it
is shown, how many sessions are away from each replica and how fast sessions come back.
Every update is O(1) per routed request and per completion (amortized; a heap orders the
sessions away by finish time): nothing grows with the finished requests.
"""
from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

__all__ = ["SessionReturns"]


class SessionReturns:
    """Sessions away from each replica and the rate at which sessions return.

    ``resident`` (float64, ``(n_replicas,)``): sessions whose latest request finished on
    each replica and that have not sent their next one, counting a session only while it
    has been away no longer than the longest gap observed so far (a session away longer
    is taken as ended; before the first gap every session away counts). ``rate_per_s``: sessions' return rate, 1 / the mean observed gap
    between a request's finish and its session's next request (0 before any gap).
    """

    def __init__(self, n_replicas: int) -> None:
        self.reset(n_replicas)

    def reset(self, n_replicas: int) -> None:
        """Forget every session and gap."""
        self.resident = np.zeros(int(n_replicas))
        self._inflight: dict[int, tuple[int, int, float]] = {}  # request -> session, replica, arrival
        self._latest: dict[int, int] = {}                       # session -> latest request
        self._away: dict[int, list[Any]] = {}                   # session -> [replica, finish, counted]
        self._heap: list[tuple[float, int]] = []                # (finish, session) of counted ones
        self._gap_sum_s = 0.0
        self._gaps = 0
        self._gap_max_s = 0.0

    @property
    def rate_per_s(self) -> float:
        """Sessions' return rate (1/s): observed gaps over their total length; 0 before
        the first gap."""
        return self._gaps / self._gap_sum_s if self._gaps and self._gap_sum_s > 0 else 0.0

    def observe(self, now_s: float, completions: dict[str, np.ndarray] | None,
                session_id: np.ndarray) -> None:
        """Take the completions shown since the previous call (``RouterView.completions``)
        and the arriving requests' ``session_id`` (``-1``: no session) at ``now_s`` (s):
        finished latest requests make their session away from their replica, arriving
        sessions come back (their gap is recorded)."""
        if completions is not None and len(completions["request"]):
            for i, m, ttft, tpot, out in zip(completions["request"].tolist(),
                                             completions["replica"].tolist(),
                                             completions["ttft_s"].tolist(),
                                             completions["tpot_s"].tolist(),
                                             completions["output_tokens"].tolist()):
                rec = self._inflight.pop(i, None)
                if rec is None or self._latest.get(rec[0]) != i:
                    continue
                s, _, arrival_s = rec
                decode_s = tpot * (out - 1) if out > 1 and math.isfinite(tpot) else 0.0
                finish_s = arrival_s + ttft + decode_s
                self._away[s] = [int(m), finish_s, True]
                self.resident[m] += 1.0
                heapq.heappush(self._heap, (finish_s, s))
        for s in session_id.tolist():
            rec = self._away.pop(s, None) if s >= 0 else None
            if rec is None:
                continue
            m, finish_s, counted = rec
            if counted:
                self.resident[m] -= 1.0
            gap = max(now_s - finish_s, 0.0)
            self._gap_sum_s += gap
            self._gaps += 1
            self._gap_max_s = max(self._gap_max_s, gap)
        heap = self._heap
        while self._gaps and heap and heap[0][0] + self._gap_max_s < now_s:
            finish_s, s = heapq.heappop(heap)
            rec = self._away.get(s)
            if rec is not None and rec[2] and rec[1] == finish_s:
                rec[2] = False                  # away longer than any gap seen: ended
                self.resident[rec[0]] -= 1.0

    def routed(self, request: np.ndarray, session_id: np.ndarray, replica: np.ndarray,
               arrival_s: np.ndarray) -> None:
        """Record the replica each arriving request of a session went to (``arrival_s``:
        the trace arrival its TTFT is measured from)."""
        for i, s, m, a in zip(request.tolist(), session_id.tolist(), replica.tolist(),
                              arrival_s.tolist()):
            if s >= 0:
                self._inflight[i] = (s, m, a)
                self._latest[s] = i
