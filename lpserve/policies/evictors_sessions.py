"""Session-aware KV evictors: fast-replay specifications and simulator adapters
(``models/kv-sessions.md``).

They use what an agentic serving stack knows about a conversation: which thread a request
belongs to (``Trace.program_id``, else ``session_id``) and why its client waits after the
response (``Trace.wait_kind``: a tool call or a user turn). Each learns online from the
waits that have ended: the time until the thread's next request, or no return within
``amax_s``.

===============  ==========================================================================
ttl-pin          Continuum (Li et al., arXiv 2511.02230): pin a conversation's KV for a TTL
                 per wait kind, fitted online by the price of cache space that makes the
                 expected pinned occupancy fit the capacity; unpinned KV goes first (LRU),
                 then pins, latest expiry first
reuse-decay      Wang et al., "KVCache Cache in the Wild" (ATC'25): reuse probability per
                 category that decays exponentially with idle time, fitted online; evict
                 the least likely to be reused within ``horizon_s``
tail-lru         Zhang, Li, Moallemi, Peng, "Tail-Optimized Caching for LLM Inference"
                 (arXiv 2510.15152): first the blocks past the prefix a conversation needs
                 for its next turn's uncached prefill to stay under ``xi_tokens``, LRU
                 among them; then LRU
return-knapsack  value per block-second: (probability of the return x recompute value of a
                 block) / expected time to the return, per wait kind and idle time
===============  ==========================================================================

Every rule evicts a conversation's deepest block first. Without threads (no session or
program ids) nothing is learned and ttl-pin, reuse-decay and return-knapsack give LRU's
hits exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from lpserve.policies import _group_kernels as G

__all__ = ["SESSION_SPECS", "SessionEvictorSpec", "WaitStats", "fit_wait_stats",
           "replay_session_hits"]


@dataclass(frozen=True, eq=False)
class WaitStats:
    """Statistics of ended waits (``_group_kernels.record_wait``): ``H``/``O`` (K, J)
    block-hits and block-seconds per class and TTL of ``TTL_GRID_S``, ``R``/``X`` (K, B)
    returns and waits at risk per age bin of ``AGE_EDGES_S``, ``NE`` (K, 3) ended waits,
    returns and summed return gaps. A session-aware evictor starts from a copy of them
    (learned on other traffic) instead of from nothing."""

    H: np.ndarray
    O: np.ndarray
    R: np.ndarray
    X: np.ndarray
    NE: np.ndarray

    @staticmethod
    def empty() -> "WaitStats":
        """No ended wait yet."""
        K, J, B = G.N_CLASSES, G.TTL_GRID_S.size, G.AGE_EDGES_S.size - 1
        return WaitStats(np.zeros((K, J)), np.zeros((K, J)), np.zeros((K, B)),
                         np.zeros((K, B)), np.zeros((K, 3)))

    def copy(self) -> "WaitStats":
        """A fresh copy (the kernels update statistics in place)."""
        return WaitStats(*(np.array(a, np.float64) for a in
                           (self.H, self.O, self.R, self.X, self.NE)))

    @property
    def n_waits(self) -> np.ndarray:
        """Ended waits per class (K,)."""
        return self.NE[:, 0].copy()


@dataclass(frozen=True)
class SessionEvictorSpec:
    """What the replay kernel (:func:`lpserve.policies._group_kernels.group_replay`) needs
    to run one session-aware evictor.

    Attributes:
        name: registry name; mode: one of ``_group_kernels.MODE_*``.
        amax_s: a wait longer than this (s) counts as no return.
        refit: refresh the fits every this many ended waits.
        horizon_s: reuse window of ``reuse-decay`` (s).
        xi_tokens: uncached-prefill threshold of ``tail-lru`` (tokens).
        target: share of the capacity the ``ttl-pin`` pins may fill on average.
        ttl_s: a fixed TTL for every wait kind (s); < 0 learns it (``ttl-pin``).
        min_n: ended waits of a class before it uses its own statistics.
        alpha: weight of the newest gap in a thread's moving average (``ttl-pin``).
        prior: :class:`WaitStats` to start from (e.g. :func:`fit_wait_stats` on sessions
            held apart from the ones replayed); None starts with nothing learned.
        online: these rules never read the future.
    """

    name: str
    mode: int
    amax_s: float = 3600.0
    refit: int = 32
    horizon_s: float = 60.0
    xi_tokens: float = 8192.0
    alpha: float = 0.5
    ttl_s: float = -1.0
    min_n: int = 20
    prior: WaitStats | None = None
    online: bool = True

    def __post_init__(self) -> None:
        for f in ("amax_s", "horizon_s"):
            v = getattr(self, f)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{self.name} evictor: {f} must be a finite number > 0, "
                                 f"got {v!r}")
        if not (np.isfinite(self.xi_tokens) and self.xi_tokens >= 0):
            raise ValueError(f"{self.name} evictor: xi_tokens must be >= 0, got "
                             f"{self.xi_tokens!r}")
        for f in ("refit", "min_n"):
            if int(getattr(self, f)) < 1:
                raise ValueError(f"{self.name} evictor: {f} must be >= 1")
        if not (0.0 < self.alpha <= 1.0):
            raise ValueError(f"{self.name} evictor: alpha must be in (0, 1], got "
                             f"{self.alpha!r}")
        if self.prior is not None and not isinstance(self.prior, WaitStats):
            raise TypeError(f"{self.name} evictor: prior must be a WaitStats, got "
                            f"{type(self.prior).__name__}")

    def params(self, block_tokens: int) -> np.ndarray:
        """The kernel's float parameters (``_group_kernels.P_*``)."""
        p = np.zeros(G.N_PARAMS)
        p[G.P_AMAX], p[G.P_REFIT], p[G.P_HORIZON] = self.amax_s, self.refit, self.horizon_s
        p[G.P_XI], p[G.P_ALPHA], p[G.P_TTL] = self.xi_tokens, self.alpha, self.ttl_s
        p[G.P_MIN_N], p[G.P_BLOCK] = self.min_n, max(int(block_tokens), 1)
        return p

    def with_(self, **overrides: Any) -> "SessionEvictorSpec":
        """A copy with fields overridden (unknown names are an error)."""
        known = {f.name for f in fields(self)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise TypeError(f"{self.name} evictor: unknown parameter(s) {bad}; known: "
                            f"{sorted(known - {'name', 'mode', 'online'})}")
        return SessionEvictorSpec(**{**self.__dict__, **overrides})


SESSION_SPECS: dict[str, SessionEvictorSpec] = {
    "ttl-pin": SessionEvictorSpec("ttl-pin", G.MODE_TTL),
    "reuse-decay": SessionEvictorSpec("reuse-decay", G.MODE_DECAY),
    "tail-lru": SessionEvictorSpec("tail-lru", G.MODE_TAIL),
    "return-knapsack": SessionEvictorSpec("return-knapsack", G.MODE_INDEX),
}


def request_inputs(acc: Any) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
    """``(thread, n_threads, cls, prompt_tokens, context_tokens)`` per request of prepared
    :class:`~lpserve.opt.cache_flow.BlockAccesses`: dense thread ids (-1 none), classes
    ``wait_kind + 1`` and prompt + output tokens."""
    n = acc.n_requests
    none = np.full(n, -1, np.int64)
    raw = none if acc.thread is None else np.asarray(acc.thread, np.int64)
    thread = none.copy()
    has = raw >= 0
    uniq, dense = np.unique(raw[has], return_inverse=True)
    thread[has] = dense
    wk = none if acc.wait_kind is None else np.asarray(acc.wait_kind, np.int64)
    prompt = (np.diff(acc.offsets) * acc.block_tokens if acc.prompt_tokens is None
              else np.asarray(acc.prompt_tokens, np.int64))
    out = np.zeros(n, np.int64) if acc.output_tokens is None else acc.output_tokens
    return thread, int(uniq.size), (wk + 1).astype(np.int64), prompt, prompt + out


def replay_session_hits(acc: Any, capacity_blocks: int, spec: SessionEvictorSpec, *,
                        reference: bool = False) -> np.ndarray:
    """Prefix hits per request (int64 (n,)) of ``spec`` on prepared
    :class:`~lpserve.opt.cache_flow.BlockAccesses` with ``capacity_blocks`` blocks, by the
    numba kernel (``reference=True``: its plain-Python twin)."""
    st = (spec.prior or WaitStats.empty()).copy()
    thread, n_threads, cls, prompt, context = request_inputs(acc)
    fn = G.group_replay_ref if reference else G.group_replay
    return fn(acc.offsets, acc.key, acc.request, np.asarray(acc.value_s, np.float64),
              acc.arrival_s, thread, n_threads, cls, prompt, context, acc.n_keys,
              int(capacity_blocks), spec.mode, spec.params(acc.block_tokens), G.AGE_EDGES_S,
              G.TTL_GRID_S, st.H, st.O, st.R, st.X, st.NE)


def fit_wait_stats(acc: Any, *, amax_s: float = 3600.0) -> WaitStats:
    """The :class:`WaitStats` of every wait that ends within prepared
    :class:`~lpserve.opt.cache_flow.BlockAccesses` (a return by the thread's next request,
    or no return within ``amax_s``; waits still open at the end are left out), by the same
    bookkeeping the evictors run online."""
    st = WaitStats.empty()
    spec = SessionEvictorSpec("fit", G.MODE_GLRU, amax_s=amax_s)
    thread, n_threads, cls, prompt, context = request_inputs(acc)
    G.group_replay(acc.offsets, acc.key, acc.request, np.asarray(acc.value_s, np.float64),
                   acc.arrival_s, thread, n_threads, cls, prompt, context, acc.n_keys,
                   max(acc.n_keys, 1), G.MODE_GLRU, spec.params(acc.block_tokens),
                   G.AGE_EDGES_S, G.TTL_GRID_S, st.H, st.O, st.R, st.X, st.NE)
    return st
