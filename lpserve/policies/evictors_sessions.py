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
                 then pins, latest expiry first; a duel against LRU decides, by a
                 sequential test, which of the two the cache follows
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
from itertools import repeat
from typing import Any

import numpy as np

from lpserve.arrays import group_rows
from lpserve.kernels import session_keys as SK
from lpserve.policies import _group_kernels as G
from lpserve.policies import _group_ref as GR
from lpserve.policy import Evictor, EvictorView, Meta, RequestEvent

__all__ = ["SESSION_SPECS", "SessionEvictor", "SessionEvictorSpec", "WaitStats",
           "duel_state", "fit_duel_state", "fit_wait_stats", "replay_session_hits"]


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
        duel_alpha: ``ttl-pin`` runs shadow LRU and ttl-pin caches and the real cache
            follows the leader, which changes when the other shadow's hits since the last
            change exceed the leader's by the time-uniform boundary of level
            ``duel_alpha`` (``models/kv-sessions.md`` (4b)-(4c)); 0: no duel, always pin.
        duel_scale: the boundary's scale ``y = (duel_scale * capacity) ** 2`` (block-hits
            squared; 1: the most a switch can cost in unit-block caching, ``C`` misses).
        duel_start: ``(leader, D, V)`` the duel starts from (leader 1: ttl-pin; ``D``,
            ``V``: the evidence against it), e.g. :func:`fit_duel_state` on other traffic
            at the same capacity; None starts with LRU leading and no evidence.
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
    duel_alpha: float = 0.05
    duel_scale: float = 1.0
    duel_start: tuple[float, float, float] | None = None
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
        if not (0.0 <= self.duel_alpha <= 1.0):
            raise ValueError(f"{self.name} evictor: duel_alpha must be in [0, 1] (0: no duel), "
                             f"got {self.duel_alpha!r}")
        if not (np.isfinite(self.duel_scale) and self.duel_scale > 0):
            raise ValueError(f"{self.name} evictor: duel_scale must be a finite number > 0, "
                             f"got {self.duel_scale!r}")
        if self.duel_start is not None:
            ok = len(self.duel_start) == 3 and all(np.isfinite(v) for v in self.duel_start)
            if not ok or self.duel_start[0] not in (0, 1) or self.duel_start[2] < 0:
                raise ValueError(f"{self.name} evictor: duel_start must be (leader 0 or 1, D, "
                                 f"V >= 0), finite, got {self.duel_start!r}")
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
        p[G.P_DUEL], p[G.P_DSCALE] = self.duel_alpha, self.duel_scale
        if self.duel_start is not None:
            p[G.P_LEAD0], p[G.P_D0], p[G.P_V0] = self.duel_start
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
                        reference: bool = False, diag: np.ndarray | None = None) -> np.ndarray:
    """Prefix hits per request (int64 (n,)) of ``spec`` on prepared
    :class:`~lpserve.opt.cache_flow.BlockAccesses` with ``capacity_blocks`` blocks, by the
    numba kernel (``reference=True``: its plain-Python twin). ``diag``: an int64 array
    ``(n, 4)`` that receives the ttl-pin duel's record per request (shadow hits of LRU and
    ttl-pin, the leader, blocks the new leader holds and the real cache does not at a
    switch; see ``_group_kernels.group_replay``); ``(n, 5)`` adds that count after every
    request (O(keys) per request: for tests)."""
    n = acc.n_requests
    if diag is None:
        diag = np.zeros((0, 4), np.int64)
    elif diag.ndim != 2 or diag.shape[0] != n or diag.shape[1] not in (4, 5) or \
            diag.dtype != np.int64:
        raise ValueError(f"replay_session_hits: diag must be int64 of shape ({n}, 4) or "
                         f"({n}, 5), got {diag.dtype} {diag.shape}")
    st = (spec.prior or WaitStats.empty()).copy()
    thread, n_threads, cls, prompt, context = request_inputs(acc)
    fn = GR.group_replay_ref if reference else G.group_replay
    return fn(acc.offsets, acc.key, acc.request, np.asarray(acc.value_s, np.float64),
              acc.arrival_s, thread, n_threads, cls, prompt, context, acc.n_keys,
              int(capacity_blocks), spec.mode, spec.params(acc.block_tokens), G.AGE_EDGES_S,
              G.TTL_GRID_S, st.H, st.O, st.R, st.X, st.NE, diag)


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
                   G.AGE_EDGES_S, G.TTL_GRID_S, st.H, st.O, st.R, st.X, st.NE,
                   np.zeros((0, 4), np.int64))
    return st


