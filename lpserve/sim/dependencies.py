"""Parent links of agentic programs (``Trace.parent``): which requests a completion
releases, and when (``models/simulator.md`` rules 21-23).

A request with a parent is *released* (enters routing) at ``max(arrival_s, parent's
finish)``; a request whose parent never finishes (rejected, or unfinished at the horizon)
is never run and is reported with reason ``parent_not_finished``. A completion can thus
create an arrival before the next known one, so the event loop
(:class:`lpserve.sim.engine.Simulation`) advances replicas conservatively when a trace has
parents; this module only keeps the bookkeeping.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from lpserve.sim.state import PENDING, State

__all__ = ["REASON", "Dependencies", "has_dependencies"]

REASON = "parent_not_finished"


def has_dependencies(trace) -> bool:
    """Whether ``trace`` has at least one request with a parent."""
    return trace.parent is not None and bool(np.any(np.asarray(trace.parent) >= 0))


class Dependencies:
    """The release schedule of a trace with parent links.

    Roots (requests without a parent) arrive at their trace arrival; children are pushed
    onto a heap of ``(release_s, request)`` when their parent finishes.
    """

    def __init__(self, trace) -> None:
        """The children of each request of ``trace``, and its roots (no parent)."""
        parent = np.asarray(trace.parent, np.int64)
        self.trace_arrival = np.asarray(trace.arrival_s, np.float64)
        self.children: dict[int, list[int]] = {}
        for c in np.flatnonzero(parent >= 0).tolist():
            self.children.setdefault(int(parent[c]), []).append(c)
        self.roots = np.flatnonzero(parent < 0)
        self.unreleased = parent >= 0
        self.pos = 0  # next root to route
        self.heap: list[tuple[float, int]] = []

    def next_s(self) -> float:
        """Time of the next root arrival or release (``inf`` when none is known)."""
        t = math.inf
        if self.pos < self.roots.size:
            t = float(self.trace_arrival[self.roots[self.pos]])
        if self.heap:
            t = min(t, self.heap[0][0])
        return t

    def finished(self, i: int, t: float, not_before_s: float) -> list[tuple[float, int]]:
        """Request ``i`` finished at ``t``: its children with their release times (each
        ``max(arrival, t)``), now scheduled. ``not_before_s`` is the time of the last event
        already routed, which no release may precede."""
        out = []
        for c in self.children.get(i, ()):
            rel = max(float(self.trace_arrival[c]), float(t))
            if rel < not_before_s:
                raise RuntimeError(f"internal: request {c} released at {rel} before the "
                                   f"last routed event at {not_before_s}")
            heapq.heappush(self.heap, (rel, c))
            out.append((rel, c))
        return out

    def due(self, t: float) -> list[int]:
        """Roots arriving and children released at exactly ``t``, in trace order."""
        req = []
        while self.pos < self.roots.size and self.trace_arrival[self.roots[self.pos]] == t:
            req.append(int(self.roots[self.pos]))
            self.pos += 1
        while self.heap and self.heap[0][0] == t:
            req.append(heapq.heappop(self.heap)[1])
        req.sort()
        return req

    def label(self, state: State) -> None:
        """Report children that were never released (their parent did not finish)."""
        for c in np.flatnonzero(np.isnan(state.release)).tolist():
            if state.status[c] == PENDING:
                state.reason[c] = REASON
