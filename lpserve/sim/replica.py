"""One serving replica: continuous batching over paged KV blocks.

The replica keeps its own clock ``now`` (end of its last iteration) and is advanced lazily:
``advance(t)`` runs every iteration that starts before ``t``. Python plans one iteration
per event (admission, prefill chunk, preemption, eviction, completion); runs of
pure-decode iterations between events go to :func:`lpserve.sim._kernels.decode_advance`
(with ``EngineConfig.speculation``, one speculative step: :mod:`lpserve.sim.speculative`).
In reference mode the planner runs before every iteration instead. The semantics are
written down in ``models/simulator.md``.

It gets everything from the run's :class:`~lpserve.sim.state.RunContext` and reports
completions and KV handoffs through its ``events`` outbox, never calling the event loop.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from lpserve.cost import iteration_time
from lpserve.cost.preemption import swap_one_way_s
from lpserve.policy.checks import check_ranks
from lpserve.policy.roles import next_tick_s
from lpserve.sim import _kernels as K
from lpserve.sim import preempt
from lpserve.sim import transfer as X
from lpserve.sim import views as V
from lpserve.sim.blocks import BlockManager
from lpserve.sim.eviction import (
    SESSION_MIN_HIT_TOKENS,
    alloc_prompt_blocks,
    choose_evictions,
    freed_blocks,
    queued_slots,
)
from lpserve.sim.moves import KVMoves
from lpserve.sim.offload import Offload, found_tokens
from lpserve.sim.state import FINISHED, RUNNING, WAITING, XF_RESIDENT, RunContext

_BIG = 1 << 62
_EMPTY = np.zeros(0, np.int64)


class Replica(KVMoves):
    """Engine of one replica; ``role`` is ``"colocated"``, ``"prefill"`` or ``"decode"``."""

    compiled = False

    def __init__(self, ctx: RunContext, index: int, role: str, *, cost=None,
                 params: np.ndarray | None = None, total_blocks: int | None = None) -> None:
        """Replica ``index`` of ``role``; ``cost``, ``params`` and ``total_blocks`` (its own
        cost model, its float64 parameters and its KV blocks, in a heterogeneous cluster)
        default to the run's (``ctx``)."""
        self.ctx = ctx
        self.S = ctx.state
        self.index = index
        self.role = role
        self.key = (role, index)
        self.eng = eng = ctx.policy.engine
        self.bt = ctx.block_tokens
        self.cost = ctx.cost if cost is None else cost
        self.params = ctx.params if params is None else params
        total = ctx.total_blocks if total_blocks is None else int(total_blocks)
        self.bm = BlockManager(total, self.bt, eng.prefix_caching)
        self.wm_blocks = int(eng.watermark * total)
        self.reserve_blocks = (0 if eng.reserve_tokens is None
                               else -(-eng.reserve_tokens // self.bt))
        self.host_free = ctx.host_blocks
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.releases: list[tuple[float, int, list[int], int]] = []
        self.inbound: dict[int, int] = {}  # migrating request -> blocks reserved here
        self.now = 0.0
        self.link_free_s = 0.0
        self.n_iters = 0
        self.pending_until, self._ready = 0, _BIG  # schedule_ahead (models/simulator.md (32))
        self.n_decode_iters = 0
        self.used_block_s = 0.0
        # preemptions (n_swaps counts compressed ones too) and the context tokens swapped
        # compressed; time in iterations, of it on swaps; compressed swaps not yet priced
        self.n_swaps = self.n_compressed_swaps = self.n_recomputes = self.compressed_tokens = 0
        self.busy_s = self.swap_wait_s = self.swap_s_pending = 0.0
        self._ranks: dict[int, float] | None = None
        self.swap_blocks_pending = 0  # blocks swapped since the last iteration (serial)
        # the transfer engine (lpserve/sim/transfer.py): the host link of overlapped swaps
        # and the requests whose swap-in was issued (they hold a seat, not yet running)
        overlap = eng.transfers == "overlap"
        self.link = X.HostLink(eng.link_order) if overlap else None
        self.proactive, self.proactive_evicted = overlap and eng.proactive_swap, 0  # (30)
        self.loading: list[int] = []
        self._stalled = False  # the last step waited for swap-outs to free blocks
        self._blocked: tuple[int, int] | None = None  # where admission stopped, its need
        self._resumed = False
        self.turn_gap: dict[int, float] = {}  # returning sessions' inter-turn gaps (s)
        self.ctl = eng.budget_controller  # sets decode-first budgets, observes iterations
        self.observer = getattr(ctx.policy.evictor, "observes_requests", False)
        # a scheduler ranked in Python is asked at the start of every planning step that
        # has candidates (so the compiled engine can ask it at the same points)
        self._eager_ranks = ctx.ranks_in_python
        self.spec = None if ctx.spec is None else ctx.spec.start(self.key)
        # vLLM's CPU KV offload (lpserve/sim/offload.py, simulator.md (35)) or None
        self.offload = Offload.for_replica(eng.kv_offload_gib, self.cost, self.bt,
                                           ctx.kv_scale)

    # =============================================================== public
    outstanding = property(lambda self: len(self.waiting) + len(self.running) +
                           len(self.loading), doc="Requests routed here and not finished "
                           "(waiting, swapping in or running).")
    n_waiting = property(lambda self: len(self.waiting), doc="Requests waiting.")
    n_running = property(lambda self: len(self.running), doc="Requests running.")

    def enqueue(self, i: int, t: float) -> None:
        """Request ``i`` joins this replica at time ``t`` (after everything before ``t``)."""
        self.advance(t)
        S = self.S
        reason = S.reject_reason(i, self.eng, self.bm.total, self.wm_blocks,
                                 self.reserve_blocks, self.bt)
        if reason:
            S.reject(i, reason)
            return
        self.now = max(self.now, t)
        if self.eng.schedule_ahead and self.running:  # the next batch is fixed already
            S.ready_iter[i] = self.pending_until = self.n_iters + 1
        self.waiting.append(i)
        S.status[i] = WAITING
        (S.decode_replica if self.role == "decode" else S.replica)[i] = self.index
        if self.observer:
            self._observe("arrive", i)
        self._check()

    def _observe(self, kind: str, i: int) -> None:
        """Tell an evictor that observes requests that ``i`` arrived or finished here."""
        self.ctx.policy.evictor.observe(V.request_event(self, kind, i))

    def advance(self, t: float) -> None:
        """Run every iteration that starts before ``min(t, horizon)``."""
        stop = min(t, self.ctx.horizon_s)
        while True:
            self.apply_releases()
            if self.now >= stop:
                break
            if not self._step(stop):
                if self._wait_until(stop):
                    continue
                break
            self._check()

    def step(self, stop: float) -> bool:
        """One planning step (one iteration or a decode run) that starts before ``stop``
        (and the horizon); False if the replica has nothing to do before it."""
        stop = min(stop, self.ctx.horizon_s)
        self.apply_releases()
        if self.now >= stop:
            return False
        if self._step(stop):
            self._check()
            return True
        return self._wait_until(stop)

    def _wait_until(self, stop: float) -> bool:
        """Idle to the next release or copy end before ``stop`` (False if none); the
        running requests of a stalled step wait on the link meanwhile."""
        t = self._next_event_s()
        if t >= stop:
            return False
        if self._stalled and t > self.now:
            self.S.link_wait[self.running] += t - self.now
        self.now = max(self.now, t)
        return True

    def _next_event_s(self) -> float:
        """The next release, copy end or end of a load from the host tier (inf if none)."""
        return min(self.releases[0][0] if self.releases else math.inf,
                   self.link.next_end_s if self.link is not None else math.inf,
                   self.offload.next_end_s(self.now) if self.offload is not None else math.inf)

    def apply_releases(self) -> None:
        """Free the blocks of outgoing copies (KV handoffs, migrations) that ended."""
        while self.releases and self.releases[0][0] <= self.now:
            _, _, slots, anon = heapq.heappop(self.releases)
            self.bm.release(slots, anon, self.now)

    def account(self, dt_s: float, n_iters: int, decode_only: bool) -> None:
        """Advance the clock by ``n_iters`` iterations taking ``dt_s`` seconds in all (the
        blocks in use held over them)."""
        self.now += dt_s
        self.busy_s += dt_s
        self.used_block_s += self.bm.used * dt_s
        self.n_iters += n_iters
        if decode_only:
            self.n_decode_iters += n_iters

    def cached_prefix_tokens(self, i: int) -> int:
        """Prompt tokens of waiting request ``i`` found in this replica's prefix cache."""
        return len(self.bm.match(self.S.block_keys(i, self.bt))) * self.bt

    def _check(self) -> None:
        if self.ctx.check is not None:
            self.ctx.check(self)

    # =============================================================== ranking
    def ranks(self) -> dict[int, float]:
        """The scheduler's rank of every candidate (waiting and running) at this planning
        step, asked once per step."""
        if self._ranks is None:
            cand = self.waiting + self.running
            view = V.scheduler_view(self, cand)
            r = check_ranks(self.ctx.policy.scheduler.rank(view), len(cand),
                            self.ctx.who("scheduler"), view.request)
            self._ranks = dict(zip(cand, r.tolist()))
        return self._ranks

    # =============================================================== memory
    def make_room(self, need: int) -> bool:
        """Ensure ``need`` plain free blocks, evicting cached ones; False if impossible."""
        bm = self.bm
        if need <= bm.plain_free:
            return True
        if need > bm.available:
            return False
        n = min(bm.evictable, max(need - bm.plain_free, self.eng.evict_batch_blocks))
        ev = self.ctx.policy.evictor
        queued = (queued_slots(bm, self.S, self.waiting, self.bt)
                  if getattr(ev, "reads_queue", False) else None)
        bm.evict(choose_evictions(bm, ev, n, now_s=self.now, replica=self.index,
                                  queued=queued, who=self.ctx.who("evictor")))
        return True

    def release_request(self, i: int, at_s: float) -> None:
        """Drop request ``i``'s KV blocks on this replica at time ``at_s``."""
        S = self.S
        self.turn_gap.pop(i, None)
        self.bm.release(S.slots[i], int(S.anon[i]), at_s, int(S.thread[i]),
                        int(S.wait[i]) if S.status[i] == FINISHED else -1)
        S.slots[i] = []
        S.nslots[i] = 0
        S.anon[i] = 0

    def preemption_mode(self, v: int, held: int) -> str:
        """Victim ``v``'s preemption mode (:func:`lpserve.sim.preempt.preemption_mode`)."""
        return preempt.preemption_mode(self, v, held)

    def preempt(self, v: int) -> None:
        """Preempt running request ``v`` (:func:`lpserve.sim.transfer.preempt`)."""
        X.preempt(self, v)

    def admit_need(self, i: int) -> int:
        """KV blocks waiting request ``i`` needs to be admitted (its whole context)."""
        S, bt = self.S, self.bt
        if S.swapped[i]:
            return int(S.swap_gpu_blocks[i])
        if S.xfer[i] == XF_RESIDENT:
            return 0
        if S.kv_remote[i]:
            return -(-int(S.computed[i]) // bt)
        full = self.reserve_blocks or -(-int(S.prompt[i] + S.gen[i]) // bt)
        if self.eng.prefix_caching:
            full -= len(self.bm.match(S.block_keys(i, bt)))
        return max(full, 0)

    def _link_net(self) -> int:
        """Blocks the host link's queued copies will free, net of those promised to
        swap-ins (0 without an overlapped link)."""
        return 0 if self.link is None else self.link.freeing - self.link.promised

    def _preempt_outranked(self) -> None:
        """``EngineConfig.priority_preemption`` (:func:`lpserve.sim.preempt.outranked_victims`;
        with proactive swapping, :class:`lpserve.sim.transfer.HostRoom` parks victims)."""
        bm, room = self.bm, X.HostRoom(self) if self.proactive else None
        victims = preempt.outranked_victims(
            [i for i in self.waiting if self.S.ready_iter[i] <= self._ready], self.running,
            self.ranks(),
            self.eng.max_num_seqs - len(self.running) - len(self.loading),
            bm.available - self.wm_blocks + self._link_net(), bm.total - self.wm_blocks,
            self.admit_need, lambda v, taken: freed_blocks(bm, self.S, v, taken)
            if room is None or room(v) else 0)
        for v in victims:
            self.preempt(v) if room is None else room.park(v)

    # =============================================================== admission
    def _admit(self, budget: int, chunks: list, allow_chunk: bool) -> int:
        """Admit waiting requests in rank order; returns the token budget left."""
        S, eng, bm, bt = self.S, self.eng, self.bm, self.bt
        ranks = self.ranks()
        order = sorted((ranks[i], pos, i) for pos, i in enumerate(self.waiting)
                       if ranks[i] != math.inf and S.ready_iter[i] <= self._ready)
        for _, _, i in order:
            if len(self.running) + len(self.loading) >= eng.max_num_seqs or budget <= 0:
                break
            L = int(S.prompt[i] + S.gen[i])
            if self.link is not None and (S.swapped[i] or S.xfer[i]):
                got = X.admit_swapped(self, i)
                if got < 0:
                    self._blocked = (i, self.admit_need(i))
                    break
                self._resumed |= got > 0
                continue
            if S.swapped[i] or S.kv_remote[i]:
                n = int(S.swap_gpu_blocks[i]) if S.swapped[i] else -(-int(S.computed[i]) // bt)
                if bm.available - n < self.wm_blocks:
                    break
                self.make_room(n)
                bm.take_anon(n)
                S.anon[i] = n
                if S.swapped[i]:
                    self.host_free += int(S.host_blocks[i])
                    if S.compressed[i]:  # dequantize pass and compressed PCIe bytes
                        self.swap_s_pending += swap_one_way_s(
                            self.cost, n, bt, "compress-swap", eng.compression_ratio)
                        S.compressed[i] = False
                    else:
                        self.swap_blocks_pending += n
                    S.host_blocks[i] = 0
                    S.swap_gpu_blocks[i] = 0
                    S.swapped[i] = False
                S.kv_remote[i] = False
                self._resumed = True
            else:
                keys = S.block_keys(i, bt) if eng.prefix_caching else []
                hits = bm.match(keys)
                cached, n_load = found_tokens(self.offload, keys, len(hits), L, bt)
                chunk = 0 if n_load else L - cached  # a loading request waits for it (35)
                if chunk > budget:
                    if not allow_chunk:
                        if L > eng.max_num_batched_tokens:
                            self._drop_waiting(i, "context_exceeds_token_budget")
                            continue
                        break
                    chunk = budget
                target = self.reserve_blocks or -(-(cached + chunk) // bt)
                full = self.reserve_blocks or -(-L // bt)
                if full > bm.total - self.wm_blocks:
                    self._drop_waiting(i, "context_exceeds_kv")
                    continue
                n_hit_free = int(np.sum(bm.ref[hits] == 0)) if hits else 0
                if bm.available - n_hit_free - (target - len(hits)) < self.wm_blocks:
                    # the blocks this admission takes from ``available``: new ones and
                    # its free cached hits (proactive swapping frees that many for it)
                    self._blocked = (i, n_hit_free + target - len(hits))
                    break
                gap = 0.0
                if len(hits) * bt >= SESSION_MIN_HIT_TOKENS:
                    gap = self.now - float(bm.last_access_s[hits[-1]])
                    self.turn_gap[i] = gap
                bm.acquire(hits, self.now, gap)
                S.slots[i] = list(hits)
                S.nslots[i] = len(hits)
                S.computed[i] = cached
                S.cached_tok[i] += cached
                S.seen_tok[i] += L
                alloc_prompt_blocks(self, i, target)
                if self.offload is not None:  # a load from the host tier (35)
                    S.link_wait[i] += self.offload.admit(i, keys, len(hits), n_load, cached,
                                                         self.now)
                    self._resumed |= n_load > 0  # it joins a batch planned again
                if chunk:
                    chunks.append((i, chunk, cached))
                    budget -= chunk
            if np.isnan(S.first_sched[i]):
                S.first_sched[i] = self.now
            self.waiting.remove(i)
            self.running.append(i)
            S.status[i] = RUNNING
        return budget

    def _drop_waiting(self, i: int, reason: str) -> None:
        self.waiting.remove(i)
        self.S.reject(i, reason)

    # =============================================================== one step
    def _step(self, stop: float) -> bool:
        """Plan and run one iteration (or a run of decode iterations); False if idle (or
        stalled on the link)."""
        self._stalled, self._blocked = False, None
        if self.link is not None:
            if (self.waiting or self.running) and X.joins_by(self.link, self.now):
                # rank before a swapped-in request joins: link time is no service (28)
                self._ranks = None
                self.ranks()
            X.tick(self)  # copy ends (and the next starts) up to now
        if not self.running and not self.waiting:
            return False
        S, eng = self.S, self.eng
        self._ranks, self._resumed = None, False
        self._ready = self.n_iters if self.running else _BIG  # nothing ran: admit all
        if self._eager_ranks:
            self.ranks()
        chunks: list[tuple[int, int, int]] = []
        budget = eng.max_num_batched_tokens
        admit_ok = bool(self.waiting) and not (eng.batching == "static" and self.running)
        if admit_ok and eng.priority_preemption and self.running:
            n_run = len(self.running)
            self._preempt_outranked()
            # the candidates changed after this step's ranking: as in the reference
            # mode, the scheduler sees the new set after one iteration, not a whole run
            self._resumed = len(self.running) < n_run
        if eng.batching == "prefill-first" and admit_ok:
            self._admit(budget, chunks, allow_chunk=False)
            admit_ok = False
            if chunks:
                if self.proactive:
                    X.proactive(self, self._blocked)
                return self._iterate(chunks, [])
        # running requests in decode phase and in (chunked) prefill phase
        decodes, partial = S.phases(self.running)
        if self.offload is not None:  # requests loading from the host tier wait (35)
            decodes, partial = (self.offload.ready(r, self.now) for r in (decodes, partial))
        need = S.decode_need(decodes, self.bt)
        while need > self.bm.plain_free:
            if self.make_room(need):
                break
            if self.link is not None and need <= self.bm.available + self.link.freeing:
                self._stalled = True  # wait for the swap-outs in flight to free blocks
                break
            if self.proactive and X.relieve(self):
                continue  # a resident request is swapped out (its blocks come back)
            self._preempt_worst()
            decodes = [i for i in decodes if i in self.running]
            need = S.decode_need(decodes, self.bt)
            admit_ok = False  # as vLLM: no new admissions in a step that preempted
            self._resumed = True  # the next step plans again (single iteration now)
        if self._stalled:
            if self.proactive:
                X.proactive(self, None)
            return False
        if need:
            idx = np.asarray(decodes, np.int64)
            grow = idx[S.computed[idx] + 1 > (S.anon[idx] + S.nslots[idx]) * self.bt]
            self.bm.take_anon(int(grow.size))
            S.anon[grow] += 1
        budget -= len(decodes)
        if self.ctl is not None and eng.batching == "decode-first":
            budget = min(budget, int(self.ctl.budget(V.budget_view(self, decodes, budget))))
        no_room = False  # a running prefill got no chunk for want of KV room (34)
        if eng.batching == "decode-first":
            partial = [i for i in partial if i in self.running]
            if partial:
                ranks = self.ranks()
                partial.sort(key=lambda i: (ranks.get(i, math.inf), self.running.index(i)))
            for i in partial:
                if budget <= 0:
                    break
                L = int(S.prompt[i] + S.gen[i])
                c = min(L - int(S.computed[i]), budget)
                held = int(S.anon[i] + S.nslots[i])
                room = (held + self.bm.available) * self.bt - int(S.computed[i])
                c = min(c, room)
                if c <= 0:
                    no_room |= room <= 0
                    continue
                alloc_prompt_blocks(self, i, -(-(int(S.computed[i]) + c) // self.bt))
                chunks.append((i, c, int(S.computed[i])))
                budget -= c
        if admit_ok and budget > 0:
            self._admit(budget, chunks, allow_chunk=eng.chunked_prefill)
        freed = self.proactive and X.proactive(self, self._blocked)
        if not chunks and not decodes:
            if no_room and not (self._resumed or freed or self._link_net() > 0 or (
                    self.offload is not None and math.isfinite(self.offload.next_end_s(self.now)))):
                self._preempt_worst()  # rule (34): the prefills wait on each other
                self._resumed = True  # the next step plans again
            # a resumed request decodes next step, blocks freed now admit one; else idle
            return self._resumed or freed
        if chunks or self.swap_blocks_pending or self.swap_s_pending or self._resumed or \
                self.proactive_evicted or self.role == "prefill" or \
                not S.gen[np.asarray(decodes, np.int64)].all() or self.pending_until > self.n_iters:
            return self._iterate(chunks, decodes)
        if self.spec is not None:  # one speculative step (lpserve/sim/speculative.py)
            return self.spec.step(self, decodes)
        return self._decode_run(decodes, stop)

    def _preempt_worst(self) -> None:
        """Preempt the worst-ranked running request for KV memory (rules (10), (34)); the
        last one running, with nothing being released, is dropped."""
        v = preempt.worst_running(self.running, self.ranks())
        if len(self.running) == 1 and not self.releases:
            self.running.remove(v)
            self.release_request(v, self.now)
            self.S.reject(v, "context_exceeds_kv")
        else:
            self.preempt(v)

    def _iterate(self, chunks: list, decodes: list[int]) -> bool:
        """One iteration with prefill chunks and/or decodes (blocks already allocated)."""
        S = self.S
        pt = np.array([c for _, c, _ in chunks], np.int64)
        pc = np.array([h for _, _, h in chunks], np.int64)
        didx = np.asarray(decodes, np.int64)
        dc = S.computed[didx] if decodes else _EMPTY
        dt = float(iteration_time(self.params, pt, pc, dc))
        if self.spec is not None:  # the draft prefills the chunks too (speculative.py)
            dt += self.spec.prefill_s(chunks)
        wait = 0.0
        if self.swap_blocks_pending:
            sw = self.cost.swap_time_s(self.swap_blocks_pending, self.bt) * self.ctx.kv_scale
            dt += sw
            self.swap_wait_s += sw
            wait += sw
            self.swap_blocks_pending = 0
        if self.swap_s_pending:  # serial swaps; with overlap, only (de)quantize passes
            dt += self.swap_s_pending
            self.swap_wait_s += self.swap_s_pending
            wait += self.swap_s_pending if self.link is None else 0.0
            self.swap_s_pending = 0.0
        if wait:  # every request of this iteration waits for the serial copies
            S.link_wait[[i for i, _, _ in chunks] + list(decodes)] += wait
        self.account(dt, 1, decode_only=not chunks)
        done = []
        for i, c, h in chunks:
            S.computed[i] += c
            if self.offload is not None:  # write-through store to the host tier (35)
                self.offload.computed(S.block_keys(i, self.bt), h, h + c)
            if S.computed[i] == S.prompt[i] + S.gen[i]:
                done.append(i)
        for i in decodes:
            S.computed[i] += 1
            done.append(i)
        if self.ctl is not None:
            self.ctl.observe(V.iteration_view(self, dt, pt, pc, dc, done))
        for i in done:
            self._produce(i)
        return True

    def _decode_run(self, decodes: list[int], stop: float) -> bool:
        S = self.S
        idx = np.asarray(decodes, np.int64)
        ctx = S.computed[idx]
        gen = S.gen[idx]
        held0 = S.anon[idx] + S.nslots[idx]
        held = held0.copy()
        stop_s = min(stop, self._next_event_s())  # releases, copy and load ends (35)
        q = self.ctx.policy.scheduler.quantum_s
        if q:
            stop_s = min(stop_s, next_tick_s(self.now, q))  # always > now
        # the planner already gave this first iteration its new blocks (held0), so the
        # kernel's first iteration needs none; later ones take plain free blocks
        max_iters = 1 if self.ctx.reference else _BIG
        view = None
        if self.ctl is not None:  # the controller may need to decide again within the run
            view = V.decode_run_view(self, idx, ctx, held0,
                                     min(max_iters, int((S.out[idx] - gen).min())))
            max_iters = int(self.ctl.decode_limit(view))
        free = self.bm.plain_free
        if self.proactive:
            free = min(free, X.resident_cap(self, self._blocked))
        if self.eng.priority_preemption and self.waiting:
            cap = preempt.free_cap(self.running, self.waiting, self.ranks(), self.admit_need,
                                   self.bm.available - self.wm_blocks + self._link_net(),
                                   self.bm.total - self.wm_blocks)
            free = min(free, max(cap, 0))
            if cap < 0:
                max_iters = 1
        n, now, taken, _, area = K.decode_advance(
            self.params, ctx, gen, S.out[idx], held, self.bt, free,
            self.bm.used, self.now, stop_s, max_iters)
        if view is not None:
            self.ctl.observe_decode_run(view, int(n))
        if n == 0:  # cannot happen: the caller checked now < stop and memory
            raise RuntimeError("internal: empty decode run")
        self.bm.take_anon(int(taken))
        S.anon[idx] += held - held0
        S.computed[idx] = ctx
        S.gen[idx] = gen
        self.busy_s += float(now) - self.now
        self.now = float(now)
        self.used_block_s += area
        self.n_iters += n
        self.n_decode_iters += n
        fin = idx[gen >= S.out[idx]]
        for i in fin.tolist():
            self.finish(i)
        return True

    # =============================================================== outcomes
    def _produce(self, i: int) -> None:
        S = self.S
        S.gen[i] += 1
        if np.isnan(S.first_token[i]):
            S.first_token[i] = self.now
        if S.gen[i] >= S.out[i]:
            self.finish(i)
        elif self.role == "prefill":
            self._handoff(i)

    def finish(self, i: int) -> None:
        """Running request ``i`` produced its last token at ``now``."""
        S = self.S
        S.finish[i] = self.now
        S.status[i] = FINISHED
        self.running.remove(i)
        self.release_request(i, self.now)
        if self.observer:
            self._observe("finish", i)
        S.forget_keys(i)
        self.ctx.events.finish(self.now, i)
