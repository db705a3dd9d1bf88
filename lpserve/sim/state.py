"""Per-request simulation state as arrays (one entry per trace request)."""
from __future__ import annotations

import numpy as np

from lpserve.trace import Trace

# request status codes
PENDING, WAITING, RUNNING, FINISHED, REJECTED, TRANSFER = 0, 1, 2, 3, 4, 5
STATUS_NAMES = ("pending", "waiting", "running", "finished", "rejected", "transfer")


class State:
    """Arrays of shape ``(n,)`` shared by every replica of one run.

    Token counters: ``computed`` (tokens in KV on the current replica), ``gen`` (output
    tokens produced); a request's sequence length is ``prompt + gen`` and it produces a
    token in the iteration that makes ``computed == prompt + gen``. Blocks held on the
    current replica: ``anon`` anonymous blocks plus ``slots[i]`` hashed prefix slots
    (``nslots`` their count). ``host_blocks``: host blocks held by a swapped-out request
    (fewer than its GPU blocks when ``compressed``); ``swap_gpu_blocks``: GPU blocks it
    takes back on swap-in (its whole context).
    """

    def __init__(self, trace: Trace) -> None:
        n = len(trace)
        self.n = n
        self.trace = trace
        self.arrival = np.asarray(trace.arrival_s, np.float64)
        # release (routing) time: the arrival, or for a request with a parent
        # max(arrival, parent's finish) and NaN while unreleased; ``arrival`` then holds
        # the effective arrival (see lpserve.sim.dependencies)
        self.release = self.arrival.copy()
        self.prompt = np.asarray(trace.prompt_tokens, np.int64)
        self.out = np.asarray(trace.output_tokens, np.int64)
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
        self.status = np.zeros(n, np.int8)
        self.first_sched = np.full(n, np.nan)
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
        self.tenant = none if trace.tenant is None else np.asarray(trace.tenant, np.int64)
        self.session = none if trace.session_id is None else np.asarray(trace.session_id,
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
