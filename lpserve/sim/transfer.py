"""The transfer engine: swap copies on a replica's host (PCIe) link, and the swap-out /
swap-in mechanics of preemption in both modes of ``EngineConfig.transfers``.

``"serial"`` (vLLM V0's blocking swap): a swapped victim's blocks are freed at once and
the copy time is added to the replica's next iteration (``Replica.swap_blocks_pending``,
``swap_s_pending``), as the simulator always did.

``"overlap"`` (a copy stream): every swap-out and swap-in is a :class:`Copy` queued on the
replica's :class:`HostLink`; one copy runs at a time per link and, once started, runs to
completion (its duration is what the cost model prices a serial swap,
``models/kv-compression-swap.md`` (1), (4)); a free link starts the next queued copy that
can start, in ``EngineConfig.link_order``. A swap-out's GPU blocks are freed when it ends;
a swap-in takes its GPU blocks when it starts and its request becomes runnable when it
ends. Copy ends are events of the replica (``HostLink.next_end_s``): decode runs stop at
them, nothing is done per decode iteration. ``models/simulator.md`` (26)-(31).

FastServe's proactive swapping (``EngineConfig.proactive_swap``, :func:`proactive`) keeps a
free-block target by swapping out the lowest-priority *resident* preempted requests (a
priority-preemption victim keeps its KV on the GPU, state ``XF_RESIDENT``) and swaps in
the next to run while the target allows. As in FastServe's code, KV only moves into free
host memory: a victim without host room is not parked (:class:`HostRoom`) and a resident
without it stays, dropped to recompute only when nothing else could free blocks.

Every function takes the replica it acts on (a :class:`lpserve.sim.replica.Replica`) and
uses only its public attributes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from lpserve.cost.preemption import compressed_host_blocks, swap_one_way_s
from lpserve.sim.state import RUNNING, TRANSFER, WAITING, XF_IN, XF_NONE, XF_OUT, XF_RESIDENT

__all__ = ["RMLQ_BASE_S", "RMLQ_LEVELS", "Copy", "HostLink", "HostRoom", "admit_swapped",
           "deadline_s", "joins_by", "park", "preempt", "proactive", "proactive_target",
           "relieve", "resident_cap", "tick"]

#: the reverse multi-level queue of ``link_order="rmlq"``: level ``k`` holds copies whose
#: laxity is in ``[base * 2**k, base * 2**(k+1))`` (level 0 below ``2 * base``, the last
#: level everything above, including copies without a deadline); lower levels start first
RMLQ_BASE_S = 0.01
RMLQ_LEVELS = 8


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


# ================================================================== replica mechanics
def deadline_s(rep: Any, i: int) -> float:
    """Request ``i``'s SLO deadline: its TTFT deadline before its first token, then the
    time its next token is due at the TPOT SLO (``first token + tpot * generated``)."""
    S, ctx = rep.S, rep.ctx
    if np.isnan(S.first_token[i]):
        return float(S.arrival[i]) + ctx.slo_ttft_s
    return float(S.first_token[i]) + ctx.slo_tpot_s * float(S.gen[i])


def _issue(rep: Any, kind: str, i: int, blocks: int, duration_s: float,
           then_run: bool) -> None:
    link = rep.link
    rank = rep.ranks().get(i, math.inf) if link.order == "priority" else 0.0
    dl = deadline_s(rep, i) if link.order in ("llf", "rmlq") else math.inf
    link.enqueue(kind, i, blocks, duration_s, rep.now, rank, dl, then_run)
    tick(rep)  # an idle link starts it now


def joins_by(link: HostLink, now_s: float) -> bool:
    """Whether a copy of ``link`` ends by ``now_s`` while a swap-in that puts its request
    into the running batch (``then_run``) is running or queued: a join may be applied by
    the next :func:`tick` (conservative: the queued one may not start by ``now_s``)."""
    return link.active is not None and link.end_s <= now_s and any(
        c.then_run for c in link.copies())


def tick(rep: Any) -> None:
    """Bring ``rep``'s link up to ``rep.now`` (copy ends and starts in time order)."""
    S, bm = rep.S, rep.bm

    def start(c: Copy, t: float) -> bool:
        if c.kind == "in":
            if bm.available < c.blocks:
                return False
            rep.make_room(c.blocks)
            bm.take_anon(c.blocks)
            S.anon[c.request] = c.blocks
        return True

    def end(c: Copy, t: float) -> None:
        i = c.request
        if c.kind == "out":  # the KV is on the host: the GPU blocks are free from t
            rep.release_request(i, t)
            S.xfer[i] = XF_NONE
            return
        rep.host_free += int(S.host_blocks[i])
        if S.compressed[i]:  # the dequantize pass runs on the GPU, in the next iteration
            rep.swap_s_pending += float(rep.cost.kv_quantize_time_s(
                int(c.blocks), rep.bt, float(rep.eng.compression_ratio)))
            S.compressed[i] = False
        S.host_blocks[i] = 0
        S.swap_gpu_blocks[i] = 0
        S.swapped[i] = False
        if c.then_run:
            S.xfer[i] = XF_NONE
            rep.loading.remove(i)
            rep.running.append(i)
            S.status[i] = RUNNING
            S.link_wait[i] += t - c.issued_s
        else:
            S.xfer[i] = XF_RESIDENT

    rep.link.advance(rep.now, start, end)


