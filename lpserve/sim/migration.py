"""Live migration of decoding requests between replicas of one pool (stop-and-copy).

The policy's :class:`~lpserve.policy.hooks.Rebalancer` is asked every ``period_s`` seconds of
simulated time (a cluster event of the event loop, never per iteration). For each returned
``(request, destination)`` row the request leaves the source's running batch at the
source's next iteration boundary ``t0 >= tick``; its KV (``context_tokens`` tokens) is
copied over the source's link, serialized with the source's other outgoing copies, from
``start = max(t0, link free)`` to ``end = start + transfer_time_s(context_tokens)``
(``models/cost-model.md`` (14)). The destination's blocks are reserved when the migration
is decided (so the copy always has somewhere to land); the source's blocks are freed at
``end``; at ``end`` the request joins the destination's running batch holding the reserved
blocks and decodes its next token there. Nothing is recomputed: ``computed``, ``gen``,
first-token and arrival times are carried over.

Stop-and-copy, not Llumnix's pre-copy: the request does not decode during the copy, so
the whole transfer time is its downtime. This is the conservative (slower) end of live
migration and it is what ``models/rebalancing.md`` (5) prices; pre-copy would shorten the
downtime to the copy of the tokens produced during the first stage but needs a second
reservation protocol. The semantics are ``models/simulator.md`` (24)–(25).
"""
from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from lpserve.arrays import readonly
from lpserve.cost import iteration_time
from lpserve.policy import PolicyError, RebalanceView
from lpserve.policy.checks import check_migrations
from lpserve.sim.invariants import InvariantError
from lpserve.sim.state import STATUS_NAMES, TRANSFER, RunContext

__all__ = ["Migrator"]


