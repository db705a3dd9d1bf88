"""Online KV-cache evictors: fast-replay specifications and simulator adapters.

Each evictor exists twice, with the same rule:

* a :class:`KVEvictorSpec` run by the numba kernels of
  :mod:`lpserve.policies._evict_kernels` in :func:`lpserve.evaluate.cache.cache_replay`;
* an :class:`~lpserve.policy.Evictor` (``evict(view, need_blocks)``) that runs inside the
  simulator's prefix cache, using the fields of :class:`~lpserve.policy.EvictorView`.

``EVICTORS`` maps a name to a factory of the simulator evictor; ``SPECS`` maps the same
names to replay specifications. Rules (``models/kv-knapsack.md`` section 3):

=============  ===========================================================================
lru            vLLM free-block queue: least recently used, a request's deepest block first
radix-lru      SGLang radix cache: LRU among leaves (blocks without a cached child)
lfu            least touched first, then least recent (on leaves)
prefix-lru     LRU; blocks that branched (system prompts, few-shot prefixes: a prefix seen
               followed by two different continuations) get ``credit_s`` of recency credit
gdsf           Greedy-Dual-Size-Frequency: value = L + touches x recompute seconds / size
session        LRU; blocks of a returning multi-turn session get its inter-turn gap as
               credit (they are expected back after about that long)
lookahead      LRU; blocks needed by queued requests (arrived within ``credit_s`` of now)
               are kept
knapsack       knapsack index: recency credit = ``credit_s`` x reuse probability of the
               block's reuse class, learned online (touch counts; partial last blocks)
=============  ===========================================================================

All but ``lfu``/``gdsf``/``radix-lru`` also evict a partial last prompt block first (its
content changes when the conversation continues, so it cannot be reused).

The session-aware evictors ``ttl-pin``, ``reuse-decay``, ``tail-lru`` and
``return-knapsack`` (:mod:`lpserve.policies.evictors_sessions`) are in the same tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from lpserve.policies import _evict_kernels as K
from lpserve.policies import evictors_sessions as ES
from lpserve.policy import Evictor, EvictorView, Meta


@dataclass(frozen=True)
class KVEvictorSpec:
    """What the replay kernel needs to run one evictor.

    Attributes:
        name: registry name.
        mode: one of ``_evict_kernels.MODE_*``.
        leaves_only: evict only blocks without a cached child (radix leaves).
        credit_s: recency credit or lookahead window in seconds (mode-specific).
        partial_penalty_s: seconds of recency taken from a partial last prompt block.
        online: False for rules that read the future (Belady).
    """

    name: str
    mode: int
    leaves_only: bool = False
    credit_s: float = 0.0
    partial_penalty_s: float = 0.0
    online: bool = True

    def params(self) -> np.ndarray:
        """The kernel's float parameters ``[credit_s, partial_penalty_s]``."""
        return np.array([self.credit_s, self.partial_penalty_s], np.float64)


SPECS: dict[str, Any] = {
    "radix-lru": KVEvictorSpec("radix-lru", K.MODE_LRU, leaves_only=True),
    "lfu": KVEvictorSpec("lfu", K.MODE_LFU, leaves_only=True),
    "prefix-lru": KVEvictorSpec("prefix-lru", K.MODE_PREFIX, credit_s=300.0,
                                partial_penalty_s=1e4),
    "gdsf": KVEvictorSpec("gdsf", K.MODE_GDSF, leaves_only=True),
    "session": KVEvictorSpec("session", K.MODE_SESSION, credit_s=600.0, partial_penalty_s=1e4),
    "lookahead": KVEvictorSpec("lookahead", K.MODE_LOOKAHEAD, credit_s=3.0,
                               partial_penalty_s=1e4),
    "knapsack": KVEvictorSpec("knapsack", K.MODE_KNAPSACK, credit_s=1200.0,
                              partial_penalty_s=1e4),
    **ES.SESSION_SPECS,
}
OFFLINE_SPECS: dict[str, KVEvictorSpec] = {
    "belady": KVEvictorSpec("belady", K.MODE_BELADY, online=False),
    "belady-prefix": KVEvictorSpec("belady-prefix", K.MODE_BELADY_DEEP, online=False),
}


