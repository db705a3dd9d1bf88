"""Requests moving their KV between replicas (P/D hand-off, live migration): the
replica-side half that the migrator and the disaggregated pools use. Mixed into
:class:`lpserve.sim.replica.Replica`; the compiled replica has the same three methods."""
from __future__ import annotations

import heapq

from lpserve.sim.state import RUNNING, TRANSFER

__all__ = ["KVMoves"]


class KVMoves:
    """``depart`` / ``reserve`` / ``land`` and the P/D hand-off of a Python replica (its
    ``S`` state, ``running`` list, ``releases`` heap, ``inbound`` reservations, ``bm``
    block manager, ``link_free_s`` and ``cost``)."""

    def depart(self, i: int, end_s: float) -> None:
        """Running request ``i`` leaves for another replica; its blocks stay held until
        its KV copy ends at ``end_s``."""
        S = self.S
        self.running.remove(i)
        heapq.heappush(self.releases, (end_s, i, S.slots[i], int(S.anon[i])))
        S.slots[i] = []
        S.nslots[i] = 0
        S.anon[i] = 0
        self.turn_gap.pop(i, None)

    def reserve(self, i: int, n_blocks: int) -> None:
        """Hold ``n_blocks`` blocks for request ``i``, arriving by a KV copy."""
        self.make_room(n_blocks)
        self.bm.take_anon(n_blocks)
        self.inbound[i] = n_blocks

    def land(self, i: int) -> None:
        """Request ``i``'s copy landed: it joins the running batch with its blocks."""
        S = self.S
        S.anon[i] = self.inbound.pop(i)
        S.status[i] = RUNNING
        self.running.append(i)

    def _handoff(self, i: int) -> None:
        """Send request ``i``'s KV to the decode pool over this replica's link."""
        S, ctx = self.S, self.ctx
        start = max(self.now, self.link_free_s)
        end = start + float(self.cost.transfer_time_s(int(S.computed[i]),
                                                     ctx.link_gbps)) * ctx.kv_scale
        self.link_free_s = end
        self.depart(i, end)
        S.kv_remote[i] = True
        S.status[i] = TRANSFER
        ctx.events.kv_ready(end, i)
