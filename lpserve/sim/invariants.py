"""Block, host-memory and timing invariants, checked after every planning step when a
simulation runs with ``check=True`` (``models/simulator.md``, invariants)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from lpserve.cost.preemption import compressed_host_blocks
from lpserve.sim import _link_kernels as LK
from lpserve.sim.state import RUNNING, TRANSFER, WAITING, XF_NONE, State

__all__ = ["InvariantError", "ReplicaChecker", "check_final"]


class InvariantError(AssertionError):
    """A simulator invariant failed (only raised with ``check=True``)."""


class ReplicaChecker:
    """``checker(replica)`` raises :class:`InvariantError` unless the compiled replica's
    blocks, host memory, clock and queues are consistent with the per-request ``state``.

    Checked: the block pool's counts (free + used == total, none negative); the anonymous
    blocks equal what the running requests, pending releases, inbound KV copies and (on
    the host link) the requests with a copy or resident KV hold; time never goes back; no
    running request before its arrival, every running request's status RUNNING and its KV
    resident (not swapped, no copy of it pending); host memory ``free + held by swapped
    requests == capacity`` with each swapped request holding ``ceil(GPU blocks / ratio)``
    host blocks when compressed (``models/kv-compression-swap.md`` (2)), its GPU blocks
    otherwise, and no more computed tokens than those blocks hold; the overlapped host
    link (``models/simulator.md`` (32)): at most one copy running and one copy per
    request, the running copy not ending before it starts, its counters of blocks freeing
    (swap-outs not ended) and promised (swap-ins not started) equal to its copies'.
    """

    def __init__(self, state: State, host_blocks: int, compression_ratio: float) -> None:
        """``state``: the run's per-request arrays; ``host_blocks``: each replica's host
        (CPU) swap capacity in blocks; ``compression_ratio``: KV compression of a
        compressed swap (``EngineConfig.compression_ratio``)."""
        self.state = state
        self.host_blocks = int(host_blocks)
        self.ratio = float(compression_ratio)
        self._last_now: dict[tuple[str, int], float] = {}

    def __call__(self, r: Any) -> None:
        """Check compiled replica ``r`` after a planning step; raises
        :class:`InvariantError` naming the replica and the first failed check."""
        msg = self._blocks(r) or self._clock_and_queues(r) or self._host(r) or \
            self._link(r)
        if msg:
            raise InvariantError(f"replica {r.role} {r.index}: {msg}")

    @staticmethod
    def _held_off_batch(r: Any) -> np.ndarray:
        """Requests of ``r`` that are not running but may hold its blocks or host memory
        (int64): its waiting requests (resident, swapping out or swapped out) and those
        with a copy on its host link (swapping in). Read off the replica's own queues:
        ``State.replica`` keeps the router's choice, not where a migrated request is, and
        a request on a decode replica is not its prefill replica's."""
        held = list(r.waiting)
        if r.link is not None:
            a = r.link_arrays
            held += a.queue[:int(a.li[LK.L_NQ])].tolist()
            if a.li[LK.L_ACTIVE] >= 0:
                held.append(int(a.li[LK.L_ACTIVE]))
        return np.unique(np.asarray(held, np.int64))

    def _blocks(self, r: Any) -> str:
        """The pool's counts add up, and its anonymous blocks are the ones the requests
        hold (running, releasing, arriving by a KV copy, on the host link); "" if so."""
        S, bm = self.state, r.bm
        counts = (bm.plain_free, bm.anon_used, bm.hashed_used, bm.evictable)
        if min(counts) < 0:
            return f"negative block count {counts}"
        if sum(counts) != bm.total:
            return f"free + used {sum(counts)} != total {bm.total}"
        run = r.running
        anon = int(S.anon[run].sum()) + r.pending_release_anon + sum(r.inbound.values())
        if r.link is not None:  # swap-outs and residents keep their blocks, swap-ins theirs
            held = self._held_off_batch(r)
            anon += int(S.anon[held[S.xfer[held] != XF_NONE]].sum())
        if anon != bm.anon_used:
            return f"anonymous blocks of requests {anon} != pool {bm.anon_used}"
        return ""

    def _clock_and_queues(self, r: Any) -> str:
        """The replica's clock never goes back; each running request has arrived, has
        status RUNNING and its KV resident; "" if so."""
        S = self.state
        last = self._last_now.get(r.key, -math.inf)
        if r.now < last:
            return f"time went back {last} -> {r.now}"
        self._last_now[r.key] = r.now
        run = np.asarray(r.running, np.int64)
        if run.size and np.any(S.arrival[run] > r.now):
            return "a request ran before it arrived"
        if run.size and np.any(S.status[run] != RUNNING):
            return "running list holds non-running ids"
        if run.size and np.any(S.swapped[run] | (S.xfer[run] != XF_NONE)):
            return "a running request's KV is not resident"
        return ""

    def _host(self, r: Any) -> str:
        """Host memory: free + held by the swapped requests == capacity, each holding
        what its GPU blocks (compressed or not) need and no more tokens than they hold;
        "" if so."""
        S = self.state
        if r.host_free < 0:
            return f"host_free = {r.host_free} < 0"
        held = self._held_off_batch(r)
        sw = held[S.swapped[held]]
        held = int(S.host_blocks[sw].sum())
        if r.host_free + held != self.host_blocks:
            return (f"host_free {r.host_free} + swapped {held} != host capacity "
                    f"{self.host_blocks}")
        for i in sw.tolist():
            g = int(S.swap_gpu_blocks[i])
            want = compressed_host_blocks(g, self.ratio) if S.compressed[i] else g
            if int(S.host_blocks[i]) != want or int(S.computed[i]) > g * r.bt:
                return (f"swapped request {i} holds {int(S.host_blocks[i])} host blocks "
                        f"for {g} GPU blocks and {int(S.computed[i])} tokens")
        return ""

    @staticmethod
    def _link(r: Any) -> str:
        """The overlapped host link: one copy per request, the running one not ending
        before it starts, its freeing and promised block counters equal to its copies'
        (rule (32)); "" if so, or without a link."""
        if r.link is None:
            return ""
        a = r.link_arrays
        queued = a.queue[:int(a.li[LK.L_NQ])].tolist()
        active = int(a.li[LK.L_ACTIVE])
        copies = queued + ([active] if active >= 0 else [])
        if len(set(copies)) != len(copies):
            return "a request has two copies on the link"
        if active >= 0 and not a.lf[LK.LF_START] <= a.lf[LK.LF_END]:
            return "link copy ends before it starts"
        freeing = sum(int(a.q_blocks[i]) for i in copies if a.q_kind[i] == LK.KIND_OUT)
        promised = sum(int(a.q_blocks[i]) for i in queued if a.q_kind[i] == LK.KIND_IN)
        if (freeing, promised) != (int(a.li[LK.L_FREEING]), int(a.li[LK.L_PROMISED])):
            return "link block counters out of date"
        return ""


def check_final(state: State) -> None:
    """After the run: every request still swapped out (or swapping in, cut by the horizon)
    is labelled with a reason."""
    S = state
    bad = np.flatnonzero(S.swapped & (((S.status != WAITING) & (S.status != TRANSFER))
                                      | (S.reason == "")))
    if bad.size:
        i = int(bad[0])
        raise InvariantError(f"request {i} ended swapped out with status {S.status[i]} "
                             f"and no reason")
