"""A replica whose whole event loop runs in numba (``_kernels.replica_advance``).

Used in fast mode when the scheduler's rank is a fixed per-request key (it declares
``rank_key``, e.g. FCFS ranks by ``arrival_s``; ``"static"``: the scheduler's own
``keys`` array, as :class:`lpserve.policies.static_order.StaticOrder`), speculation is off, prefix caching is
off, preemption is by recompute (or by swap with no host memory to swap to) with no
per-victim decider, the cluster is colocated and homogeneous, the router reads no
completions and the trace has no ``parent`` dependencies. It has the same interface as
:class:`~lpserve.sim.replica.Replica` and gives the same results as the reference mode,
which plans every iteration in Python.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.sim import _kernels as K
from lpserve.sim.state import WAITING, RunContext, State

__all__ = ["CompiledReplica", "RANK_KEYS", "eligible", "finalize_reasons"]

RANK_KEYS = ("arrival_s", "prompt_tokens", "static")
_BATCHING = {"prefill-first": 0, "decode-first": 1, "mixed": 2, "static": 3}
_REASONS = {K.R_CTX_KV: "context_exceeds_kv", K.R_CTX_BUDGET: "context_exceeds_token_budget"}


def eligible(policy: Any, reference: bool, disaggregated: bool, dependencies: bool,
             host_blocks: int, heterogeneous: bool = False) -> bool:
    """Whether a run of ``policy`` can use compiled replicas (not on a heterogeneous
    cluster, whose replicas have their own cost parameters and KV blocks, nor behind a
    router that reads completions, which compiled replicas do not report)."""
    eng = policy.engine
    return (not reference and not disaggregated and not dependencies and not heterogeneous
            and not getattr(policy.router, "reads_completions", False)
            and eng.speculation is None and eng.budget_controller is None
            and not eng.priority_preemption and policy.rebalancer is None
            and getattr(policy.scheduler, "rank_key", None) in RANK_KEYS
            and policy.scheduler.quantum_s is None and not eng.prefix_caching
            and eng.preemption_decider is None
            and (eng.preemption == "recompute"
                 or (eng.preemption == "swap" and host_blocks == 0)))


class _Pool:
    """Block-pool counters of a compiled replica (the router's view reads these)."""

    def __init__(self, total: int, ist: np.ndarray) -> None:
        """Counters over the kernel's int state ``ist``."""
        self.total = total
        self._ist = ist

    @property
    def used(self) -> int:
        """Blocks in use."""
        return self.total - int(self._ist[K.I_FREE])


class CompiledReplica:
    """Colocated replica driven by :func:`lpserve.sim._kernels.replica_advance`."""

    role = "colocated"
    compiled = True

    def __init__(self, ctx: RunContext, index: int) -> None:
        self.ctx = ctx
        self.S = S = ctx.state
        self.index = index
        eng = ctx.policy.engine
        self.eng = eng
        self.bt = ctx.block_tokens
        total = ctx.total_blocks
        reserve = 0 if eng.reserve_tokens is None else -(-eng.reserve_tokens // self.bt)
        self.wm_blocks = int(eng.watermark * total)
        self.reserve_blocks = reserve
        self.cfg = np.array([_BATCHING[eng.batching], eng.max_num_seqs,
                             eng.max_num_batched_tokens, int(eng.chunked_prefill), reserve,
                             self.wm_blocks, self.bt, total], np.int64)
        self.ist = np.array([total, 0, 0, 0, -1, 0, 0], np.int64)
        self.fst = np.zeros(2)
        self.run = np.zeros(eng.max_num_seqs + 1, np.int64)
        n = S.n
        self.w_id = np.zeros(n, np.int64)
        self.w_key = np.zeros(n)
        self.w_seq = np.zeros(n, np.int64)
        key = ctx.policy.scheduler.rank_key
        if key == "static":  # a fixed per-request key array (StaticOrder.keys), shape (n,)
            ctx.policy.scheduler.check_size(n)
            self.rkey = np.ascontiguousarray(ctx.policy.scheduler.keys, dtype=np.float64)
        else:
            self.rkey = S.arrival if key == "arrival_s" else S.prompt.astype(np.float64)
        self.bm = _Pool(total, self.ist)
        self.releases: list = []
        self.n_swaps = 0

    # interface shared with Replica ------------------------------------------------
    now = property(lambda self: float(self.fst[K.F_NOW]))
    used_block_s = property(lambda self: float(self.fst[K.F_AREA]))
    n_iters = property(lambda self: int(self.ist[K.I_ITERS]))
    n_decode_iters = property(lambda self: int(self.ist[K.I_DITERS]))

    @property
    def running(self) -> list[int]:
        return self.run[:self.ist[K.I_NRUN]].tolist()

    @property
    def waiting(self) -> list[int]:
        return self.w_id[:self.ist[K.I_NWAIT]].tolist()

    @property
    def outstanding(self) -> int:
        return int(self.ist[K.I_NRUN] + self.ist[K.I_NWAIT])

    def advance(self, t: float) -> None:
        """Run every iteration that starts before ``min(t, horizon)``."""
        stop = min(t, self.ctx.horizon_s)
        if self.fst[K.F_NOW] >= stop or (self.ist[K.I_NRUN] == 0 and self.ist[K.I_NWAIT] == 0):
            return
        S = self.S
        K.replica_advance(self.ctx.params, self.cfg, self.ist, self.fst, stop, self.run,
                          self.w_id, self.w_key, self.w_seq, self.rkey, S.prompt, S.out,
                          S.computed, S.gen, S.anon, S.first_sched, S.first_token, S.finish,
                          S.preempt, S.status, S.reason_code, S.seen_tok)
        if self.ctx.check is not None:
            self.ctx.check(self)

    def enqueue(self, i: int, t: float) -> None:
        """Request ``i`` joins this replica at time ``t`` (after everything before ``t``)."""
        self.advance(t)
        S = self.S
        reason = S.reject_reason(i, self.eng, self.bm.total, self.wm_blocks,
                                 self.reserve_blocks, self.bt)
        if reason:
            S.reject(i, reason)
            return
        if self.fst[K.F_NOW] < t:
            self.fst[K.F_NOW] = t
        n = self.ist[K.I_NWAIT]
        self.w_id[n] = i
        self.w_key[n] = self.rkey[i]
        self.w_seq[n] = self.ist[K.I_SEQ]
        self.ist[K.I_SEQ] += 1
        self.ist[K.I_NWAIT] = n + 1
        S.status[i] = WAITING
        S.replica[i] = self.index

    def check(self) -> str:
        """Empty string when the block and queue counters are consistent."""
        S = self.S
        free = int(self.ist[K.I_FREE])
        held = int(S.anon[self.running].sum())
        if free < 0 or free + held != self.bm.total:
            return f"free {free} + held {held} != total {self.bm.total}"
        if self.running and np.any(S.arrival[self.running] > self.now):
            return "a request ran before it arrived"
        return ""


def finalize_reasons(S: State) -> None:
    """Copy the kernels' reason codes into the string reasons."""
    for code, text in _REASONS.items():
        for i in np.flatnonzero(S.reason_code == code).tolist():
            if not S.reason[i]:
                S.reason[i] = text
