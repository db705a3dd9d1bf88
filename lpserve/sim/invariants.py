"""Block, host-memory and timing invariants, checked after every planning step when a
simulation runs with ``check=True`` (``models/simulator.md``, invariants)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from lpserve.cost.preemption import compressed_host_blocks
from lpserve.sim.blocks import BlockError
from lpserve.sim.state import RUNNING, TRANSFER, WAITING, XF_IN, XF_NONE, XF_OUT, State

__all__ = ["InvariantError", "ReplicaChecker", "check_final"]


class InvariantError(AssertionError):
    """A simulator invariant failed (only raised with ``check=True``)."""


class ReplicaChecker:
    """``checker(replica)`` raises :class:`InvariantError` unless the replica's blocks,
    host memory, clock and queues are consistent with the per-request ``state``.

    Checked: the block pool's own counts (:meth:`BlockManager.check`); anonymous blocks and
    slot references equal what the running requests, pending releases and inbound
    migrations hold; used <= total; time never goes back; no running request before its
    arrival; host memory ``free + held by swapped requests == capacity`` with each
    swapped request holding ``ceil(GPU blocks / ratio)`` host blocks when compressed
    (``models/kv-compression-swap.md`` (2)), its GPU blocks otherwise; the host link
    (``models/simulator.md`` (32)): at most one copy running, its counters equal to the
    queued copies, every running request's KV resident (no copy of it pending), a
    swapping-out request still holding its GPU blocks, a swapping-in one holding them
    exactly once its copy started.
    """

    def __init__(self, state: State, host_blocks: int, compression_ratio: float) -> None:
        self.state = state
        self.host_blocks = int(host_blocks)
        self.ratio = float(compression_ratio)
        self._last_now: dict[int, float] = {}

    def __call__(self, r: Any) -> None:
        if getattr(r, "compiled", False):
            msg = r.check()
            if msg:
                raise InvariantError(f"replica {r.index}: {msg}")
            return
        try:
            r.bm.check()
        except BlockError as exc:
            raise InvariantError(f"replica {r.role}{r.index}: {exc}") from None
        S = self.state
        last = self._last_now.get(id(r), -math.inf)
        if r.now < last:
            raise InvariantError(f"replica {r.index}: time went back {last} -> {r.now}")
        self._last_now[id(r)] = r.now
        holders = r.running + r.waiting + r.loading  # waiting: resident or swapping out
        anon = int(S.anon[holders].sum()) + sum(a for *_, a in r.releases) + \
            sum(r.inbound.values())
        if anon != r.bm.anon_used:
            raise InvariantError(f"replica {r.index}: anonymous blocks of requests {anon} != "
                                 f"pool {r.bm.anon_used}")
        refs = np.zeros(r.bm.total, np.int64)
        for i in holders:
            np.add.at(refs, np.asarray(S.slots[i], np.int64), 1)
        for _, _, slots, _ in r.releases:
            np.add.at(refs, np.asarray(slots, np.int64), 1)
        if not np.array_equal(refs, r.bm.ref):
            raise InvariantError(f"replica {r.index}: slot references do not match holders")
        if r.bm.used > r.bm.total:
            raise InvariantError(f"replica {r.index}: {r.bm.used} blocks used > {r.bm.total}")
        if r.running:
            idx = np.asarray(r.running)
            if np.any(S.arrival[idx] > r.now):
                raise InvariantError(f"replica {r.index}: a request ran before it arrived")
            if np.any(S.status[idx] != RUNNING):
                raise InvariantError(f"replica {r.index}: running list holds non-running ids")
        self._check_host(r)
        self._check_link(r)

    def _check_link(self, r: Any) -> None:
        S, link = self.state, r.link
        if any(S.swapped[i] or S.xfer[i] != XF_NONE for i in r.running):
            raise InvariantError(f"replica {r.index}: a running request's KV is not resident")
        if link is None:
            if r.loading or np.any(S.xfer[r.waiting] != XF_NONE):
                raise InvariantError(f"replica {r.index}: copies in flight without a link")
            return
        copies = link.copies()
        if link.active is not None and not link.start_s <= link.end_s:
            raise InvariantError(f"replica {r.index}: link copy ends before it starts")
        if len({c.request for c in copies}) != len(copies) or \
                set(link.by_request) != {c.request for c in copies}:
            raise InvariantError(f"replica {r.index}: a request has two copies on the link")
        if link.freeing != sum(c.blocks for c in copies if c.kind == "out") or \
                link.promised != sum(c.blocks for c in link.queue if c.kind == "in"):
            raise InvariantError(f"replica {r.index}: link block counters out of date")
        for c in copies:
            i, held = c.request, int(S.anon[c.request] + S.nslots[c.request])
            started = c is link.active
            want = XF_OUT if c.kind == "out" else XF_IN
            ok = S.xfer[i] == want and S.swapped[i] and c.blocks == S.swap_gpu_blocks[i]
            ok = ok and (held == c.blocks if c.kind == "out" or started else held == 0)
            if not ok:
                raise InvariantError(f"replica {r.index}: {c.kind} copy of request {i} does "
                                     f"not match its state ({held} GPU blocks held)")
        for i in r.loading:
            if S.status[i] != TRANSFER or i not in link.by_request:
                raise InvariantError(f"replica {r.index}: request {i} swapping in has no copy")

    def _check_host(self, r: Any) -> None:
        S = self.state
        if r.host_free < 0:
            raise InvariantError(f"replica {r.index}: host_free = {r.host_free} < 0")
        sw = [i for i in r.waiting + r.loading if S.swapped[i]]
        held = int(S.host_blocks[sw].sum()) if sw else 0
        if r.host_free + held != self.host_blocks:
            raise InvariantError(f"replica {r.index}: host_free {r.host_free} + swapped "
                                 f"{held} != host capacity {self.host_blocks}")
        for i in sw:
            g = int(S.swap_gpu_blocks[i])
            want = compressed_host_blocks(g, self.ratio) if S.compressed[i] else g
            if int(S.host_blocks[i]) != want or int(S.computed[i]) > g * r.bt:
                raise InvariantError(f"replica {r.index}: swapped request {i} holds "
                                     f"{int(S.host_blocks[i])} host blocks for {g} GPU "
                                     f"blocks and {int(S.computed[i])} tokens")


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