def _copy_s(rep: Any, held: int, compressed: bool) -> float:
    """Link seconds of one copy of ``held`` GPU blocks (full, or compressed PCIe bytes)."""
    cost = rep.cost
    if compressed:
        return float(cost.swap_time_s(held, rep.bt)) / float(rep.eng.compression_ratio)
    return float(cost.swap_time_s(held, rep.bt)) * rep.ctx.kv_scale


def _swap_out(rep: Any, v: int, held: int, mode: str) -> bool:
    """Move preempted ``v``'s KV (``held`` GPU blocks) to host memory by ``mode`` if it
    fits there; False (nothing done) otherwise."""
    S, eng = rep.S, rep.eng
    compressed = compressed_host_blocks(held, eng.compression_ratio)
    if mode == "swap" and held <= rep.host_free:
        host = held
    elif mode == "compress-swap" and compressed <= rep.host_free:
        host = compressed  # models/kv-compression-swap.md (2), (4)
    else:
        return False
    rep.host_free -= host
    S.host_blocks[v] = host
    S.swap_gpu_blocks[v] = held
    S.swapped[v] = True
    comp = mode == "compress-swap"
    if comp:
        S.compressed[v] = True
    if rep.link is None:  # serial: priced in the next iteration, blocks freed now
        if comp:
            rep.swap_s_pending += swap_one_way_s(rep.cost, held, rep.bt, mode,
                                                 eng.compression_ratio)
        else:
            rep.swap_blocks_pending += held
    else:
        if comp:  # the quantize pass runs on the GPU (next iteration), the bytes on PCIe
            rep.swap_s_pending += float(rep.cost.kv_quantize_time_s(
                held, rep.bt, float(eng.compression_ratio)))
        S.xfer[v] = XF_OUT
        _issue(rep, "out", v, held, _copy_s(rep, held, comp), False)
    rep.n_swaps += 1
    if comp:
        rep.n_compressed_swaps += 1
        rep.compressed_tokens += int(S.computed[v])
    return True


def _drop_kv(rep: Any, v: int) -> None:
    S = rep.S
    S.computed[v] = 0
    S.draft_computed[v] = 0
    S.kv_remote[v] = False
    rep.n_recomputes += 1
    rep.release_request(v, rep.now)


def preempt(rep: Any, v: int) -> None:
    """Preempt running request ``v`` by the engine's (or the decider's) mode: swap or
    compress-and-swap it out when its KV fits in host memory, else recompute
    (``models/simulator.md`` (10), (27))."""
    S = rep.S
    held = int(S.anon[v] + S.nslots[v])
    if not _swap_out(rep, v, held, rep.preemption_mode(v, held)):
        _drop_kv(rep, v)
    elif rep.link is None:
        rep.release_request(v, rep.now)
    S.preempt[v] += 1
    S.status[v] = WAITING
    rep.running.remove(v)
    rep.waiting.insert(0, v)


def park(rep: Any, v: int) -> None:
    """Proactive swapping: running ``v`` is preempted by priority and keeps its KV on the
    GPU (``XF_RESIDENT``); it resumes without a copy unless it is swapped out first."""
    S = rep.S
    S.xfer[v] = XF_RESIDENT
    S.preempt[v] += 1
    S.status[v] = WAITING
    rep.running.remove(v)
    rep.waiting.insert(0, v)