def duel_state(diag: np.ndarray, start: tuple[float, float, float] | None = None
               ) -> tuple[float, float, float]:
    """The ttl-pin duel's state ``(leader, D, V)`` after the requests of ``diag`` (the
    record of :func:`replay_session_hits`, int64 (n, 4)) when it started from ``start``:
    the evidence against the final leader is summed since its last change, eq. (4b)."""
    lead0, d, v = (0.0, 0.0, 0.0) if start is None else map(float, start)
    sw = np.flatnonzero(diag[:, 3] >= 0)
    first = 0
    if sw.size:
        first, d, v = int(sw[-1]) + 1, 0.0, 0.0
    lead = float(diag[-1, 2]) if len(diag) else lead0
    x = (diag[first:, 1] - diag[first:, 0]).astype(np.float64)
    if lead:
        x = -x
    return lead, d + float(x.sum()), v + float(np.sum(x * x))


def fit_duel_state(acc: Any, capacity_blocks: int, spec: SessionEvictorSpec
                   ) -> tuple[float, float, float]:
    """The ``duel_start`` that continues the ttl-pin duel of ``spec`` run on prepared
    :class:`~lpserve.opt.cache_flow.BlockAccesses` ``acc`` (other traffic, e.g. the fit
    stream) at ``capacity_blocks``: its final leader and the evidence against it."""
    if spec.mode != G.MODE_TTL or spec.duel_alpha <= 0:
        raise ValueError(f"fit_duel_state: {spec.name} runs no duel (mode {spec.mode}, "
                         f"duel_alpha {spec.duel_alpha})")
    diag = np.zeros((acc.n_requests, 4), np.int64)
    replay_session_hits(acc, capacity_blocks, spec, diag=diag)
    return duel_state(diag, spec.duel_start)