def spec(name: str, **overrides: Any) -> Any:
    """The replay specification of ``name`` (``"lru"`` uses its own kernel), with fields
    overridden (e.g. ``credit_s=600``; ``prior=`` for the session-aware ones)."""
    if name == "lru":
        return KVEvictorSpec("lru", K.MODE_LRU)
    table = {**SPECS, **OFFLINE_SPECS}
    if name not in table:
        raise KeyError(f"unknown evictor {name!r}; known: {sorted(['lru', *table])}")
    base = table[name]
    if isinstance(base, ES.SessionEvictorSpec):
        return base.with_(**overrides)
    return KVEvictorSpec(**{**base.__dict__, **overrides})


def replay_hits(acc: Any, capacity_blocks: int, evictor: KVEvictorSpec) -> np.ndarray:
    """Hit flags of every block access of ``acc`` (a prepared
    :class:`lpserve.opt.cache_flow.BlockAccesses`) under ``evictor`` with a cache of
    ``capacity_blocks`` blocks, replayed by the numba kernels (bool ``(n_accesses,)``)."""
    if evictor.name == "lru":
        return K.lru_replay(acc.offsets, acc.key, acc.n_keys, capacity_blocks)
    if isinstance(evictor, ES.SessionEvictorSpec):
        return ES.replay_session_hits(acc, capacity_blocks, evictor)
    ok = np.diff(acc.offsets) > 0
    partial = np.zeros(acc.n_requests, bool)  # last prompt block shorter than a block
    partial[ok] = acc.tokens[acc.offsets[1:][ok] - 1] < acc.block_tokens
    return K.heap_replay(acc.offsets, acc.key, acc.parent, acc.depth, acc.value_s,
                         acc.next_request(), partial, acc.arrival_s, acc.n_keys,
                         capacity_blocks, evictor.mode, evictor.leaves_only, evictor.params())


