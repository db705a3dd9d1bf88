"""Oracle of the compiled host link's copy queue (``lpserve/sim/_link_kernels.py``,
``models/simulator.md`` (26)-(31)) in plain Python: one copy at a time, once started it
runs to completion; a free link starts the next queued copy that can start, in the link
order (fifo, priority, llf, rmlq)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from lpserve.sim._link_kernels import RMLQ_BASE_S, RMLQ_LEVELS


@dataclass
class Copy:
    """One queued or running KV copy on a host link.

    Attributes:
        kind: ``"out"`` (GPU to host) or ``"in"`` (host to GPU).
        request: the request whose KV moves; blocks: its GPU blocks.
        duration_s: seconds on the link; seq: issue order on the link.
        issued_s: when it was issued; rank: the scheduler's rank of the request then
            (``link_order="priority"``); deadline_s: the request's SLO deadline (``llf``,
            ``rmlq``; ``inf`` without an SLO).
        then_run: a swap-in whose request joins the running batch at its end (an
            admission); otherwise (a proactive prefetch) the request stays resident.
    """

    kind: str
    request: int
    blocks: int
    duration_s: float
    seq: int
    issued_s: float
    rank: float
    deadline_s: float
    then_run: bool


class HostLink:
    """The copy queue of one replica's host link (one copy at a time).

    ``freeing``: GPU blocks of queued or running swap-outs (freed when they end);
    ``promised``: GPU blocks of queued swap-ins not started (taken when they start).
    """

    def __init__(self, order: str) -> None:
        self.order = order
        self.queue: list[Copy] = []
        self.active: Copy | None = None
        self.start_s = self.end_s = 0.0
        self.by_request: dict[int, Copy] = {}
        self.freeing = 0
        self.promised = 0
        self.seq = 0
        self.n_copies = 0
        self.busy_s = 0.0  # summed copy time (link occupancy)

    @property
    def next_end_s(self) -> float:
        """End of the running copy (``inf`` if the link is idle)."""
        return self.end_s if self.active is not None else math.inf

    def copies(self) -> list[Copy]:
        """The running copy (first, if any) and the queued ones."""
        return ([self.active] if self.active is not None else []) + self.queue

    def enqueue(self, kind: str, request: int, blocks: int, duration_s: float, now_s: float,
                rank: float, deadline: float, then_run: bool) -> Copy:
        """Queue a copy issued at ``now_s``."""
        self.seq += 1
        c = Copy(kind, int(request), int(blocks), float(duration_s), self.seq, float(now_s),
                 float(rank), float(deadline), bool(then_run))
        self.queue.append(c)
        self.by_request[c.request] = c
        if kind == "out":
            self.freeing += c.blocks
        else:
            self.promised += c.blocks
        return c

    def key(self, c: Copy, t: float) -> tuple:
        """The sort key of queued copy ``c`` at time ``t`` under the link order (lower
        starts first; ties by issue order)."""
        if self.order == "fifo":
            return (c.seq,)
        if self.order == "priority":
            return (c.rank, c.seq)
        if self.order == "llf":  # laxity at t is deadline - t - duration: t is common
            return (c.deadline_s - c.duration_s, c.seq)
        lax = c.deadline_s - t - c.duration_s
        if not math.isfinite(lax):
            level = RMLQ_LEVELS - 1
        else:
            level = min(max(int(math.floor(math.log2(max(lax, RMLQ_BASE_S) / RMLQ_BASE_S))),
                            0), RMLQ_LEVELS - 1)
        return (level, c.seq)

    def advance(self, now_s: float, start: Callable[[Copy, float], bool],
                end: Callable[[Copy, float], None]) -> None:
        """End every copy that ends by ``now_s`` and start the next ones at the end times
        (``start(copy, t)`` returns False for a copy that cannot start yet: it stays
        queued and the next one in order is tried; ``end(copy, t)`` applies an end)."""
        t = now_s
        while True:
            if self.active is not None:
                if self.end_s > now_s:
                    return
                c, t = self.active, self.end_s
                self.active = None
                del self.by_request[c.request]
                if c.kind == "out":
                    self.freeing -= c.blocks
                end(c, t)
            if not self._start_next(t, start):
                return

    def _start_next(self, t: float, start: Callable[[Copy, float], bool]) -> bool:
        if not self.queue:
            return False
        for c in sorted(self.queue, key=lambda c: self.key(c, t)):
            if start(c, t):
                self.queue.remove(c)
                if c.kind == "in":
                    self.promised -= c.blocks
                self.active, self.start_s, self.end_s = c, t, t + c.duration_s
                self.n_copies += 1
                self.busy_s += c.duration_s
                return True
        return False