class Migrator:
    """The rebalancing state of one simulation: its ticks, the copies in flight and the
    counters. The event loop calls :meth:`tick` (with the pool brought up to the tick)
    and :meth:`land` in time order (``next_tick_s``, ``next_landing_s``)."""

    def __init__(self, ctx: RunContext, pool: list[Any]) -> None:
        """The rebalancer of ``ctx.policy`` over the replicas ``pool`` (colocated or
        decode): its first tick at ``period_s``, no migration in flight."""
        self.ctx = ctx
        self.S = ctx.state
        self.rb = ctx.policy.rebalancer
        self.period_s = float(self.rb.period_s)
        self.pool = pool
        self.n_ticks = 1
        self.heap: list[tuple[float, int, int, int, int]] = []  # (end, seq, i, dest, gen)
        self.seq = 0
        self.n_migrations = 0
        self.migrated_bytes = 0.0
        self.migration_s = 0.0
        self.kv_bytes_per_token = float(ctx.cost.kv_bytes_per_token) * ctx.kv_scale  # + draft

    @property
    def next_tick_s(self) -> float:
        """Time of the next rebalancing decision."""
        return self.n_ticks * self.period_s

    @property
    def next_landing_s(self) -> float:
        """End of the earliest copy in flight (``inf`` if none)."""
        return self.heap[0][0] if self.heap else math.inf

    def next_event_s(self) -> float:
        """The next tick or landing."""
        return min(self.next_landing_s, self.next_tick_s)

    def skip_ticks_before(self, t: float) -> None:
        """Nothing runs before ``t``: the ticks before it would find no candidates."""
        self.n_ticks = max(self.n_ticks, math.ceil(t / self.period_s))

    # ------------------------------------------------------------------ decisions
    def tick(self, t: float) -> None:
        """The decision at tick ``t`` (the pool already advanced to ``t``)."""
        self.n_ticks += 1
        cand = self._candidates()
        if not cand:
            return
        view = self.view(t, cand)
        S = self.S
        moves = check_migrations(self.rb.migrate(view), view.request, view.replica, S.n,
                                 len(self.pool), self.ctx.who("rebalancer"),
                                 status_of=lambda i: STATUS_NAMES[S.status[i]])
        for i, d in moves:
            self.start(i, d)

    def _candidates(self) -> list[tuple[int, int]]:
        """``(request, replica index)`` of every running request that can move now: past
        its first token, its KV complete up to the next token's position."""
        S = self.S
        out = []
        for k, r in enumerate(self.pool):
            for i in r.running:
                if S.gen[i] >= 1 and S.prompt[i] + S.gen[i] - S.computed[i] == 1:
                    out.append((i, k))
        return out

    def view(self, t: float, cand: list[tuple[int, int]] | None = None) -> RebalanceView:
        """The read-only :class:`~lpserve.policy.RebalanceView` of the pool at ``t``
        (``cand``: the (request, replica) candidates, computed when ``None``)."""
        ctx, S, bt = self.ctx, self.S, self.ctx.block_tokens
        cand = self._candidates() if cand is None else cand
        idx = np.array([i for i, _ in cand], np.int64)
        src = np.array([k for _, k in cand], np.int64)
        context = S.computed[idx]
        mig = np.array([float(ctx.cost.transfer_time_s(int(c), ctx.link_gbps)) * ctx.kv_scale
                        for c in context.tolist()])
        seats_max = ctx.policy.engine.max_num_seqs
        pool = self.pool
        params = ctx.params

        def decode_iteration_s(context_tokens: np.ndarray) -> float:
            """Seconds of one decode iteration of these contexts (0 for none)."""
            c = np.ascontiguousarray(context_tokens, dtype=np.int64)
            z = np.zeros(0, np.int64)
            return float(iteration_time(params, z, z, c)) if c.size else 0.0

        def frozen(a: np.ndarray) -> np.ndarray:  # never share the simulator's arrays
            return readonly(a, np.int64 if a.dtype.kind in "iu" else None, copy=True)

        clair = ctx.policy.meta.clairvoyant
        return RebalanceView(
            now_s=float(t), block_tokens=bt,
            free_blocks=frozen(np.array([r.bm.available - r.wm_blocks for r in pool],
                                        np.int64)),
            total_blocks=frozen(np.array([r.bm.total for r in pool], np.int64)),
            running=frozen(np.array([len(r.running) for r in pool], np.int64)),
            waiting=frozen(np.array([len(r.waiting) for r in pool], np.int64)),
            seats=frozen(np.array([seats_max - len(r.running) - len(r.inbound)
                                   for r in pool], np.int64)),
            waiting_blocks=tuple(frozen(np.array([r.admit_need(w) for w in r.waiting],
                                                 np.int64)) for r in pool),
            request=frozen(idx), replica=frozen(src), prompt_tokens=frozen(S.prompt[idx]),
            generated_tokens=frozen(S.gen[idx]), context_tokens=frozen(context),
            blocks=frozen(-(-context // bt)), migration_s=frozen(mig),
            predicted_lo=None if ctx.pred_lo is None else frozen(ctx.pred_lo[idx]),
            predicted_hi=None if ctx.pred_hi is None else frozen(ctx.pred_hi[idx]),
            output_tokens=frozen(S.out[idx]) if clair else None,
            decode_iteration_s=decode_iteration_s)

    # ------------------------------------------------------------------ mechanics
    def start(self, i: int, dest: int) -> None:
        """Reserve ``i``'s blocks on ``dest``, take it off its replica, start the copy."""
        ctx, S, bt = self.ctx, self.S, self.ctx.block_tokens
        name = ctx.who("rebalancer")
        src = int(S.migrated_to[i]) if S.migrations[i] else \
            int(S.decode_replica[i] if self.pool[0].role == "decode" else S.replica[i])
        A, B = self.pool[src], self.pool[dest]
        context = int(S.computed[i])
        nb = -(-context // bt)
        room = B.bm.available - B.wm_blocks
        if nb > room:
            raise PolicyError(f"{name}: request {i} needs {nb} KV blocks, destination {dest} "
                              f"has {room} free (capacity exceeded)")
        seats = ctx.policy.engine.max_num_seqs
        if len(B.running) + len(B.inbound) >= seats:
            raise PolicyError(f"{name}: destination {dest} has no seat for request {i} "
                              f"(max_num_seqs={seats})")
        B.reserve(i, nb)
        begin = max(A.now, A.link_free_s)
        dt = float(ctx.cost.transfer_time_s(context, ctx.link_gbps)) * ctx.kv_scale  # + draft
        end = begin + dt
        A.link_free_s = end
        A.depart(i, end)  # its blocks stay held there until the copy ends
        S.status[i] = TRANSFER
        S.migrations[i] += 1  # counted when the copy starts (one cut by the horizon counts)
        S.migrated_to[i] = dest
        self.seq += 1
        heapq.heappush(self.heap, (end, self.seq, i, dest, int(S.gen[i])))
        self.n_migrations += 1
        self.migrated_bytes += context * self.kv_bytes_per_token
        self.migration_s += dt
        if ctx.check is not None:
            ctx.check(A)
            ctx.check(B)

    def land(self) -> None:
        """The earliest copy in flight lands: the request joins its destination's batch."""
        end, _seq, i, dest, gen0 = heapq.heappop(self.heap)
        S, B = self.S, self.pool[dest]
        B.advance(end)
        if B.now < end:
            B.now = end
        nb = B.inbound[i]
        if self.ctx.check is not None:
            context = int(S.computed[i])
            if S.gen[i] != gen0 or context != S.prompt[i] + S.gen[i] - 1 or \
                    nb != -(-context // B.bt) or S.status[i] != TRANSFER:
                raise InvariantError(f"migration of request {i}: tokens or blocks changed in "
                                     f"flight (gen {gen0} -> {S.gen[i]}, context {context}, "
                                     f"blocks {nb})")
        B.land(i)
        if self.ctx.check is not None:
            self.ctx.check(B)

    def stats(self) -> dict[str, float]:
        """``migrations``, ``migrated_gb`` and ``migration_s`` (summed copy time)."""
        return {"migrations": int(self.n_migrations),
                "migrated_gb": self.migrated_bytes / 1e9,
                "migration_s": self.migration_s}