# ===================================================================================== adapter
class SessionEvictor(Evictor):
    """The simulator's form of a session-aware evictor (the replay rule of ``spec``).

    It observes every request's arrival and finish (``observes_requests``): a finish starts
    its thread's wait (class ``wait_kind + 1``, the conversation's prompt blocks), the
    thread's next arrival ends it (a return after the gap), ``amax_s`` without one ends it
    as no return. Ages and gaps count from the finish (when the blocks were released),
    where the replay, without service times, counts from the arrival. At an eviction the
    evictable blocks form groups (same thread and release time), keyed as
    :func:`lpserve.policies._group_kernels.group_key` does; a group's deepest block goes
    first. Recompute values of ``return-knapsack`` come from the cluster's cost model
    (``models/kv-caching-flow.md`` (10)). The ttl-pin duel runs its two shadow caches per
    replica (capacity: the replica's KV blocks), each finished request touching its prompt
    blocks there, and changes the leader by the test (4b); while LRU's shadow leads, no
    block is pinned, and the evictable blocks the leading shadow has seen and dropped go
    first (the follower (4c) as far as a prefix cache that also holds the blocks of
    requests in flight allows; ``reads_keys`` gives the view's block keys).

    What it learns lives in arrays that :meth:`observe` updates with
    :func:`lpserve.kernels.session_keys.learn`. On the compiled replicas every mode runs
    in the kernels (:meth:`kernel_spec`, :meth:`kernel_arrays`): they call the same
    ``learn`` at each arrival and finish, and ``lpserve.sim._session_evict`` takes the
    blocks :meth:`evict` would; ttl-pin's duel, whose shadows only this object keeps, is
    told of each finish of a thread (:meth:`observe`) and asked at each eviction once it
    has started.
    """

    meta = Meta(online=True, engines=("lpserve",))
    observes_requests = True
    reads_tree = False  # never reads EvictorView.parent

    def __init__(self, spec: SessionEvictorSpec) -> None:
        self.spec = spec
        self.name = f"kv-{spec.name}"
        self.reads_keys = spec.mode == G.MODE_TTL and spec.duel_alpha > 0
        self.reset(None, None)

    def reset(self, cluster: Any, rng: Any) -> None:
        """Forget everything learned in a previous run (keep the ``prior``)."""
        st = (self.spec.prior or WaitStats.empty()).copy()
        # what is learned, in the arrays of lpserve.kernels.session_keys.learn (shared
        # with the compiled pools of a run once bound, :meth:`kernel_arrays`)
        self._HO, self._RX = np.stack([st.H, st.O]), np.stack([st.R, st.X])
        self._st = WaitStats(self._HO[0], self._HO[1], self._RX[0], self._RX[1], st.NE)
        self._sv_f = self._new_sv_f(1)
        self._pm = np.zeros((2,) + st.R.shape)
        self._rows: dict[int, int] = {}  # thread id -> row of _th
        self._th = self._new_rows(16)
        self._hf, self._hi = np.zeros((2, 64)), np.zeros((2, 64), np.int64)
        self._times: np.ndarray | None = None  # prefill seconds of k blocks from scratch
        self._cost = None
        self._shadows: dict[int, dict] = {}
        self._pinning: dict[int, bool] = {}
        if cluster is not None and self.spec.mode == G.MODE_INDEX:
            from lpserve.cost import cost_model_for

            self._cost = cost_model_for(cluster)

    def _new_sv_f(self, block_tokens: int) -> np.ndarray:
        sv_f = np.zeros(SK.SV_LEN)
        sv_f[SK.SV_MODE] = self.spec.mode
        sv_f[SK.SV_PAR:SK.SV_PAR + G.N_PARAMS] = self.spec.params(block_tokens)
        return sv_f

    @staticmethod
    def _new_rows(n: int) -> np.ndarray:
        th = np.full((n, SK.TH_LEN), np.nan)
        th[:, SK.TH_TG:SK.TH_TG + G.N_CLASSES] = 0.0
        return th

    def _row(self, th: int) -> int:
        """Row of thread ``th`` in the learned arrays (made, growing them, when new)."""
        r = self._rows.get(th)
        if r is None:
            r = self._rows[th] = len(self._rows)
            if r == self._th.shape[0]:
                self._th = np.concatenate([self._th, self._new_rows(r)])
        return r

    def kernel_spec(self) -> tuple[str, tuple[float, ...]]:
        """The compiled pool's kind for this evictor, ``session-groups``: the kernels learn
        as :meth:`observe` does and evict as :meth:`evict` does
        (:mod:`lpserve.sim._session_evict`). ttl-pin's duel keeps its shadow caches in this
        object: the kernels tell it of each finish of a thread (:meth:`observe` steps the
        shadows) and, once its duel has started, ask it at each eviction."""
        return "session-groups", (0.0, 0.0, 1.0, 1.0)

    def kernel_arrays(self, thread_ids: np.ndarray, max_depth: int,
                      block_tokens: int) -> tuple[np.ndarray, ...]:
        """The arrays the compiled pools of a run learn in and read (after :meth:`reset`;
        layouts in :mod:`lpserve.kernels.session_keys`): ``(sv_f, NE, (pi, mu), thread
        rows, their sorted thread ids, recompute value by depth, (H, O), (R, X), timeout
        heap floats, ints)``. ``thread_ids``: the thread of every request of the run
        (int64); ``max_depth``: the deepest block depth; ``block_tokens``: tokens per
        block. The evictor's own state is these arrays from then on."""
        tid = np.unique(np.asarray(thread_ids, np.int64))
        self._sv_f = self._new_sv_f(int(block_tokens))
        self._rows = {int(t): k for k, t in enumerate(tid.tolist())}
        self._th = self._new_rows(max(tid.size, 1))
        cap = int(np.asarray(thread_ids).size) + 1  # one timeout per finish at most
        self._hf, self._hi = np.zeros((2, cap)), np.zeros((2, cap), np.int64)
        self._ensure_fit()
        val = self._values(np.arange(int(max_depth) + 1), int(block_tokens))
        return (self._sv_f, self._st.NE, self._pm, self._th, tid,
                np.ascontiguousarray(val, np.float64), self._HO, self._RX, self._hf,
                self._hi)

    def _ensure_fit(self) -> None:
        """The first fit, on first use (constructing the evictor compiles nothing); no
        wait can end before a finish, so it is the prior's whenever it is made."""
        if not self._sv_f[SK.SV_FITTED]:
            SK.refit(self._sv_f, self._HO, self._RX, self._st.NE, self._pm)

    def _fitted(self) -> tuple:
        """(TTL per wait class (s), return probabilities, mean return gaps): the latest
        fit of the waits seen so far."""
        self._ensure_fit()
        return self._sv_f[SK.SV_TAU:SK.SV_PAR], self._pm[0], self._pm[1]

    def observe(self, event: RequestEvent) -> None:
        """Learn from a request's arrival (a return) or finish (a wait begins):
        :func:`lpserve.kernels.session_keys.learn`, then ttl-pin's duel."""
        th, fin = int(event.thread), event.kind == "finish"
        r = self._row(th) if th >= 0 else 0
        if int(self._sv_f[SK.SV_HEAP]) + 1 >= self._hf.shape[1]:
            self._hf = np.concatenate([self._hf, np.zeros_like(self._hf)], axis=1)
            self._hi = np.concatenate([self._hi, np.zeros_like(self._hi)], axis=1)
        if fin:
            self._ensure_fit()
        due = SK.learn(self._sv_f, self._HO, self._RX, self._st.NE, self._pm, self._th,
                       self._hf, self._hi, fin, float(event.now_s), th, r,
                       int(event.wait_kind), int(event.prompt_tokens),
                       int(event.context_tokens), int(event.block_tokens))
        if fin and th >= 0 and self.reads_keys:
            self._duel(event, int(event.wait_kind) + 1, int(self._th[r, SK.TH_NEED]))
        if due:
            SK.refit(self._sv_f, self._HO, self._RX, self._st.NE, self._pm)

    def _duel(self, ev: RequestEvent, c: int, need: int) -> None:
        """Step the replica's shadow LRU and ttl-pin caches with a finished request and
        update whether the replica pins (``_group_kernels.group_replay``'s duel)."""
        self._sv_f[SK.SV_ASK] = 1.0  # compiled pools ask this object from now on
        sh = self._shadows.get(ev.replica)
        if sh is None:
            sh = self._shadows[ev.replica] = {
                "lru": GR.RefCache(0, 0), "ttl": GR.RefCache(0, 0), "offsets": [0], "key": [],
                "request": [], "arrival": [], "cls": [], "ids": {},
                "evidence": [0.0, 0.0] if self.spec.duel_start is None
                else [float(v) for v in self.spec.duel_start[1:]]}
            if self.spec.duel_start is not None:
                self._pinning[ev.replica] = bool(self.spec.duel_start[0])
        now, r, ids = float(ev.now_s), len(sh["arrival"]), sh["ids"]
        keys = [ids.setdefault(k, len(ids)) for k in ev.block_keys]
        sh["offsets"].append(sh["offsets"][-1] + len(keys))
        sh["key"].extend(keys)
        sh["request"].extend([r] * len(keys))
        sh["arrival"].append(now)
        sh["cls"].append(c)
        th = int(ev.thread)
        ret = now + self._predicted(th, c)
        params = self.spec.params(int(ev.block_tokens))
        args = (sh["offsets"], sh["key"], sh["request"], sh["arrival"], sh["cls"],
                max(int(ev.total_blocks), 1))
        tau, pi, mu = self._fitted()
        hits = []
        for name, mode, exp in (("lru", G.MODE_GLRU, now), ("ttl", G.MODE_TTL, now + tau[c])):
            sh[name].grow(r + 1, len(ids))
            hits.append(sh[name].step(mode, r, now, *args, exp, need, ret, self._st.NE,
                                      pi, mu, G.AGE_EDGES_S, params))
        on = self._pinning.get(ev.replica, False)
        x = float(hits[0] - hits[1] if on else hits[1] - hits[0])
        e = sh["evidence"]
        e[0] += x
        e[1] += x * x
        y = (self.spec.duel_scale * max(int(ev.total_blocks), 1)) ** 2
        if e[0] > G.duel_bound(e[1], y, self.spec.duel_alpha):  # (4b): the other one leads
            self._pinning[ev.replica] = not on
            e[0] = e[1] = 0.0

    def _predicted(self, th: int, c: int) -> float:
        """Predicted gap (s) of thread ``th`` after a wait of class ``c``
        (``_group_kernels.predicted_gap``)."""
        r = self._rows.get(th, -1) if th >= 0 else -1
        return float(G.predicted_gap(self._st.NE,
                                     self._th[:, SK.TH_TG:SK.TH_TG + G.N_CLASSES], r, c))

    def _values(self, depth: np.ndarray, bt: int) -> np.ndarray:
        """Recompute seconds of blocks at ``depth`` (cost model), 1 each without one."""
        if self._cost is None or bt <= 0:
            return np.ones(depth.size)
        top = int(depth.max(initial=0)) + 2
        if self._times is None or self._times.size < top:
            k = np.arange(max(top, 2 * (0 if self._times is None else self._times.size)))
            self._times = self._cost.batch_times_s(
                [{"prefill_tokens": [int(max(x * bt, 1))], "prefill_cached": [0]}
                 for x in k.tolist()])
        return np.maximum(self._times[depth + 1] - self._times[depth], 0.0)

    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        """``need_blocks`` positions of ``view``: groups in key order, deepest first."""
        n, sp, st = len(view), self.spec, self._st
        now = float(view.now_s)
        t = np.asarray(view.last_access_s, np.float64)
        depth = np.asarray(view.depth, np.int64)
        th = np.full(n, -1, np.int64) if view.thread is None else np.asarray(view.thread)
        cls = (np.zeros(n, np.int64) if view.wait_kind is None
               else np.asarray(view.wait_kind, np.int64) + 1)
        val = self._values(depth, int(view.block_tokens))
        first, gid = group_rows(th, t.view(np.int64), cls)
        gneed = np.zeros(first.size, np.int64)
        gval = np.bincount(gid, weights=val) / np.bincount(gid)
        params = sp.params(int(view.block_tokens))
        pins = not (sp.mode == G.MODE_TTL and sp.duel_alpha > 0) or \
            self._pinning.get(view.replica, False)
        c_g, t_g = cls[first], t[first]
        tau, pi, mu = self._fitted()
        expiry = t_g + tau[c_g]  # a group no thread's latest finish explains
        ret = t_g + np.array([self._predicted(-1, c) for c in range(G.N_CLASSES)])[c_g]
        rows, last = self._rows, self._th
        for k, (thj, tg_) in enumerate(zip(th[first].tolist(), t_g.tolist())):
            rj = rows.get(thj)  # the thread's latest finish released this group
            if rj is not None and last[rj, SK.TH_FINISH] == tg_:
                expiry[k], ret[k] = last[rj, SK.TH_EXPIRY], last[rj, SK.TH_RETURN]
                gneed[k] = int(last[rj, SK.TH_NEED])
        if not pins:
            expiry = t_g
        prim, sec = G.group_keys(sp.mode, c_g, t_g, now, expiry,
                                 ret if sp.mode == G.MODE_TTL else gval, st.NE, pi, mu,
                                 G.AGE_EDGES_S, params)
        # order of the groups by their keys (stable: ties in group order); tail-lru keeps
        # the blocks of the prefix the thread's next turn needs for last
        if sp.mode == G.MODE_TAIL:
            needed, grank = depth < gneed[gid], _ranks(np.argsort(sec, kind="stable"))
        else:
            needed, grank = np.zeros(n, bool), _ranks(np.lexsort((sec, prim)))
        kept = np.ones(n, bool)  # (4c): blocks the leading shadow dropped go first
        sh = self._shadows.get(view.replica) if view.key is not None else None
        if self.reads_keys and sh is not None:
            lead, ids = sh["ttl" if pins else "lru"], sh["ids"]
            i = np.fromiter(map(ids.get, view.key, repeat(-1)), np.int64, count=n)
            seen = np.flatnonzero((i >= 0) & (i < len(lead.inc)))
            if seen.size:
                kept[seen] = np.fromiter(map(lead.inc.__getitem__, i[seen].tolist()), bool,
                                         count=seen.size)
        return _smallest(int(need_blocks), kept, needed, grank[gid], depth)


