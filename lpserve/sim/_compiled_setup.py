"""What a compiled run is built from (:class:`lpserve.sim.compiled.CompiledRun`): the
per-request arrays (``T.Req``) over the run's state, the int64 engine configuration
(layout ``T.C_*``), the speculative-decoding run (``SP.SpecRun``) and the P/D transfer
coefficients, each from the run context."""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.sim import _spec_kernels as SP
from lpserve.sim import _state_kernels as T
from lpserve.sim.state import RunContext, State
from lpserve.sim.twins import twin_spec

__all__ = ["engine_config", "request_arrays", "session_arrays", "spec_run",
           "transfer_coefficients"]

_BATCH = {"prefill-first": T.BATCH_PREFILL, "decode-first": T.BATCH_DECODE,
          "mixed": T.BATCH_MIXED, "static": T.BATCH_STATIC}
_PREEMPT = {"recompute": T.PRE_RECOMPUTE, "swap": T.PRE_SWAP, "compress-swap": T.PRE_COMPRESS}

def request_arrays(ctx: RunContext, max_total_blocks: int) -> tuple[Any, int]:
    """The compiled engine's per-request arrays (``T.Req``) over the run's state, and the
    number of agentic programs in the trace (requests of no program get one each);
    ``max_total_blocks``: the largest replica's KV blocks."""
    S: State = ctx.state
    n, bt = S.n, ctx.block_tokens
    tr = S.trace
    # full prompt blocks a request may hold: none beyond the largest replica's pool (a
    # longer prompt is rejected as prompt_exceeds_kv before it holds any), so the slot
    # buffers stay bounded by what the run can hold, not by the longest prompt of the trace
    n_full = np.minimum(S.prompt // bt, max_total_blocks)
    slot_off = np.zeros(n + 1, np.int64)
    np.cumsum(n_full, out=slot_off[1:])
    if tr.block_flat is not None:
        chain = T.trace_chain(np.asarray(tr.block_flat, np.int64),
                              np.asarray(tr.block_offsets, np.int64))
        chain_off = np.asarray(tr.block_offsets, np.int64)
    else:
        chain, chain_off = np.zeros(0, np.int64), np.zeros(n + 1, np.int64)
    pid = np.full(n, -1, np.int64) if tr.program_id is None else \
        np.asarray(tr.program_id, np.int64)
    known = np.unique(pid[pid >= 0])
    prog = np.where(pid >= 0, np.searchsorted(known, pid), known.size + np.arange(n))
    has_pred = ctx.pred_lo is not None
    plo = _mutable(ctx.pred_lo if has_pred else np.ones(n, np.int64))
    phi = _mutable(ctx.pred_hi if has_pred else np.ones(n, np.int64))
    req = T.Req(
        prompt=S.prompt, out=S.out, arrival=S.arrival, computed=S.computed,
        dcomp=S.draft_computed, gen=S.gen, anon=S.anon, nslots=S.nslots,
        host_blocks=S.host_blocks, swap_gpu=S.swap_gpu_blocks, swapped=S.swapped,
        compressed=S.compressed, kv_remote=S.kv_remote, status=S.status,
        first_sched=S.first_sched, first_token=S.first_token, finish=S.finish,
        preempt=S.preempt, cached_tok=S.cached_tok, seen_tok=S.seen_tok,
        replica=S.replica, decode_replica=S.decode_replica, reason=S.reason_code,
        tenant=S.tenant, plo=plo, phi=phi, prog=prog.astype(np.int64),
        wnext=np.full(n, -1, np.int64), wprev=np.full(n, -1, np.int64),
        slot_off=slot_off, slot_buf=np.zeros(max(int(slot_off[-1]), 1), np.int64),
        turn_gap=np.full(n, np.nan), rk=np.zeros(n), chain=chain, chain_off=chain_off,
        keybuf=np.zeros(max(int(n_full.max(initial=0)), 1), np.int64),
        ready=S.ready_iter, link_wait=S.link_wait, thread=_mutable(S.thread),
        wait=_mutable(S.wait), xfer=S.xfer)
    return req, int(known.size)


def engine_config(ctx: RunContext, kind: int, decider: int, ctl_kind: int,
                  track_finished: bool) -> np.ndarray:
    """The int64 engine configuration (layout ``T.C_*``) of the run's replicas; each
    replica's copy then takes its role, index and what follows its own KV pool
    (``C_TOTAL``, ``C_WM``, ``C_SWAP_STEP``: :class:`lpserve.sim.compiled.CompiledReplica`)."""
    eng, tr = ctx.policy.engine, ctx.state.trace
    bt = ctx.block_tokens
    has_pred = ctx.pred_lo is not None
    cfg = np.zeros(T.N_CFG, np.int64)
    cfg[T.C_BATCH] = _BATCH[eng.batching]
    cfg[T.C_MAX_SEQS] = eng.max_num_seqs
    cfg[T.C_BUDGET] = eng.max_num_batched_tokens
    cfg[T.C_CHUNKED] = int(eng.chunked_prefill)
    cfg[T.C_RESERVE] = 0 if eng.reserve_tokens is None else -(-eng.reserve_tokens // bt)
    cfg[T.C_BT] = bt
    cfg[T.C_CACHING] = int(eng.prefix_caching)
    cfg[T.C_PREEMPT] = _PREEMPT[eng.preemption]
    cfg[T.C_PRIO] = int(eng.priority_preemption)
    cfg[T.C_EVICT_BATCH] = eng.evict_batch_blocks
    cfg[T.C_REFERENCE] = int(ctx.reference)
    cfg[T.C_LOG] = int(ctx.iteration_log is not None)
    cfg[T.C_TRACK_FIN] = int(track_finished)
    cfg[T.C_RANK_KIND] = kind
    cfg[T.C_DECIDER] = decider  # T.DECIDER_*
    cfg[T.C_CTL] = ctl_kind
    cfg[T.C_TRACE_BT] = int(tr.block_tokens) if tr.block_flat is not None else 0
    cfg[T.C_MAX_LEN] = 0 if eng.max_model_len is None else eng.max_model_len
    cfg[T.C_HAS_PRED] = int(has_pred)
    cfg[T.C_SPEC] = int(ctx.spec is not None)
    cfg[T.C_AHEAD] = int(eng.schedule_ahead)
    cfg[T.C_LINK] = int(eng.transfers == "overlap")
    cfg[T.C_PROACTIVE] = int(eng.proactive_swap)  # its target follows each replica's pool
    cfg[T.C_HOST_BLOCKS] = int(ctx.host_blocks)
    ev = ctx.policy.evictor
    cfg[T.C_OBSERVE] = int(bool(getattr(ev, "observes_requests", False)))
    cfg[T.C_EV_QUEUE] = int(bool(getattr(ev, "reads_queue", False)))
    cfg[T.C_EV_TREE] = int(bool(getattr(ev, "reads_tree", True)))
    return cfg


def _mutable(a: Any) -> np.ndarray:
    """``a`` as a writable int64 array (the trace's read-only columns are copied)."""
    arr = np.asarray(a, np.int64)
    return arr if arr.flags.writeable and arr.flags.c_contiguous else arr.copy()


def spec_run(ctx: RunContext, n: int) -> SP.SpecRun:
    """The speculation arrays of a run (off: placeholders)."""
    runner = ctx.spec
    if runner is None:
        ip = np.zeros(SP.N_Q + 3, np.int64)  # one arm: plain decoding
        ip[SP.Q_N_ARMS], ip[SP.N_Q + 1:] = 1, -1
        return SP.SpecRun(ip=ip, tparams=np.zeros(1), dparams=np.zeros((1, 1)),
                          rates=np.zeros((1, 1)), edges=np.ones(1, np.int64),
                          counts=np.zeros(6, np.int64), eterm=np.zeros((1, 1, 1)))
    dec = runner.decider
    spec = twin_spec(dec)  # None: a decider written in Python, asked in pauses
    kind, params = ("python", (0, 0)) if spec is None else spec
    # its arms as it numbers them (a twin's are the base class's grid)
    table = SP.arm_table(dec.arms, dec.arm_index, len(dec.drafts))
    ip = np.concatenate([np.zeros(SP.N_Q, np.int64), table])
    ip[SP.Q_KIND] = SP.SP_PYTHON if spec is None else SP.SPEC_KINDS[kind]
    ip[SP.Q_N_ARMS] = len(dec.arms)
    ip[SP.Q_MAX_K] = max(int(a.k) for a in dec.arms)
    ip[SP.Q_DRAFTS] = len(dec.drafts)
    ip[SP.Q_FIXED_K], ip[SP.Q_FIXED_D] = params
    ip[SP.Q_EAGER] = int(runner.eager)
    ip[SP.Q_CLASSES] = int(ctx.state.tenant.max(initial=-1)) + 2
    ip[SP.Q_BUCKETS] = len(dec.bucket_edges) + 1
    rates = np.ascontiguousarray(runner.rates, np.float64)
    # the oracle's expected tokens per request, draft and k, made once (eq. (11))
    eterm = (SP.expected_terms(rates, int(dec.max_k)) if kind == "oracle"
             else np.zeros((1, 1, 1)))
    return SP.SpecRun(ip=ip, tparams=np.array(runner.target_params, np.float64),
                      dparams=np.stack(runner.draft_params), rates=rates,
                      edges=np.asarray(dec.bucket_edges, np.int64),
                      counts=np.zeros(6, np.int64), eterm=eterm)


def session_arrays(ctx: RunContext, evictor: Any) -> tuple[np.ndarray, ...]:
    """The arrays a session-aware evictor shares with the run's pools (its
    ``kernel_arrays``): the run's threads, and block depths up to the longest request's."""
    S = ctx.state
    thread = np.asarray(S.thread, np.int64)
    longest = int((np.asarray(S.prompt) + np.asarray(S.out)).max(initial=0))
    return evictor.kernel_arrays(thread[thread >= 0], longest // ctx.block_tokens + 2,
                                 ctx.block_tokens)


def transfer_coefficients(cost: Any, link_gbps: float) -> tuple[float, float]:
    """``(a, d)`` with ``cost.transfer_time_s(n, link) == n * a / d`` exactly."""
    sizes = getattr(cost, "sizes", cost)
    if cost.transfer_time_s(1, link_gbps) == 0.0:
        return 0.0, 1.0
    bw = sizes.default_link_gbps() if link_gbps is None else float(link_gbps)
    return float(sizes.kv_bytes_per_token), bw * 1e9
