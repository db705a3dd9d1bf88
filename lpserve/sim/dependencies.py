"""Dependency-aware cluster loop for traces with ``Trace.parent`` links (agentic programs).

A request with a parent is *released* (enters routing) at ``max(arrival_s, parent's
finish)``; a request whose parent never finishes (rejected, or unfinished at the horizon)
is never run and is reported with reason ``parent_not_finished``
(``models/simulator.md`` rules 21-23).

Replicas are advanced lazily by the plain loop, but a parent's completion creates an
arrival event that may lie before the next known one, so no replica may have started an
iteration at or after it before the child is routed. :class:`DependencyLoop` therefore
advances the busy replicas conservatively, the one with the earliest clock first, each by
one planning step (one iteration or a decode run) that stops at the earliest clock of the
other busy replicas: any completion elsewhere ends an iteration that starts no earlier
than that clock, so every iteration already run started before it. Python work stays one
planning step per event; decode runs between events still run in numba.
"""
from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

from lpserve.sim.state import PENDING

if TYPE_CHECKING:  # pragma: no cover
    from lpserve.sim.engine import Simulation

REASON = "parent_not_finished"


def has_dependencies(trace) -> bool:
    """Whether ``trace`` has at least one request with a parent."""
    return trace.parent is not None and bool(np.any(np.asarray(trace.parent) >= 0))


class DependencyLoop:
    """Event loop of ``sim`` that releases children when their parents finish."""

    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim
        S = sim.state
        parent = np.asarray(S.trace.parent, np.int64)
        self.parent = parent
        # effective arrivals change on release: never write into the trace's own array
        S.arrival = np.array(S.arrival, np.float64, copy=True)
        self.trace_arrival = S.arrival.copy()
        S.release = np.where(parent >= 0, np.nan, S.arrival)
        self.children: dict[int, list[int]] = {}
        for c in np.flatnonzero(parent >= 0).tolist():
            self.children.setdefault(int(parent[c]), []).append(c)
        self.roots = np.flatnonzero(parent < 0)
        self.pos = 0  # next root to route
        self.released: list[tuple[float, int]] = []  # (release time, request)
        self.now = -math.inf  # time of the last routed event

    # ------------------------------------------------------------------ releases
    def finished(self, i: int, t: float) -> None:
        """Request ``i`` finished at ``t``: release its children (called by replicas)."""
        kids = self.children.get(i)
        if not kids:
            return
        S = self.sim.state
        for c in kids:
            rel = max(float(self.trace_arrival[c]), float(t))
            if rel < self.now:
                raise RuntimeError(f"internal: request {c} released at {rel} before the "
                                   f"last routed event at {self.now}")
            S.release[c] = rel
            S.arrival[c] = rel
            heapq.heappush(self.released, (rel, c))

    def _next_arrival(self) -> float:
        t = math.inf
        if self.pos < self.roots.size:
            t = float(self.trace_arrival[self.roots[self.pos]])
        if self.released:
            t = min(t, self.released[0][0])
        return t

    def _next_event(self) -> float:
        t = self._next_arrival()
        if self.sim.kv_heap:
            t = min(t, self.sim.kv_heap[0][0])
        return t

    # ------------------------------------------------------------------ advancing
    def _step(self, r, stop: float) -> bool:
        """One planning step of replica ``r`` before ``stop`` (as one pass of
        :meth:`Replica.advance`); False if it has nothing to do before ``stop``."""
        stop = min(stop, self.sim.horizon_s)
        r._apply_releases()
        if r.now >= stop:
            return False
        if r._step(stop):
            self.sim.check_replica(r)
            return True
        if r.releases and r.releases[0][0] < stop:
            r.now = max(r.now, r.releases[0][0])
            return True
        return False

    def advance(self, t: float) -> None:
        """Run every iteration that starts before ``t`` or before an event released
        meanwhile (whichever is earlier); returns when nothing more may run."""
        reps = self.sim.replicas()
        idle: set[int] = set()  # replicas with nothing to do before the limit
        while True:
            lim = min(t, self._next_event(), self.sim.horizon_s)
            best, second = None, math.inf
            for k, r in enumerate(reps):
                if k in idle or not (r.running or r.waiting or r.releases) or r.now >= lim:
                    continue
                if best is None or r.now < reps[best].now:
                    if best is not None:
                        second = min(second, reps[best].now)
                    best = k
                else:
                    second = min(second, r.now)
            if best is None:
                return
            r = reps[best]
            stop = min(lim, max(second, math.nextafter(r.now, math.inf)))
            if not self._step(r, stop):
                idle.add(best)
            else:
                idle.clear()

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        """Route every released request in time order; advance replicas in between."""
        sim = self.sim
        while True:
            t = self._next_event()
            self.advance(t)
            if self._next_event() < t:
                continue  # a completion released an earlier event
            if t >= sim.horizon_s:  # also t == inf: nothing left to route
                break
            self.now = t
            if sim.kv_heap and sim.kv_heap[0][0] == t:
                sim._flush_kv(t)
            req = []
            while self.pos < self.roots.size and self.trace_arrival[self.roots[self.pos]] == t:
                req.append(int(self.roots[self.pos]))
                self.pos += 1
            while self.released and self.released[0][0] == t:
                req.append(heapq.heappop(self.released)[1])
            if not req:
                continue
            req.sort()
            if sim.predictor is not None:
                sim._predict(req, t)
            for k, r in zip(req, sim._route(sim.front, req, t, "prefill" if sim.back
                                            else "colocated")):
                sim.front[r].enqueue(k, t)
        # the caller drains the replicas and the KV transfers left (beyond the horizon)

    def label(self) -> None:
        """Report children that were never released (their parent did not finish); run
        after :meth:`Simulation._label_unfinished`, whose reason this one replaces."""
        S = self.sim.state
        for c in np.flatnonzero(np.isnan(S.release)).tolist():
            if S.status[c] == PENDING:
                S.reason[c] = REASON