def _ranks(order: np.ndarray) -> np.ndarray:
    """Each position's rank in ``order`` (int64, shape of ``order``)."""
    r = np.empty(order.size, np.int64)
    r[order] = np.arange(order.size)
    return r


def _smallest(k: int, kept: np.ndarray, needed: np.ndarray, grank: np.ndarray,
              depth: np.ndarray) -> np.ndarray:
    """The first ``k`` rows of the stable order by (``kept``, ``needed``, ``grank``, deepest
    first), False before True: ``np.lexsort((-depth, grank, needed, kept))[:k]``, in O(n)
    by one packed int64 key (row index in the lowest bits, so ties fall as in the stable
    sort) when the fields fit in its bits, else by that lexsort. ``kept``/``needed`` bool,
    ``grank``/``depth`` int64, all shape (n,). Returns int64 (min(k, n),)."""
    n = depth.size
    dmax = int(depth.max(initial=0))
    if n == 0 or n >= 1 << 24 or dmax >= 1 << 16 or int(grank.max(initial=0)) >= 1 << 16:
        return np.lexsort((-depth, grank, needed, kept))[:k].astype(np.int64)
    key = ((kept.astype(np.int64) << 57) | (needed.astype(np.int64) << 56) | (grank << 40)
           | ((dmax - depth) << 24) | np.arange(n, dtype=np.int64))
    k = min(k, n)
    if k < n:
        key = key[np.argpartition(key, k - 1)[:k]]
    return np.sort(key) & ((1 << 24) - 1)