def _evict_resident(rep: Any, v: int, mode: str | None = None) -> bool:
    """Swap out (or, without host room or with recompute preemption, drop) resident ``v``
    by ``mode`` (default: its preemption mode, asked now); True if it was dropped (its
    blocks are free now, not at the end of a copy)."""
    S = rep.S
    S.xfer[v] = XF_NONE
    held = int(S.anon[v] + S.nslots[v])
    if not _swap_out(rep, v, held, mode or rep.preemption_mode(v, held)):
        _drop_kv(rep, v)
        return True
    return False


def admit_swapped(rep: Any, i: int) -> int:
    """Admission of waiting request ``i`` that has KV on the link or resident (overlap
    mode): 1 admitted (a resident request joins the batch; a swapped-out one gets its
    swap-in issued and a seat), 0 not yet (its swap-out is still copying: skipped),
    -1 its blocks do not fit above the watermark (admission stops, head of line)."""
    S, bm = rep.S, rep.bm
    st = S.xfer[i]
    if st == XF_OUT:
        return 0
    if st == XF_RESIDENT:
        S.xfer[i] = XF_NONE
        rep.waiting.remove(i)
        rep.running.append(i)
        S.status[i] = RUNNING
        return 1
    if st != XF_IN:  # the running decodes keep the blocks their next tokens need (28)
        keep = S.decode_need(S.phases(rep.running)[0], rep.bt)
        if bm.available - rep.link.promised - int(S.swap_gpu_blocks[i]) - keep < rep.wm_blocks:
            return -1
    rep.waiting.remove(i)
    rep.loading.append(i)
    S.status[i] = TRANSFER
    if st == XF_IN:  # a proactive prefetch already on the link: run at its end
        c = rep.link.by_request[i]
        c.then_run = True
        c.issued_s = rep.now
        return 1
    S.xfer[i] = XF_IN
    n = int(S.swap_gpu_blocks[i])
    _issue(rep, "in", i, n, _copy_s(rep, n, bool(S.compressed[i])), True)
    return 1


class HostRoom:
    """Which running requests of ``rep`` priority preemption may park under proactive
    swapping: those whose KV, in their preemption mode, fits in the host memory left by
    the resident requests and the victims before them (asked once per request, in the
    order asked). Parking a request without host room frees none of its blocks (FastServe
    never drops KV to recompute): it keeps running instead (``models/simulator.md`` (30))."""

    def __init__(self, rep: Any) -> None:
        self.rep = rep
        S = rep.S
        self.left = rep.host_free - sum(int(S.anon[i] + S.nslots[i]) for i in rep.waiting
                                        if S.xfer[i] == XF_RESIDENT)
        self.seen: dict[int, bool] = {}

    def __call__(self, v: int) -> bool:
        """Whether running request ``v`` may be parked."""
        if v not in self.seen:
            need = _host_need(self.rep, v)[1]
            self.seen[v] = need <= self.left
            if self.seen[v]:
                self.left -= need
        return self.seen[v]

    def park(self, v: int) -> None:
        """Park victim ``v`` (:func:`park`) if it may be parked; else it keeps running."""
        if self(v):
            park(self.rep, v)


def _host_need(rep: Any, v: int) -> tuple[str, int]:
    """Request ``v``'s preemption mode and the host blocks swapping it out takes in that
    mode (0 to recompute: it needs no host room)."""
    held = int(rep.S.anon[v] + rep.S.nslots[v])
    mode = rep.preemption_mode(v, held)
    if mode == "swap":
        return mode, held
    if mode == "compress-swap":
        return mode, compressed_host_blocks(held, rep.eng.compression_ratio)
    return mode, 0


def proactive_target(rep: Any) -> int:
    """Free blocks proactive swapping keeps for arrivals (``models/simulator.md`` (30))."""
    v = rep.eng.proactive_free_blocks
    return int(v) if v is not None else max(int(rep.eng.max_num_seqs), rep.wm_blocks)


