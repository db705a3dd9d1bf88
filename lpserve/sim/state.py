"""Per-request simulation state as arrays (one entry per trace request), what every
replica of one run shares (:class:`RunContext`), and what replicas report back to the
event loop (:class:`Events`)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from lpserve.trace import Trace

# request status codes
PENDING, WAITING, RUNNING, FINISHED, REJECTED, TRANSFER = 0, 1, 2, 3, 4, 5
STATUS_NAMES = ("pending", "waiting", "running", "finished", "rejected", "transfer")
# where a preempted request's KV is on the host link (lpserve.sim._swap_kernels):
# nothing in flight, preempted but resident on the GPU (proactive swapping), swap-out
# queued or copying (GPU blocks still held), swap-in queued or copying
XF_NONE, XF_RESIDENT, XF_OUT, XF_IN = 0, 1, 2, 3


class State:
    """Arrays of shape ``(n,)`` shared by every replica of one run.

    Token counters: ``computed`` (tokens in KV on the current replica), ``gen`` (output
    tokens produced); a request's sequence length is ``prompt + gen`` and it produces a
    token in the iteration that makes ``computed == prompt + gen``. Blocks held on the
    current replica: ``anon`` anonymous blocks plus ``slots[i]`` hashed prefix slots
    (``nslots`` their count). ``host_blocks``: host blocks held by a swapped-out request
    (fewer than its GPU blocks when ``compressed``); ``swap_gpu_blocks``: GPU blocks it
    takes back on swap-in (its whole context). ``xfer``: the request's copy state on the
    host link (``XF_*``); ``link_wait``: seconds it waited on the link while it could
    otherwise run (a serial swap charged to its iteration, a swap-in it waited for, a
    stalled iteration waiting for swap-outs to free blocks).
    """

    def __init__(self, trace: Trace) -> None:
        """Every request of ``trace`` pending, nothing computed or held; the trace's
        columns copied into writable arrays (the compiled replicas write them)."""
        n = len(trace)
        self.n = n
        self.trace = trace
        # effective arrival: the trace's, or for a request with a parent its release
        # (routing) time max(arrival, parent's finish); ``release`` is NaN while a request
        # is unreleased (lpserve.sim.dependencies)
        self.arrival = np.array(trace.arrival_s, np.float64, copy=True)
        self.release = self.arrival.copy()
        if trace.parent is not None:
            self.release[np.asarray(trace.parent) >= 0] = np.nan
        # writable copies: the compiled engine's structures hold mutable arrays
        self.prompt = np.array(trace.prompt_tokens, np.int64, copy=True)
        self.out = np.array(trace.output_tokens, np.int64, copy=True)
        self.computed = np.zeros(n, np.int64)
        # tokens of the context in the draft model's KV (speculative decoding only)
        self.draft_computed = np.zeros(n, np.int64)
        self.gen = np.zeros(n, np.int64)
        self.anon = np.zeros(n, np.int64)
        self.nslots = np.zeros(n, np.int64)
        self.slots: list[list[int]] = [[] for _ in range(n)]
        self.host_blocks = np.zeros(n, np.int64)
        self.swap_gpu_blocks = np.zeros(n, np.int64)
        self.swapped = np.zeros(n, bool)
        self.compressed = np.zeros(n, bool)
        self.kv_remote = np.zeros(n, bool)
        self.xfer = np.zeros(n, np.int8)
        self.link_wait = np.zeros(n, np.float64)
        self.status = np.zeros(n, np.int8)
        self.first_sched = np.full(n, np.nan)
        # with EngineConfig.schedule_ahead: the replica iteration count from which a waiting
        # request may be admitted (0: at once)
        self.ready_iter = np.zeros(n, np.int64)
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.preempt = np.zeros(n, np.int64)
        # live migrations (lpserve.sim.migration): count and last destination (-1: none);
        # ``replica``/``decode_replica`` keep the router's choice
        self.migrations = np.zeros(n, np.int64)
        self.migrated_to = np.full(n, -1, np.int64)
        self.cached_tok = np.zeros(n, np.int64)
        self.seen_tok = np.zeros(n, np.int64)
        self.replica = np.full(n, -1, np.int64)
        self.decode_replica = np.full(n, -1, np.int64)
        self.reason = np.full(n, "", dtype=object)
        self.reason_code = np.zeros(n, np.int8)  # set by compiled replicas
        none = np.full(n, -1, np.int64)
        self.tenant = none.copy() if trace.tenant is None else np.array(trace.tenant, np.int64)
        self.session = none.copy() if trace.session_id is None else \
            np.array(trace.session_id, np.int64)
        # conversation (program, else session) and wait kind, for session-aware evictors
        self.thread = self.session if trace.program_id is None else np.array(
            trace.program_id, np.int64)
        self.wait = none.copy() if trace.wait_kind is None else np.array(trace.wait_kind,
                                                                          np.int64)
        self._trace_keys: dict[int, np.ndarray] = {}
        self._block_keys: dict[int, tuple[int, list]] = {}  # of requests in the system

    # ------------------------------------------------------------------ prefix keys
    def trace_keys(self, i: int) -> np.ndarray:
        """Chained content hashes of request ``i``'s trace prefix blocks (int64)."""
        t = self.trace
        if t.block_flat is None:
            return np.zeros(0, np.int64)
        k = self._trace_keys.get(i)
        if k is None:
            h = 0
            out = []
            for b in t.block_flat[t.block_offsets[i]:t.block_offsets[i + 1]].tolist():
                h = hash((h, b))
                out.append(h)
            k = np.asarray(out, np.int64)
            if len(self._trace_keys) < 200_000:
                self._trace_keys[i] = k
        return k

    def block_keys(self, i: int, block_tokens: int) -> list:
        """Content keys of request ``i``'s full prompt blocks of ``block_tokens`` tokens.

        A block whose tokens all lie in the trace's known prefix blocks is keyed by the
        chained hash of those blocks and its position, so equal prefixes share keys;
        other blocks get keys unique to the request (reusable only by itself, e.g. after
        a recompute preemption).
        """
        memo = self._block_keys.get(i)
        if memo is not None and memo[0] == block_tokens:
            return memo[1]
        n_full = int(self.prompt[i]) // block_tokens
        tk = self.trace_keys(i)
        bt_trace = self.trace.block_tokens
        keys = []
        for j in range(n_full):
            kb = ((j + 1) * block_tokens - 1) // bt_trace if bt_trace else len(tk)
            if kb < len(tk):
                keys.append((int(tk[kb]), j))
            else:
                keys.append((-1 - i, j))
        self._block_keys[i] = (block_tokens, keys)
        return keys

    def forget_keys(self, i: int) -> None:
        """Drop the memoized keys of a request that left the system."""
        self._block_keys.pop(i, None)

    # ------------------------------------------------------------------ phases
    def phases(self, running: list[int]) -> tuple[list[int], list[int]]:
        """``running`` requests in decode phase (one token left to compute) and in prefill
        phase (``models/simulator.md`` (2))."""
        if not running:
            return [], []
        idx = np.asarray(running, np.int64)
        left = self.prompt[idx] + self.gen[idx] - self.computed[idx]
        return idx[left == 1].tolist(), idx[left > 1].tolist()

    def decode_need(self, decodes: list[int], block_tokens: int) -> int:
        """New KV blocks the ``decodes`` need for their next token (rule (10))."""
        if not decodes:
            return 0
        idx = np.asarray(decodes, np.int64)
        held = (self.anon[idx] + self.nslots[idx]) * block_tokens
        return int(np.count_nonzero(self.computed[idx] + 1 > held))

    # ------------------------------------------------------------------ outcomes
    def release_at(self, i: int, t: float) -> None:
        """Request ``i`` (a child) is released, and so effectively arrives, at ``t``."""
        self.release[i] = t
        self.arrival[i] = t

    def reject(self, i: int, reason: str) -> None:
        """Request ``i`` leaves the system unserved, for ``reason``."""
        self.status[i] = REJECTED
        self.reason[i] = reason
        self.forget_keys(i)
        self.finish[i] = np.nan

    def reject_reason(self, i: int, eng: Any, total_blocks: int, wm_blocks: int,
                      reserve_blocks: int, block_tokens: int) -> str:
        """Why request ``i`` can never be served by a replica of ``total_blocks`` KV blocks
        under ``eng`` (an :class:`~lpserve.policy.EngineConfig`); ``""`` if it can
        (``models/simulator.md``, admission on arrival)."""
        p = int(self.prompt[i])
        if eng.max_model_len is not None and p + int(self.out[i]) > eng.max_model_len:
            return "exceeds_max_model_len"
        if reserve_blocks and reserve_blocks > total_blocks:
            return "prompt_exceeds_kv"
        if -(-(p + 1) // block_tokens) > total_blocks - wm_blocks:
            return "prompt_exceeds_kv"
        if not eng.chunked_prefill and p > eng.max_num_batched_tokens and not self.kv_remote[i]:
            return "prompt_exceeds_token_budget"
        return ""


class Events:
    """What replicas report to the event loop: KV handoffs to the decode pool (a heap of
    ``(ready_s, request)``) and, when ``track_finished``, completions ``(finish_s,
    request)`` in the order they happen (the loop releases dependent requests from them);
    when ``track_router``, the same completions again in ``router_finished`` (the loop
    shows them to a router that reads completions), and when ``track_predictor`` in
    ``predictor_finished`` (the loop shows them to an online predictor)."""

    def __init__(self, track_finished: bool = False) -> None:
        """No handoff or completion yet; the loop sets ``track_router`` and
        ``track_predictor`` where a role reads completions."""
        self.kv_heap: list[tuple[float, int]] = []
        self.track_finished = bool(track_finished)
        self.finished: list[tuple[float, int]] = []
        # completions for a router that reads them (RouterView.completions), appended in
        # the order they happen; the event loop keeps a cursor per routing role
        self.track_router = False
        self.router_finished: list[tuple[float, int]] = []
        self.track_predictor = False
        self.predictor_finished: list[tuple[float, int]] = []

    def kv_ready(self, t: float, i: int) -> None:
        """Request ``i``'s KV reaches the decode pool at ``t``."""
        heapq.heappush(self.kv_heap, (t, i))

    def finish(self, t: float, i: int) -> None:
        """Request ``i`` finished at ``t``."""
        if self.track_finished:
            self.finished.append((t, i))
        if self.track_router:
            self.router_finished.append((t, i))
        if self.track_predictor:
            self.predictor_finished.append((t, i))


@dataclass(frozen=True, eq=False)
class RunContext:
    """What every replica of one run shares (built once by the event loop).

    Attributes:
        state: the per-request arrays; policy: the :class:`~lpserve.policy.Policy`;
        cost: the instance's cost model and params its float64 parameters.
        block_tokens, total_blocks, host_blocks: KV block size (tokens) and the GPU and
            host blocks of one replica (after any draft model's memory).
        kv_scale: KV bytes per token over the target model's (> 1 with draft models).
        link_gbps: the cluster's network link (GB/s) for KV transfers.
        horizon_s: no iteration starts at or after it (``inf``: none).
        reference: plan every iteration in Python (the reference mode).
        pred_lo, pred_hi: the predicted output intervals shown to schedulers (or None).
        events: the outbox of completions and KV handoffs.
        check: ``check(replica)`` after every planning step (``check=True``), else None.
        spec: the run's speculative-decoding runner (``lpserve.sim.speculative``) or None.
        slo_ttft_s, slo_tpot_s: the instance's SLO (deadlines of the ``llf``/``rmlq`` link
            orders; ``inf`` when none).
        ranks_in_python: the scheduler is ranked in Python (it has no compiled twin, or
            it is VTC outside its own meter, :func:`lpserve.sim.twins.vtc_in_pauses`): it
            is asked at the start of every planning step that has candidates.
        iteration_log: the reference mode's record of every iteration (a list that
            :func:`lpserve.sim.hooks.log_iteration` appends to), or None.
    """

    state: State
    policy: Any
    cost: Any
    params: np.ndarray
    block_tokens: int
    total_blocks: int
    host_blocks: int
    kv_scale: float
    link_gbps: float
    horizon_s: float
    reference: bool
    pred_lo: np.ndarray | None
    pred_hi: np.ndarray | None
    events: Events
    check: Callable[[Any], None] | None
    spec: Any = None
    slo_ttft_s: float = float("inf")
    slo_tpot_s: float = float("inf")
    ranks_in_python: bool = False
    iteration_log: list | None = None

    def who(self, role: str) -> str:
        """``policy 'name' (role 'its name')``: how errors name the policy's ``role``
        (an attribute of the policy or of its engine)."""
        pol = self.policy
        obj = getattr(pol, role, None)
        if obj is None:
            obj = getattr(pol.engine, role, None)
        return f"policy {pol.name!r} ({role} {getattr(obj, 'name', obj)!r})"