# ===================================================================================== adapters
def _keys(s: np.ndarray | tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A score as its two sort keys ``(k1, k2)`` (``k2 = 0`` for a single score)."""
    if isinstance(s, tuple):
        return np.asarray(s[0], np.float64), np.asarray(s[1], np.float64)
    k1 = np.asarray(s, np.float64)
    return k1, np.zeros_like(k1)


class ScoreEvictor(Evictor):
    """Simulator evictor: give up the ``need_blocks`` evictable blocks of lowest score.

    ``score(view)`` returns float64 ``(n,)``, or a pair ``(k1, k2)`` compared
    lexicographically; ties go to the deeper block, then to the lower slot. Never mutates
    the view. The simulator's compiled engine keeps the same order incrementally
    (``lpserve/sim/_pool.py``).
    """

    meta = Meta(online=True, engines=("lpserve",))

    def __init__(self, name: str, score: Callable[["ScoreEvictor", EvictorView], np.ndarray],
                 reads_queue: bool = False, **params: Any) -> None:
        self.name = name
        self._score = score
        self.reads_queue = bool(reads_queue)
        self.params = dict(params)

    def kernel_spec(self) -> tuple[str, tuple[float, ...]] | None:
        """``(kind, params)`` of the compiled twin of a built-in score, else None (see
        :meth:`lpserve.policy.LRU.kernel_spec`)."""
        kind = _KERNELS.get((type(self).__name__, getattr(self._score, "__name__", "")))
        if kind is None:
            return None
        p = self.params
        return kind, (float(p.get("credit_s", 0.0)), float(p.get("protect_depth", 0.0)),
                      float(p.get("age_s", 1.0)), float(p.get("depth_scale", 1.0)))

    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        """The first ``need_blocks`` positions into ``view`` (int64) by ascending score
        (a score, or a ``(primary, secondary)`` pair compared in that order), the deeper
        block first among equal scores."""
        k1, k2 = _keys(self._score(self, view))
        order = np.lexsort((-np.asarray(view.depth), k2, k1))
        return order[:int(need_blocks)].astype(np.int64)


def _lru(ev: ScoreEvictor, v: EvictorView) -> np.ndarray:
    return np.asarray(v.last_access_s, np.float64)


def _lfu(ev: ScoreEvictor, v: EvictorView) -> tuple[np.ndarray, np.ndarray]:
    # least touched first, then least recent
    return np.asarray(v.hits, np.float64), np.asarray(v.last_access_s, np.float64)


def _prefix(ev: ScoreEvictor, v: EvictorView) -> np.ndarray:
    # without the chain in the view, shallow shared blocks (depth < protect_depth) that
    # were hit are the fingerprinted system-prompt / few-shot prefixes
    shared = (np.asarray(v.depth) < ev.params.get("protect_depth", 2)) & (np.asarray(v.hits) > 0)
    return np.asarray(v.last_access_s, np.float64) + ev.params.get("credit_s", 300.0) * shared


def _gdsf(ev: ScoreEvictor, v: EvictorView) -> np.ndarray:
    # recompute cost grows with depth (attention); frequency = hits + 1; aged by recency
    depth = np.asarray(v.depth, np.float64)
    value = (1.0 + depth / ev.params.get("depth_scale", 64.0)) * (np.asarray(v.hits) + 1.0)
    return np.asarray(v.last_access_s, np.float64) / ev.params.get("age_s", 60.0) + value


def _knapsack(ev: ScoreEvictor, v: EvictorView) -> np.ndarray:
    # reuse probability of the block's touch class from the view's hit counts
    hits = np.asarray(v.hits)
    cls = np.minimum(hits, 3)
    p = np.empty(cls.size)
    for c in range(4):
        m = cls == c
        above = np.count_nonzero(hits > c)
        at_least = np.count_nonzero(hits >= c)
        p[m] = (above + 1.0) / (at_least + 2.0)
    return np.asarray(v.last_access_s, np.float64) + ev.params.get("credit_s", 1200.0) * p


class LeafEvictor(ScoreEvictor):
    """Simulator evictor that gives up only radix leaves (blocks no cached block extends),
    lowest score first; evicting a leaf can make its parent a leaf, which then competes
    with the rest (SGLang's radix cache). Needs ``view.children`` and ``view.parent``.
    When in-use blocks pin the rest (a candidate whose child is running), the remainder
    comes from the other candidates by score."""

    kernel_spec = ScoreEvictor.kernel_spec

    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        """``need_blocks`` positions into ``view`` (int64): radix leaves with no in-use
        child, lowest score first (deeper first on ties), a parent joining the heap once its
        last evictable child is gone; if that runs out, the remaining candidates by score.
        A ValueError when ``view`` lacks ``children`` or ``parent``."""
        import heapq

        if view.children is None or view.parent is None:
            raise ValueError(f"{self.name}: the evictor view has no children/parent fields")
        k1, k2 = _keys(self._score(self, view))
        depth = np.asarray(view.depth)
        parent = np.asarray(view.parent)
        kids = np.bincount(parent[parent >= 0], minlength=len(view))  # evictable children
        pinned = np.asarray(view.children) - kids  # children in use: never freed here
        heap = [(k1[j], k2[j], -depth[j], j)
                for j in np.flatnonzero((kids == 0) & (pinned == 0))]
        heapq.heapify(heap)
        out: list[int] = []
        while len(out) < need_blocks and heap:
            j = heapq.heappop(heap)[-1]
            out.append(int(j))
            p = parent[j]
            if p >= 0:
                kids[p] -= 1
                if kids[p] == 0 and pinned[p] == 0:
                    heapq.heappush(heap, (k1[p], k2[p], -depth[p], p))
        if len(out) < need_blocks:
            rest = np.setdiff1d(np.arange(len(view)), np.asarray(out, np.int64))
            order = rest[np.lexsort((-depth[rest], k2[rest], k1[rest]))]
            out.extend(order[:need_blocks - len(out)].tolist())
        return np.asarray(out, np.int64)


def _session(ev: ScoreEvictor, v: EvictorView) -> np.ndarray:
    # LRU; a returning session's blocks get its inter-turn gap (capped) as recency credit
    gap = np.zeros(len(v)) if v.turn_gap_s is None else np.asarray(v.turn_gap_s, np.float64)
    return np.asarray(v.last_access_s, np.float64) + np.minimum(gap, ev.params["credit_s"])


def _lookahead(ev: ScoreEvictor, v: EvictorView) -> np.ndarray:
    # LRU; blocks that waiting requests will hit go last
    t = np.asarray(v.last_access_s, np.float64)
    if v.queued is None:
        return t
    return t + np.where(np.asarray(v.queued), 1e12, 0.0)


#: (evictor class, score function) -> kind of its compiled twin (lpserve/sim/_pool.py)
_KERNELS = {("ScoreEvictor", "_lru"): "lru", ("ScoreEvictor", "_prefix"): "prefix-lru",
            ("ScoreEvictor", "_session"): "session", ("ScoreEvictor", "_knapsack"): "knapsack",
            ("ScoreEvictor", "_lookahead"): "lookahead", ("LeafEvictor", "_lru"): "radix-lru",
            ("LeafEvictor", "_lfu"): "lfu", ("LeafEvictor", "_gdsf"): "gdsf"}


def lru() -> Evictor:
    """vLLM-order LRU (simulator adapter)."""
    return ScoreEvictor("kv-lru", _lru)


def lfu() -> Evictor:
    """Least touched radix leaf first, then least recent (as the replay rule)."""
    return LeafEvictor("kv-lfu", _lfu)


def prefix_lru(credit_s: float = 300.0, protect_depth: int = 2) -> Evictor:
    """LRU with ``credit_s`` seconds of recency credit for shallow shared blocks
    (``depth < protect_depth`` with at least one hit: system prompts, few-shot prefixes)."""
    return ScoreEvictor("kv-prefix-lru", _prefix, credit_s=credit_s, protect_depth=protect_depth)


def gdsf(age_s: float = 60.0, depth_scale: float = 64.0) -> Evictor:
    """Greedy-Dual-Size-Frequency on radix leaves (as the replay rule): a block's value
    grows with its depth (recompute cost) and hits. Leaves only, since a deep block is
    worth nothing once a block before it is gone."""
    return LeafEvictor("kv-gdsf", _gdsf, age_s=age_s, depth_scale=depth_scale)


def knapsack(credit_s: float = 1200.0) -> Evictor:
    """LRU plus ``credit_s`` seconds times the block's estimated reuse probability,
    ``(blocks with more hits + 1) / (blocks with at least as many + 2)`` over hit classes
    0, 1, 2 and 3+ of the view (the online score of the knapsack model)."""
    return ScoreEvictor("kv-knapsack", _knapsack, credit_s=credit_s)


def radix_lru() -> Evictor:
    """SGLang radix-cache LRU: least recently used leaf first (simulator adapter)."""
    return LeafEvictor("kv-radix-lru", _lru)


def session(credit_s: float = 600.0) -> Evictor:
    """LRU with a returning session's inter-turn gap (at most ``credit_s``) as credit."""
    return ScoreEvictor("kv-session", _session, credit_s=_nonneg("session", "credit_s", credit_s))


def lookahead() -> Evictor:
    """LRU that keeps the blocks the replica's waiting requests will hit."""
    return ScoreEvictor("kv-lookahead", _lookahead, reads_queue=True)


def _nonneg(name: str, field: str, value: Any) -> float:
    v = float(value)
    if not np.isfinite(v) or v < 0:
        raise ValueError(f"{name} evictor: {field} must be a finite number >= 0, got {value!r}")
    return v


EVICTORS: dict[str, Callable[..., Evictor]] = {
    "kv-lru": lru,
    "kv-radix-lru": radix_lru,
    "kv-session": session,
    "kv-lookahead": lookahead,
    "kv-lfu": lfu,
    "kv-prefix-lru": prefix_lru,
    "kv-gdsf": gdsf,
    "kv-knapsack": knapsack,
    **{f"kv-{k}": (lambda k: lambda **p: ES.SessionEvictor(ES.SESSION_SPECS[k].with_(**p)))(k)
       for k in ES.SESSION_SPECS},
}


def make_evictor(name: str, **params: Any) -> Evictor:
    """A fresh simulator evictor by name: ``"lru"``, ``"knapsack"``, ... (the replay names)
    or the same with a ``"kv-"`` prefix; ``params`` go to its factory."""
    key = name if name.startswith("kv-") else f"kv-{name}"
    if key not in EVICTORS:
        raise KeyError(f"unknown evictor {name!r}; known: "
                       f"{sorted(k[3:] for k in EVICTORS)}")
    return EVICTORS[key](**params)