def resident_cap(rep: Any, blocked: tuple[int, int] | None) -> int:
    """Most blocks a decode run may take before :func:`proactive` could act (a swap-out
    of a resident request): the free blocks above the target (and above the watermark
    plus the need of ``blocked``, where admission stopped); conservative, so a run only
    stops early. Unbounded when no request is resident."""
    if not any(rep.S.xfer[i] == XF_RESIDENT for i in rep.waiting):
        return 1 << 62
    floor = proactive_target(rep)
    if blocked is not None:
        floor = max(floor, rep.wm_blocks + blocked[1])
    return max(rep.bm.available + rep.link.freeing - rep.link.promised - floor, 0)


def relieve(rep: Any) -> bool:
    """Memory pressure with proactive swapping: swap out (or drop) the worst-ranked
    resident request; False if none is resident."""
    res = [i for i in rep.waiting if rep.S.xfer[i] == XF_RESIDENT]
    if not res:
        return False
    ranks = rep.ranks()
    pos = {i: k for k, i in enumerate(rep.waiting)}
    _evict_resident(rep, max(res, key=lambda i: (ranks.get(i, math.inf), pos[i])))
    return True


def proactive(rep: Any, blocked: tuple[int, int] | None) -> bool:
    """FastServe's proactive swapping, once per planning step after admission.

    With ``free = available + freeing - promised`` blocks: while ``free`` is below the
    target, or below the watermark plus the need of ``blocked`` (the waiting request, with
    its need, at which admission stopped) and the worst resident request ranks below it,
    swap out the worst-ranked resident request. If none was swapped out, issue swap-ins of
    the best-ranked swapped-out waiting requests (at most ``max_num_seqs``) while
    ``free - need`` stays at or above the target; they become resident at their ends.
    A resident whose KV has no room in free host memory is skipped, unless no request
    runs and no copy runs (then it is dropped to recompute: nothing else would free
    blocks); the swap-ins also keep the watermark plus the need of ``blocked`` free.
    True if an evicted request was dropped: its blocks are free now, so the replica plans
    again at once instead of idling until a copy ends. Sets ``rep.proactive_evicted`` to
    the number of requests swapped out or dropped: swap-ins wait for the next planning
    step, so a step that evicted runs one iteration, not a decode run.
    """
    S, bm, link = rep.S, rep.bm, rep.link
    target = proactive_target(rep)
    free = bm.available + link.freeing - link.promised
    ranks = rep.ranks() if rep.waiting else {}
    pos = {i: k for k, i in enumerate(rep.waiting)}
    res = sorted((i for i in rep.waiting if S.xfer[i] == XF_RESIDENT),
                 key=lambda i: (ranks.get(i, math.inf), pos[i]), reverse=True)
    out, dropped = 0, False
    # admission's order is (rank, position in the waiting list): a resident request after
    # the blocked one in that order, rank ties included, yields its blocks to it (on rank
    # alone, residents tied with the blocked head kept their blocks and the replica idled)
    head = None if blocked is None else (ranks.get(blocked[0], math.inf),
                                         pos.get(blocked[0], -1))
    # FastServe's swap-out only moves KV that has room on the host: a resident without
    # room stays, unless nothing else could free blocks (no request running, no copy
    # running: a queued one is a swap-in short of blocks): then it is dropped to
    # recompute, as memory pressure (10) would
    stuck = not rep.running and link.active is None
    for v in res:
        short_head = head is not None and free - rep.wm_blocks < blocked[1] and \
            (ranks.get(v, math.inf), pos[v]) > head
        if free >= target and not short_head:
            break
        mode, need = _host_need(rep, v)
        if need > rep.host_free and not stuck:
            continue
        free += int(S.anon[v] + S.nslots[v])
        dropped |= _evict_resident(rep, v, mode)
        out += 1
    rep.proactive_evicted = out
    if out:
        return dropped
    host = sorted((ranks[i], pos[i], i) for i in rep.waiting
                  if S.swapped[i] and S.xfer[i] == XF_NONE and ranks[i] != math.inf)
    # FastServe swaps in only while the free blocks stay above the target plus the needs
    # of the requests it schedules: here the one admission stopped at (without it, a
    # prefetch took the blocks that request was waiting for and was swapped out again)
    floor = target if blocked is None else max(target, rep.wm_blocks + blocked[1])
    for _, _, i in host[:int(rep.eng.max_num_seqs)]:
        n = int(S.swap_gpu_blocks[i])
        if free - n < floor:
            break
        free -= n
        S.xfer[i] = XF_IN
        _issue(rep, "in", i, n, _copy_s(rep, n, bool(S.compressed[i])), False)
    return False
