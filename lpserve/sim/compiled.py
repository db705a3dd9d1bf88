"""The replica engine: replicas whose planning runs in numba.

A :class:`CompiledRun` holds the arrays one run's replicas share (the per-request state,
the scheduler's compiled state) and builds :class:`CompiledReplica` objects, the
replicas that the event loop, the migrator and the invariant checker drive; the kernels
(``_pool``, ``_ranks``, ``_state_kernels``, ``_step_kernels``, ``_replica_kernels``) do
the planning. Every run uses them: the reference mode (``reference=True``) plans one
iteration per step, and gives the same per-request results (``models/simulator.md``
(15), (16)). An evictor, a preemption decider, a budget controller or a speculation
decider written in Python is asked in a pause (:mod:`lpserve.sim.hooks`). A scheduler
written in Python runs too: the replica stops at the start of each planning step that
has candidates, the scheduler ranks them from a :class:`~lpserve.policy.SchedulerView`
and the step continues in numba.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lpserve.kernels import dpp as D
from lpserve.kernels import session_keys as SEK
from lpserve.policy.checks import check_ranks
from lpserve.sim import _link_kernels as LK
from lpserve.sim import _offload_kernels as O
from lpserve.sim import _pool as P
from lpserve.sim import _ranks as RK
from lpserve.sim import _replica_kernels as RX
from lpserve.sim import _spec_kernels as SP
from lpserve.sim import _state_kernels as T
from lpserve.sim import _step_kernels as SK
from lpserve.sim import _structs as ST
from lpserve.sim import _vtc_kernels as V
from lpserve.sim import hooks as H
from lpserve.sim._compiled_setup import (
    engine_config,
    request_arrays,
    session_arrays,
    spec_run,
    transfer_coefficients,
)
from lpserve.sim.state import RunContext, State
from lpserve.sim.twins import rank_spec, twin_spec

__all__ = ["CompiledReplica", "CompiledRun", "enqueue_all_cluster", "finalize_reasons"]

_ROLE = {"colocated": T.ROLE_COLOCATED, "prefill": T.ROLE_PREFILL, "decode": T.ROLE_DECODE}
_CTL = {"dpp": SK.CTL_DPP, "tbt-recorder": SK.CTL_RECORDER,
        "vtc": SK.CTL_NONE}  # VTC's meter: its twin reads the engine's arrays instead


class _Blocks:
    """The block-pool counters of a compiled replica (what the router and migrator read)."""

    def __init__(self, rep: "CompiledReplica") -> None:
        self._r = rep

    total = property(lambda self: int(self._r.pool.ist[P.P_TOTAL]))
    plain_free = property(lambda self: int(self._r.pool.ist[P.P_PLAIN]))
    evictable = property(lambda self: int(self._r.pool.ist[P.P_EVICTABLE]))
    anon_used = property(lambda self: int(self._r.pool.ist[P.P_ANON]))
    hashed_used = property(lambda self: int(self._r.pool.ist[P.P_HASHED]))
    used = property(lambda self: int(self._r.pool.ist[P.P_ANON] + self._r.pool.ist[P.P_HASHED]))
    available = property(lambda self: int(self._r.pool.ist[P.P_PLAIN]
                                          + self._r.pool.ist[P.P_EVICTABLE]))

    def take_anon(self, n: int) -> None:
        """Take ``n`` plain free blocks as anonymous used blocks."""
        if not P.take_anon(self._r.r.pool, int(n)):
            raise RuntimeError(f"take_anon({n}) with only {self.plain_free} plain free blocks")


@dataclass(eq=False)
class SwapTables:
    """Swap prices of one cost model, shared by the replicas it prices: ``swap[k]`` the
    seconds to swap ``k`` blocks out, ``cswap[k]`` to compress and swap them and
    ``quant[k]`` to (de)quantize them (zeros unless compress-and-swap or a preemption
    decider needs them), float64 ``(K,)``; ``cost`` the model (it also keeps
    ``id(cost)``, the run's key, unique)."""

    swap: np.ndarray
    cswap: np.ndarray
    quant: np.ndarray
    cost: Any


class LinkCounters:
    """What a run reports of a compiled replica's host link (``Result.stats``):
    ``n_copies`` copies started, ``busy_s`` their summed link seconds."""

    def __init__(self, a: LK.Link) -> None:
        self.n_copies = int(a.li[LK.L_COPIES])
        self.busy_s = float(a.lf[LK.LF_BUSY])


class CompiledRun:
    """The arrays every compiled replica of one run shares.

    Args:
        ctx: the run's :class:`~lpserve.sim.state.RunContext`.
        cluster: the instance's cluster (block size, roles).
        track_finished: report completions to the event loop (dependency releases, online
            predictors, routers that read completions).
    """

    def __init__(self, ctx: RunContext, cluster: Any, track_finished: bool,
                 max_total_blocks: int | None = None) -> None:
        self.ctx = ctx
        S: State = ctx.state
        pol = ctx.policy
        eng = pol.engine
        n, bt = S.n, ctx.block_tokens
        self.req_a, n_known = request_arrays(ctx, max_total_blocks or ctx.total_blocks)
        self.plo, self.phi = self.req_a.plo, self.req_a.phi
        self.req = ST.new_req(*self.req_a)
        kind, fp, ip = rank_spec(pol.scheduler, ctx.ranks_in_python)
        if kind == RK.R_STATIC:  # one key per request (StaticOrder), checked before use
            pol.scheduler.check_size(n)
        if kind == RK.R_VTC:  # weights, tiers, caps and deadlines over the run's tenants
            fp, ip = V.vtc_params(pol.scheduler, S.tenant)
        self.rank_kind = kind
        R = cluster.n_replicas
        n_prog = n_known + n
        rf = np.zeros((RK.N_RF, n))
        rf[RK.RF_SERVED] = np.nan
        ticked = kind in RK.TICKED
        width = n if ticked else 1
        self.rk_a = SK.Rk(fp=fp, ip=ip, rf=rf, ri=np.zeros((RK.N_RI, n), np.int64),
                        pf=np.zeros((4, n_prog if kind == RK.R_PROG else
                                     max(R * int(ip[0]), R) if kind == RK.R_VTC else 1)),
                        xf=np.full((R, 2), np.nan),
                        xi=np.zeros((R, RK.N_XI_HEAD + 2 * width), np.int64),
                        xr=np.zeros((R, width)), g=np.zeros(4, np.int64),
                          cand=np.zeros(n, np.int64), run=np.zeros(n, np.int64))
        self.rk = ST.new_rk(*self.rk_a)
        c = eng.budget_controller
        # VTC outside its own meter (twins.vtc_in_pauses) also meters in Python
        cs = None if ctx.ranks_in_python and c is pol.scheduler else twin_spec(c)
        self.ctl_kind = SK.CTL_NONE if c is None else \
            SK.CTL_PYTHON if cs is None else _CTL[cs[0]]
        self.ctl_obj = c
        if self.ctl_kind in (SK.CTL_NONE, SK.CTL_PYTHON):
            self.ctl_a = SK.Ctl(cp=np.zeros(D.N_CP), w=np.ones(1))
        else:
            self.ctl_a = SK.Ctl(cp=np.asarray(c.cparams(block_tokens=bt), np.float64),
                                w=np.asarray(cs[1], np.float64))
        self.ctl = ST.new_ctl(*self.ctl_a)
        ratio = float(eng.compression_ratio)
        # the swap price tables of each cost model a replica runs (one in a homogeneous
        # cluster), shared by its replicas: swap_tables
        self._tables: dict[int, SwapTables] = {}
        a, d = transfer_coefficients(ctx.cost, ctx.link_gbps)
        dec = twin_spec(eng.preemption_decider)
        self.cff = np.zeros(T.N_CFF)
        self.cff[T.D_RATIO] = ratio
        self.cff[T.D_ACC_COST] = float(eng.compression_accuracy_cost)
        self.cff[T.D_KV_SCALE] = ctx.kv_scale
        self.cff[T.D_TR_A], self.cff[T.D_TR_D] = a, d
        self.cff[T.D_QUANTUM] = float(pol.scheduler.quantum_s or 0.0)
        self.cff[T.D_HORIZON] = ctx.horizon_s
        self.cff[T.D_SLO_TTFT], self.cff[T.D_SLO_TPOT] = ctx.slo_ttft_s, ctx.slo_tpot_s
        self.cff[T.D_SWAP_BUDGET], self.cff[T.D_MAX_LOSS] = \
            (dec[1][0], dec[1][1]) if dec is not None else (math.inf, math.inf)
        decider = T.DECIDER_NONE if eng.preemption_decider is None else \
            T.DECIDER_COST if dec is not None else T.DECIDER_PYTHON
        self.cfg = engine_config(ctx, kind, decider, self.ctl_kind, track_finished)
        self.sr_a = spec_run(ctx, n)
        self.sr = ST.new_specrun(*self.sr_a)
        ev = twin_spec(pol.evictor) if eng.prefix_caching else None
        if ev is None:
            self.ev_kind = P.EV_EXTERNAL if eng.prefix_caching else P.EV_LRU
            self.ev_params = (0.0, 0.0, 1.0, 1.0)
        else:
            self.ev_kind = P.EVICTOR_KINDS[ev[0]]
            self.ev_params = tuple(float(x) for x in ev[1])
        # a session-aware evictor's learned state, in every pool (they learn and evict
        # in the kernels; ttl-pin's duel is told of finishes of threads, and asked once it
        # has started, in Python)
        self.ev_session = None
        duel = False
        if self.ev_kind == P.EV_GROUPS:
            self.ev_session = session_arrays(ctx, pol.evictor)
            self.cfg[T.C_OBSERVE] = 0
            duel = bool(SEK.duels(self.ev_session[0]))
        # an evictor without a compiled twin is asked in Python (lpserve.sim.hooks), one
        # that observes requests outside the kernels is told of them there (a session
        # evictor without a prefix cache), and a preemption decider without a twin is asked
        self.python_evictor = bool(self.cfg[T.C_OBSERVE]) or self.ev_kind == P.EV_EXTERNAL \
            or duel
        self.python_decider = decider == T.DECIDER_PYTHON
        self.python_controller = self.ctl_kind == SK.CTL_PYTHON
        self.python_speculation = int(self.sr_a.ip[SP.Q_KIND]) == SP.SP_PYTHON
        self.hooked = self.python_evictor or self.python_decider or \
            self.python_controller or self.python_speculation or \
            ctx.iteration_log is not None

    def swap_step_of(self, total: int) -> int:
        """Most blocks one planning step of a replica with ``total`` KV blocks can swap:
        each running request out at most once, swapped ones in, and admitted ones out
        again: at most 3 * total blocks without shared prefix blocks (each block has one
        holder), 3 * total per admitted request with them (every holder counts a shared
        block), and never more than the host holds each way. The swap table is grown
        before a step that could need more, so every swap is priced with the cost model's
        own float (a fitted line past the table was off by an ulp)."""
        eng = self.ctx.policy.engine
        holders = eng.max_num_seqs if eng.prefix_caching else 1
        return 3 * min(int(self.ctx.host_blocks), int(total) * holders)

    def swap_tables(self, cost: Any, total: int) -> SwapTables:
        """The :class:`SwapTables` of ``cost``, made on first use with ``3 * total + 2``
        entries (``total``: the KV blocks of a replica priced by ``cost``, so that the
        preemption decider's lookups of one request's blocks stay in the table); one per
        cost model, shared by its replicas and grown in place (:meth:`grow_swap_table`)."""
        tabs = self._tables.get(id(cost))
        if tabs is None:
            eng, bt = self.ctx.policy.engine, self.ctx.block_tokens
            ratio = float(eng.compression_ratio)
            counts = np.arange(3 * int(total) + 2)
            swap = np.asarray(cost.swap_times_s(counts, bt), np.float64)
            if eng.preemption == "compress-swap" or eng.preemption_decider is not None:
                quant = np.asarray(cost.kv_quantize_times_s(counts, bt, ratio), np.float64)
                cswap = swap / ratio + quant
            else:
                quant = cswap = np.zeros(counts.size)
            tabs = self._tables[id(cost)] = SwapTables(swap, cswap, quant, cost)
        return tabs

    def grow_swap_table(self, tabs: SwapTables, need: int) -> None:
        """Extend ``tabs.swap`` to at least ``need`` entries: swaps of several steps without
        an iteration between them are priced together in the next iteration, as the Python
        replica does."""
        n0 = tabs.swap.size
        if need <= n0:
            return
        more = tabs.cost.swap_times_s(np.arange(n0, max(need, 2 * n0)), self.ctx.block_tokens)
        tabs.swap = np.concatenate([tabs.swap, np.asarray(more, np.float64)])

    def replica(self, index: int, role: str, **own: Any) -> "CompiledReplica":
        """A fresh compiled replica ``index`` with ``role``; ``own``: its ``cost``,
        ``params`` and ``total_blocks`` in a heterogeneous cluster."""
        return CompiledReplica(self, index, role, **own)

    def sync_policy_state(self, replicas: list["CompiledReplica"]) -> None:
        """Copy the compiled twins' state back where the policy objects report it (the
        MLFQ demotion counter, the budget controller's statistics per replica)."""
        sched = self.ctx.policy.scheduler
        if self.ctx.spec is not None:
            keys = ("steps", "speculative_steps", "draft_tokens", "accepted_tokens",
                    "emitted_tokens", "sequence_steps")
            for k, v in zip(keys, self.sr_a.counts.tolist()):
                self.ctx.spec.counts[k] = int(v)
        if self.rank_kind == RK.R_MLFQ:
            sched.demotions = int(self.rk_a.g[RK.G_DEMOTIONS])
        if self.rank_kind == RK.R_VTC:
            S, a = self.ctx.state, self.rk_a
            sched.restore_service(V.final_service(
                a.ip, a.pf, S.replica, a.ri[RK.RI_LEVEL], S.prompt, S.gen,
                S.tenant, len(replicas)), shed=np.flatnonzero(a.rf[RK.RF_C1] != 0).tolist())
        if self.ctl_kind not in (SK.CTL_NONE, SK.CTL_PYTHON):  # a twin's state
            for r in replicas:
                if not getattr(r, "vacant", False):  # a replica never built ran nothing
                    self.ctl_obj.restore(r.key, r.r.ctl_st)


def proactive_target(rep: "CompiledReplica") -> int:
    """Free blocks proactive swapping keeps for arrivals (``models/simulator.md`` (30))."""
    v = rep.eng.proactive_free_blocks
    return int(v) if v is not None else max(int(rep.eng.max_num_seqs), rep.wm_blocks)


class CompiledReplica:
    """One replica driven by :mod:`lpserve.sim._replica_kernels` (see the module
    docstring); ``role`` is ``"colocated"``, ``"prefill"`` or ``"decode"``."""

    compiled = True

    def __init__(self, run: CompiledRun, index: int, role: str, *, cost: Any = None,
                 params: np.ndarray | None = None, total_blocks: int | None = None) -> None:
        """Replica ``index`` of ``role``; ``cost``, ``params`` and ``total_blocks`` (its own
        cost model, its float64 parameters and its KV blocks, in a heterogeneous cluster)
        default to the run's."""
        self.runset = run
        ctx = run.ctx
        self.ctx = ctx
        self.S = ctx.state
        self.index = index
        self.role = role
        self.key = (role, index)
        self.eng = ctx.policy.engine
        self.bt = ctx.block_tokens
        self.cost = ctx.cost if cost is None else cost
        total = ctx.total_blocks if total_blocks is None else int(total_blocks)
        self.cfg = run.cfg.copy()
        self.cfg[T.C_ROLE] = _ROLE[role]
        self.cfg[T.C_INDEX] = index
        # what follows the replica's own pool (the run's configuration leaves it out)
        self.cfg[T.C_TOTAL] = total
        self.cfg[T.C_WM] = int(self.eng.watermark * total)
        self.cfg[T.C_SWAP_STEP] = self.swap_step = run.swap_step_of(total)
        self._tabs = run.swap_tables(self.cost, total)
        self.wm_blocks = int(self.cfg[T.C_WM])
        self.cfg[T.C_PRO_TARGET] = proactive_target(self)  # (30): free blocks kept
        self.reserve_blocks = int(self.cfg[T.C_RESERVE])
        pool = P.new_pool_arrays(total, self.eng.prefix_caching, run.ev_kind, run.ev_params,
                                 run.ev_session)
        n = self.S.n
        ist = np.zeros(T.N_IST, np.int64)
        ist[T.I_WHEAD] = ist[T.I_WTAIL] = -1
        ist[T.I_HOST_FREE] = ctx.host_blocks
        n_ev = 4 * (self.eng.max_num_seqs + 1)
        n_rel = total + 2
        ctl_q = np.zeros(run.ctl_a.w.shape[0])
        off, self.offload = O.for_replica(ctx, run.req_a, self.cost)  # CPU KV offload (35)
        self._link_a, link = self._host_link()
        self.r = T.Rep(
            ist=ist, fst=np.zeros(T.N_FST), run=np.zeros(self.eng.max_num_seqs + 2, np.int64),
            pool=P.pool_struct(pool), rel_t=np.zeros(n_rel), rel_i=np.zeros(n_rel, np.int64),
            rel_anon=np.zeros(n_rel, np.int64), rel_off=np.zeros(n_rel, np.int64),
            rel_n=np.zeros(n_rel, np.int64),
            arena=np.zeros(4 * total + 2 * (self.eng.max_num_seqs + 1)
                           * run.req_a.keybuf.shape[0] + 16, np.int64),
            ev_i=np.zeros(n_ev, np.int64), ev_t=np.zeros(n_ev), ev_k=np.zeros(n_ev, np.int64),
            ctl_st=np.zeros(D.N_ST), ctl_lt=np.full(n if run.ctl_kind else 1, np.nan),
            ctl_q=ctl_q, ctl_plan=np.zeros((2, n + 1), np.int64), ctl_x=np.zeros(5),
            hold=np.zeros(run.req_a.keybuf.shape[0] + 1, np.int64), off=off, link=link)
        self.rep = ST.new_rep(*self.r)
        self.pool = pool
        if run.hooked:
            self.cfg[T.C_HOOK] = H.register(self)
        self.bm = _Blocks(self)
        sip = run.sr_a.ip
        n_arms = int(sip[SP.Q_N_ARMS])
        n_ctx = max(int(sip[SP.Q_CLASSES]) * int(sip[SP.Q_BUCKETS]), 1)
        n_cls, n_dr = max(int(sip[SP.Q_CLASSES]), 1), max(int(sip[SP.Q_DRAFTS]), 1)
        # the acceptance draws: the replica's own generator (SpecRunner.replica_rng)
        rng = (ctx.spec.replica_rng() if ctx.spec is not None
               else np.random.default_rng(0))
        self.ss = ST.new_specrep(np.zeros((n_ctx, n_arms), np.int64),
                                 np.zeros((n_ctx, n_arms)), np.zeros((n_cls, n_dr), np.int64),
                                 np.zeros((n_cls, n_dr), np.int64), np.zeros(1, np.int64), rng)
        self.inbound: dict[int, int] = {}
        self.params = ctx.params if params is None else params

    def _host_link(self) -> tuple[LK.Link, Any]:
        """The replica's host link (``models/simulator.md`` (26)): the overlapped copy
        queue with its link order and the (de)quantize seconds of its cost model's swap
        tables; a placeholder for serial swaps."""
        if self.eng.transfers != "overlap":
            return LK.link_struct("fifo", 1)
        return LK.link_struct(self.eng.link_order, self.S.n, self._tabs.quant)

    # ------------------------------------------------------------------ state
    now = property(lambda self: float(self.r.fst[T.F_NOW]),
                   lambda self, v: self.r.fst.__setitem__(T.F_NOW, v))
    link_free_s = property(lambda self: float(self.r.fst[T.F_LINK_FREE]),
                           lambda self, v: self.r.fst.__setitem__(T.F_LINK_FREE, v))
    used_block_s = property(lambda self: float(self.r.fst[T.F_AREA]))
    busy_s = property(lambda self: float(self.r.fst[T.F_BUSY]))
    swap_wait_s = property(lambda self: float(self.r.fst[T.F_SWAP_WAIT]))
    n_iters = property(lambda self: int(self.r.ist[T.I_ITERS]))
    n_decode_iters = property(lambda self: int(self.r.ist[T.I_DITERS]))
    n_swaps = property(lambda self: int(self.r.ist[T.I_NSWAPS]))
    n_compressed_swaps = property(lambda self: int(self.r.ist[T.I_NCOMP]))
    n_recomputes = property(lambda self: int(self.r.ist[T.I_NRECOMP]))
    compressed_tokens = property(lambda self: int(self.r.ist[T.I_COMP_TOK]))
    host_free = property(lambda self: int(self.r.ist[T.I_HOST_FREE]))
    releases = property(lambda self: int(self.r.ist[T.I_NREL]))

    @property
    def running(self) -> list[int]:
        """Running requests in admission order."""
        return self.r.run[:self.r.ist[T.I_NRUN]].tolist()

    @property
    def waiting(self) -> list[int]:
        """Waiting requests in queue order."""
        return T.waiting_ids(self.runset.req, self.rep).tolist()

    n_waiting = property(lambda self: int(self.r.ist[T.I_NWAIT]), doc="Requests waiting.")
    n_running = property(lambda self: int(self.r.ist[T.I_NRUN]), doc="Requests running.")

    @property
    def outstanding(self) -> int:
        """Requests routed here and not finished (waiting, swapping in or running)."""
        return int(self.r.ist[T.I_NRUN] + self.r.ist[T.I_NWAIT] + self.r.ist[T.I_NLOAD])

    loading = property(lambda self: int(self.r.ist[T.I_NLOAD]),
                       doc="Requests swapping in on the host link to join the batch.")

    @property
    def link(self) -> "LinkCounters | None":
        """The overlapped host link's counters (None with serial swaps)."""
        return LinkCounters(self._link_a) if self.cfg[T.C_LINK] else None

    # ------------------------------------------------------------------ running
    def _serve(self, code: int) -> bool:
        """Do what a kernel stopped for (ranks from a Python scheduler, room in the event
        outbox, the release arena or the swap table); False if it stopped for nothing."""
        if code == SK.NEED_RANKS:
            self._rank_in_python()
        elif code == SK.NEED_ROOM:
            self._drain()
            self._grow_arena()
            self.runset.grow_swap_table(self._tabs, int(self.r.ist[T.I_SWAP_BLOCKS])
                                        + self.swap_step + 2)
        else:
            return False
        return True

    def _call(self, t: float, max_steps: int) -> int:
        run = self.runset
        while True:
            code = RX.advance(run.req, self.rep, self.cfg, run.cff, self.params,
                              self._tabs.swap, self._tabs.cswap, run.rk, run.ctl, run.sr, self.ss, t, max_steps)
            if not self._serve(code):
                self._drain()
                return code

    def advance(self, t: float) -> None:
        """Run every iteration that starts before ``min(t, horizon)``."""
        if self.ctx.check is None:
            r = self.r
            ist = r.ist
            # the kernel would return at once: its clock is at or past t, or it holds no
            # request, and no outgoing copy releases its blocks by then
            now = r.fst[T.F_NOW]
            if (now >= t or ist[T.I_NRUN] + ist[T.I_NWAIT] == 0) and \
                    (ist[T.I_NREL] == 0 or r.rel_t[0] > max(t, now)):
                return
            self._call(t, 1 << 62)
            return
        while self._call(t, 1) == SK.STEPPED:  # check the invariants after every step
            self.ctx.check(self)

    def wake_s(self) -> float:
        """The replica's next event of its own (a release, a copy end on its host link, a
        load from its host tier; inf if none): the earliest it can run again after a
        :meth:`step` that found nothing to do."""
        return float(SK.next_event_s(self.rep))

    def step(self, stop: float) -> bool:
        """One planning step before ``stop``: True if the replica stepped, False if it is
        idle until ``stop`` (nothing to plan before it)."""
        code = self._call(stop, 1)
        if code == SK.STEPPED and self.ctx.check is not None:
            self.ctx.check(self)
        return code == SK.STEPPED

    def enqueue(self, i: int, t: float) -> None:
        """Request ``i`` joins this replica at time ``t`` (after everything before ``t``)."""
        self.advance(t)
        code = RX.enqueue(self.runset.req, self.rep, self.cfg, i, t)
        if code == 0 and self.ctx.check is not None:
            self.ctx.check(self)

    def enqueue_all(self, ids: np.ndarray, times_s: np.ndarray) -> None:
        """Requests ``ids`` (int64, shape ``(n,)``) join this replica at ``times_s`` (s,
        non-decreasing, before the horizon): :meth:`enqueue` for each in turn, in one
        kernel call between the stops for Python. Only for a run whose loop reads nothing
        between arrivals (``Simulation._arrivals_in_one_call``)."""
        run, k = self.runset, 0
        while True:
            k, code = RX.enqueue_all(run.req, self.rep, self.cfg, run.cff, self.params,
                                     self._tabs.swap, self._tabs.cswap, run.rk, run.ctl, run.sr,
                                     self.ss, ids, times_s, k)
            if not self._serve(code):
                break
        self._drain()

    def _drain(self) -> None:
        """Hand the kernel's events (completions, KV handoffs) to the event loop."""
        rep = self.r
        n = int(rep.ist[T.I_NEV])
        if not n:
            return
        ev = self.ctx.events
        for k, i, t in zip(rep.ev_k[:n].tolist(), rep.ev_i[:n].tolist(), rep.ev_t[:n].tolist()):
            if k == T.EV_KV_READY:
                ev.kv_ready(t, i)
            else:
                ev.finish(t, i)
        rep.ist[T.I_NEV] = 0

    def _grow_arena(self) -> None:
        T.compact_arena(self.rep)
        r = self.r
        need = r.ist[T.I_ARENA] + (self.eng.max_num_seqs + 1) * self.runset.req_a.keybuf.size
        if need > r.arena.size:
            arena = np.zeros(2 * need, np.int64)
            arena[:r.arena.size] = r.arena
            ST.set_arena(self.rep, arena)
            self.r = r._replace(arena=arena)

    def ranks(self) -> dict[int, float]:
        """This step's ranks of the candidates (waiting, then running), as the kernels
        computed them or the Python scheduler gave them."""
        rk = self.runset.req_a.rk
        return {i: float(rk[i]) for i in self.waiting + self.running}

    def _rank_in_python(self) -> None:
        """The scheduler ranks this step's candidates (it has no compiled twin)."""
        from lpserve.sim.views import scheduler_view

        cand = self.waiting + self.running
        view = scheduler_view(self, cand)
        r = check_ranks(self.ctx.policy.scheduler.rank(view), len(cand),
                        self.ctx.who("scheduler"), view.request)
        self.runset.req_a.rk[np.asarray(cand, np.int64)] = r
        self.r.ist[T.I_RANKED] = 1

    def cached_prefix_tokens(self, i: int) -> int:
        """Prompt tokens of waiting request ``i`` found in this replica's prefix cache."""
        run = self.runset
        nk = T.block_keys(run.req, self.cfg, i)
        return int(P.match(self.r.pool, run.req_a.keybuf, nk, self.r.hold)) * self.bt

    # ------------------------------------------------------------------ memory
    def make_room(self, need: int) -> bool:
        """Ensure ``need`` plain free blocks, evicting cached ones; False if impossible."""
        return bool(T.make_room(self.runset.req, self.rep, self.cfg, int(need)))

    def admit_need(self, i: int) -> int:
        """KV blocks waiting request ``i`` needs to be admitted (its whole context)."""
        return int(T.admit_need(self.runset.req, self.rep, self.cfg, int(i)))

    def depart(self, i: int, end_s: float) -> None:
        """Running request ``i`` leaves; its blocks stay held until ``end_s``."""
        T.r_remove(self.rep, int(i))
        T.push_release(self.runset.req, self.rep, int(i), float(end_s))

    def reserve(self, i: int, n_blocks: int) -> None:
        """Hold ``n_blocks`` blocks for request ``i``, arriving by a KV copy."""
        self.make_room(n_blocks)
        self.bm.take_anon(n_blocks)
        self.inbound[i] = int(n_blocks)

    def land(self, i: int) -> None:
        """Request ``i``'s copy landed: it joins the running batch with its blocks."""
        S = self.S
        S.anon[i] = self.inbound.pop(i)
        S.status[i] = T.ST_RUNNING
        T.r_append(self.rep, int(i))

    @property
    def pending_release_anon(self) -> int:
        """Anonymous blocks that departed requests hold until their release times."""
        return int(self.r.rel_anon[:self.r.ist[T.I_NREL]].sum())

    link_arrays = property(lambda self: self._link_a,
                           doc="The host link's arrays (``_link_kernels.Link``).")


def enqueue_all_cluster(replicas: list[CompiledReplica], ids: np.ndarray, times_s: np.ndarray,
                        history: tuple) -> None:
    """Requests ``ids`` (int64 ``(n,)``, the ``j``-th on replica ``j mod R``: round robin)
    join ``replicas`` at ``times_s`` in one kernel call between the stops for Python, every
    replica advanced to each arrival time so that the History predictor (``history``: its
    ``kernel_spec()`` arrays ``(state, ip, fp)``) sees every completion before it
    (``RX.enqueue_all_cluster``)."""
    n_route = len(replicas)
    reached = min(n_route, ids.size)  # the others are never built (lpserve.sim.vacant)
    if not reached:
        return
    run = replicas[0].runset
    if any(r.cost is not run.ctx.cost for r in replicas[:reached]):
        raise ValueError("internal: enqueue_all_cluster needs replicas of one cost model")
    pairs = ST.new_replica_list(replicas[0].rep, replicas[0].ss)
    for r in replicas[1:reached]:
        ST.push_replica(pairs, r.rep, r.ss)
    cfgs = np.stack([r.cfg for r in replicas[:reached]])
    n = run.req_a.prompt.size  # completions waiting to be shown: at most one per request
    pending = (np.zeros(n), np.zeros(n, np.int64), np.zeros(1, np.int64))
    k = m = 0
    while True:
        k, m, code = RX.enqueue_all_cluster(
            run.req, pairs, cfgs, run.cff, replicas[0].params, replicas[0]._tabs.swap,
            replicas[0]._tabs.cswap,
            run.rk, run.ctl, run.sr, n_route, ids, times_s, k, m, *history, *pending)
        if not replicas[m]._serve(code):
            break
    for r in replicas[:reached]:
        r._drain()


def finalize_reasons(S: State) -> None:
    """Copy the compiled replicas' reason codes into the string reasons."""
    for code, text in T.REASONS.items():
        for i in np.flatnonzero(S.reason_code == code).tolist():
            if not S.reason[i]:
                S.reason[i] = text
