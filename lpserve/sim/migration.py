"""Live migration of decoding requests between replicas of one pool (stop-and-copy).

The policy's :class:`~lpserve.rebalancer.Rebalancer` is asked every ``period_s`` seconds of
simulated time (a cluster event, never per iteration). For each returned
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
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from lpserve.policy import PolicyError
from lpserve.rebalancer import RebalanceView
from lpserve.sim.state import RUNNING, TRANSFER
from lpserve.views import readonly

if TYPE_CHECKING:  # pragma: no cover
    from lpserve.sim.engine import Simulation
    from lpserve.sim.replica import Replica

_frozen = partial(readonly, copy=True)  # the view never shares the simulator's arrays


class Migrator:
    """The rebalancing events of one simulation: ticks and migration landings."""

    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim
        self.S = sim.state
        self.rb = sim.policy.rebalancer
        self.period_s = float(self.rb.period_s)
        self.pool: list["Replica"] = sim.back if sim.back else sim.front
        self.decode_pool = bool(sim.back)
        self.n_ticks = 1
        self.heap: list[tuple[float, int, int, int, int]] = []  # (end, seq, i, dest, gen)
        self.seq = 0
        self.n_migrations = 0
        self.migrated_bytes = 0.0
        self.migration_s = 0.0
        self.kv_bytes_per_token = float(sim.cost.kv_bytes_per_token) * sim.kv_scale  # + draft

    # ------------------------------------------------------------------ event loop
    @property
    def next_tick_s(self) -> float:
        return self.n_ticks * self.period_s

    def next_event_s(self) -> float:
        return min(self.heap[0][0] if self.heap else math.inf, self.next_tick_s)

    def run_until(self, t: float) -> None:
        """Process every landing and tick at or before ``t`` (and before the horizon)."""
        horizon = self.sim.horizon_s
        if not self.heap and math.isfinite(t) and self._idle():
            # nothing runs before t: the ticks before it would find no candidates
            self.n_ticks = max(self.n_ticks, math.ceil(t / self.period_s))
        while True:
            land = self.heap[0][0] if self.heap else math.inf
            tick = self.next_tick_s
            e = min(land, tick)
            if e > t or e >= horizon:
                return
            if land <= tick:
                self._land(*heapq.heappop(self.heap))
            else:
                self.n_ticks += 1
                self._tick(tick)

    def drain(self) -> None:
        """After the last arrival: keep ticking while the pool has work, land every copy."""
        horizon = self.sim.horizon_s
        while True:
            e = self.next_event_s()
            if e == math.inf or e >= horizon:
                return
            if not self.heap:
                self._advance_to(e)
                if not self._busy(e):
                    return
            self.run_until(e)

    def _replicas(self) -> list["Replica"]:
        return self.sim.front + self.sim.back if self.decode_pool else self.pool

    def _idle(self) -> bool:
        """No request in the pool (nor, disaggregated, in the prefill pool or in flight)."""
        return not self.sim.kv_heap and not any(r.running or r.waiting or r.releases
                                                for r in self._replicas())

    def _busy(self, t: float) -> bool:
        """Whether the replicas (advanced to ``t``) may still have candidates after ``t``;
        a replica that idles before ``t`` with requests waiting holds them back for good."""
        return bool(self.sim.kv_heap) or any(
            r.running or r.releases or (r.waiting and r.now >= t) for r in self._replicas())

    # ------------------------------------------------------------------ decisions
    def _advance_to(self, t: float) -> None:
        """Bring the pool to ``t`` (in a disaggregated cluster after the prefill pool and
        the KV handovers ready by ``t``, in the order of the main loop)."""
        sim = self.sim
        if self.decode_pool:
            for r in sim.front:
                r.advance(t)
            sim._flush_kv(t)
        for r in self.pool:
            r.advance(t)

    def _tick(self, t: float) -> None:
        self._advance_to(t)
        cand = self._candidates()
        if not cand:
            return
        view = self.view(t, cand)
        moves = self._validate(self.rb.migrate(view), view)
        for i, d in moves:
            self.start(i, d)

    def _candidates(self) -> list[tuple[int, int]]:
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
        sim, S, bt = self.sim, self.S, self.sim.block_tokens
        cand = self._candidates() if cand is None else cand
        idx = np.array([i for i, _ in cand], np.int64)
        src = np.array([k for _, k in cand], np.int64)
        ctx = S.computed[idx]
        link = sim.link_gbps
        mig = np.array([float(sim.cost.transfer_time_s(int(c), link)) * sim.kv_scale
                        for c in ctx.tolist()])
        eng = sim.policy.engine
        pool = self.pool
        params = sim.params

        def decode_iteration_s(context_tokens: np.ndarray) -> float:
            from lpserve.cost._kernels import iteration_time

            c = np.ascontiguousarray(context_tokens, dtype=np.int64)
            z = np.zeros(0, np.int64)
            return float(iteration_time(params, z, z, c)) if c.size else 0.0

        clair = sim.policy.meta.clairvoyant
        return RebalanceView(
            now_s=float(t), block_tokens=bt,
            free_blocks=_frozen(np.array([r.bm.available - r.wm_blocks for r in pool], np.int64)),
            total_blocks=_frozen(np.array([r.bm.total for r in pool], np.int64)),
            running=_frozen(np.array([len(r.running) for r in pool], np.int64)),
            waiting=_frozen(np.array([len(r.waiting) for r in pool], np.int64)),
            seats=_frozen(np.array([eng.max_num_seqs - len(r.running) - len(r.inbound)
                                for r in pool], np.int64)),
            waiting_blocks=tuple(_frozen(np.array([r._admit_need(w) for w in r.waiting],
                                              np.int64)) for r in pool),
            request=_frozen(idx), replica=_frozen(src), prompt_tokens=_frozen(S.prompt[idx]),
            generated_tokens=_frozen(S.gen[idx]), context_tokens=_frozen(ctx),
            blocks=_frozen(-(-ctx // bt)), migration_s=_frozen(mig),
            predicted_lo=None if sim.pred_lo is None else _frozen(sim.pred_lo[idx]),
            predicted_hi=None if sim.pred_hi is None else _frozen(sim.pred_hi[idx]),
            output_tokens=_frozen(S.out[idx]) if clair else None,
            decode_iteration_s=decode_iteration_s)

    def _validate(self, out, view: RebalanceView) -> list[tuple[int, int]]:
        name = self.sim.role_name("rebalancer")
        if out is None:
            return []
        a = np.asarray(out)
        if a.size == 0:
            return []
        if a.ndim != 2 or a.shape[1] != 2 or a.dtype.kind not in "iu":
            raise PolicyError(f"{name}: migrate() returned shape {a.shape} dtype {a.dtype}, "
                              "expected (n_moves, 2) integer rows (request, destination)")
        where = dict(zip(view.request.tolist(), view.replica.tolist()))
        seen: set[int] = set()
        moves = []
        for i, d in a.tolist():
            if not 0 <= i < self.S.n:
                raise PolicyError(f"{name}: migrate() named unknown request {i} "
                                  f"(trace has {self.S.n})")
            if i not in where:
                from lpserve.sim.state import STATUS_NAMES

                raise PolicyError(f"{name}: request {i} is not a running decoding request "
                                  f"(status {STATUS_NAMES[self.S.status[i]]}); only those "
                                  "may migrate")
            if not 0 <= d < len(self.pool):
                raise PolicyError(f"{name}: destination {d} of request {i} outside "
                                  f"[0, {len(self.pool)})")
            if d == where[i]:
                raise PolicyError(f"{name}: request {i} is already on destination {d}")
            if i in seen:
                raise PolicyError(f"{name}: request {i} migrates twice in one decision")
            seen.add(i)
            moves.append((i, d))
        return moves

    # ------------------------------------------------------------------ mechanics
    def start(self, i: int, dest: int) -> None:
        """Reserve ``i``'s blocks on ``dest``, take it off its replica, start the copy."""
        sim, S, bt = self.sim, self.S, self.sim.block_tokens
        name = sim.role_name("rebalancer")
        src = int(S.migrated_to[i]) if S.migrations[i] else \
            int(S.decode_replica[i] if self.decode_pool else S.replica[i])
        A, B = self.pool[src], self.pool[dest]
        ctx = int(S.computed[i])
        nb = -(-ctx // bt)
        room = B.bm.available - B.wm_blocks
        if nb > room:
            raise PolicyError(f"{name}: request {i} needs {nb} KV blocks, destination {dest} "
                              f"has {room} free (capacity exceeded)")
        if len(B.running) + len(B.inbound) >= sim.policy.engine.max_num_seqs:
            raise PolicyError(f"{name}: destination {dest} has no seat for request {i} "
                              f"(max_num_seqs={sim.policy.engine.max_num_seqs})")
        B._make_room(nb)
        B.bm.take_anon(nb)
        B.inbound[i] = nb
        begin = max(A.now, A.link_free_s)
        dt = float(sim.cost.transfer_time_s(ctx, sim.link_gbps)) * sim.kv_scale  # + draft KV
        end = begin + dt
        A.link_free_s = end
        A.running.remove(i)
        heapq.heappush(A.releases, (end, i, S.slots[i], int(S.anon[i])))  # freed at end
        S.slots[i] = []
        S.nslots[i] = 0
        S.anon[i] = 0
        S.status[i] = TRANSFER
        S.migrations[i] += 1  # counted when the copy starts (one cut by the horizon counts)
        S.migrated_to[i] = dest
        self.seq += 1
        heapq.heappush(self.heap, (end, self.seq, i, dest, int(S.gen[i])))
        self.n_migrations += 1
        self.migrated_bytes += ctx * self.kv_bytes_per_token
        self.migration_s += dt
        sim.check_replica(A)
        sim.check_replica(B)

    def _land(self, end: float, _seq: int, i: int, dest: int, gen0: int) -> None:
        S, B = self.S, self.pool[dest]
        B.advance(end)
        if B.now < end:
            B.now = end
        nb = B.inbound.pop(i)
        if self.sim.check:
            from lpserve.sim.engine import InvariantError

            ctx = int(S.computed[i])
            if S.gen[i] != gen0 or ctx != S.prompt[i] + S.gen[i] - 1 or \
                    nb != -(-ctx // B.bt) or S.status[i] != TRANSFER:
                raise InvariantError(f"migration of request {i}: tokens or blocks changed in "
                                     f"flight (gen {gen0} -> {S.gen[i]}, context {ctx}, "
                                     f"blocks {nb})")
        S.anon[i] = nb
        S.status[i] = RUNNING
        B.running.append(i)
        self.sim.check_replica(B)

    def stats(self) -> dict[str, float]:
        return {"migrations": int(self.n_migrations),
                "migrated_gb": self.migrated_bytes / 1e9,
                "migration_s": self.migration_s}
