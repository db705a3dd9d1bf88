"""The policy contract (layer 3): three narrow roles, arrays in and arrays out.

* :class:`Router` — ``route(view) -> int64 (n_arriving,)`` replica index per arriving request.
* :class:`Scheduler` — ``rank(view) -> float64 (n_candidates,)``; lower runs first,
  ``+inf`` holds a candidate back.
* :class:`Evictor` — ``evict(view, need_blocks) -> int64 (need_blocks,)`` distinct positions
  (into the view's candidate arrays) of the cached blocks to give up.
* :class:`~lpserve.rebalancer.Rebalancer` (optional, in :mod:`lpserve.rebalancer`) —
  ``migrate(view) -> int64 (n_moves, 2)`` rows of ``(request, destination replica)``: live
  migrations of decoding requests, asked every ``period_s`` of simulated time.

Every role has ``reset(cluster, rng)``, called once per simulation before the first
decision. Views are read-only numpy arrays aligned with the candidates. A view handed to a
non-clairvoyant policy has no ``output_tokens`` field at all (it is ``None``), so a policy
cannot use true output lengths by accident.

A :class:`Policy` bundles one of each role plus an :class:`EngineConfig` (how a replica
batches, reserves memory and preempts). Plain functions can be lifted into a role with
:func:`as_router`, :func:`as_scheduler` and :func:`as_evictor`.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from lpserve.views import EvictorView, RouterView, SchedulerView, _ro, _ro_view  # noqa: F401

BATCHING_MODES = ("prefill-first", "decode-first", "mixed", "static")
PREEMPTION_MODES = ("recompute", "swap", "compress-swap")
ENGINES = ("lpserve", "vidur", "vllm")


class PolicyError(ValueError):
    """A policy returned something unusable; the message names the policy and the value."""


@dataclass(frozen=True)
class Claim:
    """A bound a policy claims, backed by a proof file.

    Attributes:
        statement: the claim in one sentence (e.g. "2-competitive for total flow time").
        proof: path of the proof file under ``proofs/`` (e.g. ``"proofs/srpt.md"``).
        test: the test that checks it (``"tests/properties/test_x.py::test_y"``).
    """

    statement: str
    proof: str
    test: str = ""

    def __post_init__(self) -> None:
        if not self.proof.startswith("proofs/"):
            raise ValueError(f"Claim.proof must point into proofs/, got {self.proof!r}")


@dataclass(frozen=True)
class Meta:
    """What a policy declares about itself.

    Attributes:
        online: decides using only the past (True) or sees the whole instance (False).
        clairvoyant: receives true output lengths (``view.output_tokens``).
        stochastic: uses the ``rng`` given to ``reset``.
        engines: engines the policy can run in (``"lpserve"``, ``"vidur"``, ``"vllm"``).
        claims: :class:`Claim` objects.
    """

    online: bool = True
    clairvoyant: bool = False
    stochastic: bool = False
    engines: tuple[str, ...] = ("lpserve", "vidur", "vllm")
    claims: tuple[Claim, ...] = ()

    def __post_init__(self) -> None:
        bad = [e for e in self.engines if e not in ENGINES]
        if bad:
            raise ValueError(f"Meta.engines has unknown engine(s) {bad}; known: {ENGINES}")
        for c in self.claims:
            if not isinstance(c, Claim):
                raise ValueError(f"Meta.claims must hold Claim objects, got {c!r}")


# ===================================================================================== views
class _Role(abc.ABC):
    """Common base: a name, a :class:`Meta`, and ``reset``."""

    name: str = "role"
    meta: Meta = Meta()

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Prepare for a new run on ``cluster``; ``rng`` is the only randomness allowed."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Router(_Role):
    """Chooses a replica for each arriving request."""

    @abc.abstractmethod
    def route(self, view: RouterView) -> np.ndarray:
        """Replica index (int64) for each arriving request of ``view``."""


class Scheduler(_Role):
    """Ranks the candidates of one replica; lower runs first, ``+inf`` holds back.

    ``quantum_s``: if set, the simulator asks again at least every ``quantum_s`` seconds
    of simulated time (a time-sliced policy); ``None`` asks only at events.
    ``rank_key``: a declaration that ``rank(view)`` always equals ``view.<rank_key>``
    (``"arrival_s"`` or ``"prompt_tokens"``), a fixed per-request key; engines may then
    order by the key without calling ``rank``. ``None`` (default) promises nothing.
    """

    quantum_s: float | None = None
    rank_key: str | None = None

    @abc.abstractmethod
    def rank(self, view: SchedulerView) -> np.ndarray:
        """One float per candidate of ``view``: lower runs first, ``+inf`` holds back."""


class Evictor(_Role):
    """Chooses which evictable cached blocks to drop.

    ``reads_queue = True`` asks the simulator to fill ``EvictorView.queued`` (the blocks the
    waiting requests would hit), which costs a cache lookup per queued block.
    """

    reads_queue: bool = False

    @abc.abstractmethod
    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        """``need_blocks`` distinct positions into ``view``'s candidates to give up."""


class BudgetController:
    """Engine hook: sets each decode-first iteration's prefill token budget.

    The simulator calls ``start(replica)`` once per replica and run (its result is the
    replica's controller state), ``budget(replica, state, decodes, cap_tokens)`` when it
    plans a decode-first iteration (the prefill tokens allowed, at most ``cap_tokens``),
    ``observe(replica, state, dt_s, chunks, decodes, produced)`` after every planned
    iteration and, for runs of pure-decode iterations, ``decode_limit(replica, state, idx,
    ctx, held, max_iters)`` (most iterations before the next budget decision could
    differ) then ``observe_decode_run(replica, state, idx, ctx, held, n_iters, start_s)``.
    The defaults leave the engine's budget unchanged and observe nothing.
    """

    name = "budget"

    def start(self, replica: Any) -> Any:
        return None

    def budget(self, replica: Any, state: Any, decodes: list, cap_tokens: int) -> int:
        return int(cap_tokens)

    def observe(self, replica: Any, state: Any, dt_s: float, chunks: list, decodes: list,
                produced: list) -> None:
        return None

    def decode_limit(self, replica: Any, state: Any, idx: np.ndarray, ctx: np.ndarray,
                     held: np.ndarray, max_iters: int) -> int:
        return int(max_iters)

    def observe_decode_run(self, replica: Any, state: Any, idx: np.ndarray, ctx: np.ndarray,
                           held: np.ndarray, n_iters: int, start_s: float) -> None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class RoundRobin(Router):
    """Replica ``k mod R`` for the ``k``-th routed request."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        self._next = 0

    def route(self, view: RouterView) -> np.ndarray:
        n = len(view)
        if n == 1:
            k = self._next
            self._next = (k + 1) % view.n_replicas
            return np.array([k % view.n_replicas], np.int64)
        out = (self._next + np.arange(n, dtype=np.int64)) % view.n_replicas
        self._next = int((self._next + n) % view.n_replicas)
        return out


class FCFS(Scheduler):
    """First come, first served: rank = arrival time (ties by queue position)."""

    name = "fcfs"
    rank_key = "arrival_s"

    def rank(self, view: SchedulerView) -> np.ndarray:
        return np.asarray(view.arrival_s, dtype=np.float64).copy()


class LRU(Evictor):
    """Least recently used first; among equal times the deepest block of a chain first."""

    name = "lru"

    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        last = view.last_access_s
        n = int(last.shape[0])
        if need_blocks <= 0:
            return np.zeros(0, np.int64)
        if need_blocks >= n:
            return np.lexsort((-view.depth, last)).astype(np.int64)[:need_blocks]
        kth = np.partition(last, need_blocks - 1)[need_blocks - 1]
        cand = np.flatnonzero(last <= kth)  # every block that can be among the oldest
        sub = np.lexsort((-view.depth[cand], last[cand]))
        return cand[sub[:need_blocks]].astype(np.int64)


# ===================================================================================== lifting
class _FnRouter(Router):
    def __init__(self, fn: Callable[[RouterView], Any], name: str, meta: Meta):
        self.fn, self.name, self.meta = fn, name, meta

    def route(self, view: RouterView) -> np.ndarray:
        return np.asarray(self.fn(view))


class _FnScheduler(Scheduler):
    def __init__(self, fn: Callable[[SchedulerView], Any], name: str, meta: Meta):
        self.fn, self.name, self.meta = fn, name, meta

    def rank(self, view: SchedulerView) -> np.ndarray:
        return np.asarray(self.fn(view), dtype=np.float64)


class _FnEvictor(Evictor):
    def __init__(self, fn: Callable[[EvictorView, int], Any], name: str, meta: Meta):
        self.fn, self.name, self.meta = fn, name, meta

    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        return np.asarray(self.fn(view, need_blocks))


def as_router(fn: Callable[[RouterView], Any] | Router, *, name: str | None = None,
              meta: Meta = Meta()) -> Router:
    """Lift ``fn(view) -> replica per request`` into a :class:`Router` (a module-level
    function keeps the router picklable)."""
    return fn if isinstance(fn, Router) else _FnRouter(fn, name or fn.__name__, meta)


def as_scheduler(fn: Callable[[SchedulerView], Any] | Scheduler, *, name: str | None = None,
                 meta: Meta = Meta()) -> Scheduler:
    """Lift ``fn(view) -> rank per candidate`` into a :class:`Scheduler`."""
    return fn if isinstance(fn, Scheduler) else _FnScheduler(fn, name or fn.__name__, meta)


def as_evictor(fn: Callable[[EvictorView, int], Any] | Evictor, *, name: str | None = None,
               meta: Meta = Meta()) -> Evictor:
    """Lift ``fn(view, need_blocks) -> positions`` into an :class:`Evictor`."""
    return fn if isinstance(fn, Evictor) else _FnEvictor(fn, name or fn.__name__, meta)


# ===================================================================================== engine
@dataclass(frozen=True)
class EngineConfig:
    """How one replica batches, reserves KV memory and preempts.

    Attributes:
        batching: ``"prefill-first"`` (vLLM V0: an iteration is either whole prefills of
            newly admitted requests or decodes of all running ones), ``"decode-first"``
            (Sarathi-Serve / vLLM chunked prefill: running decodes first, then prefill
            chunks within the token budget), ``"mixed"`` (Orca: decodes plus whole prefills
            in one iteration), ``"static"`` (request-level batching: admit only into an
            empty batch, which then runs until all of its requests finish).
        max_num_seqs: most requests in the running batch.
        max_num_batched_tokens: token budget of one iteration (prefill tokens + decodes).
        chunked_prefill: split prompts into chunks to fit the token budget (decode-first).
        preemption: ``"recompute"`` (drop KV, re-prefill later), ``"swap"`` (copy KV to
            host memory over PCIe, priced by the cost model; recompute when host is full)
            or ``"compress-swap"`` (quantize the KV by ``compression_ratio`` on the GPU,
            then swap the smaller copy; models/kv-compression-swap.md).
        compression_ratio: full / compressed KV bytes of ``"compress-swap"`` (4.0: FP16
            KV, the cost model's default KV dtype, to INT4; 2.0 from FP8 KV); finite, > 1.
        compression_accuracy_cost: quality loss per context token swapped compressed, a
            stated parameter (>= 0) that is reported, not simulated: timing ignores it.
        preemption_decider: ``None`` or a :class:`lpserve.preemption.PreemptionDecider`
            choosing recompute, swap or compress-swap per victim (replacing ``preemption``).
        reserve_tokens: ``None`` allocates KV blocks as tokens are produced; an integer
            reserves blocks for that many tokens at admission (Orca / static: the maximum
            sequence length).
        max_model_len: requests with ``prompt + output`` above it are rejected on arrival
            (the engine validates ``max_tokens`` as vLLM does); ``None`` for no limit.
        watermark: share of KV blocks kept free when admitting a new request (vLLM: 0.01).
        prefix_caching: keep full prompt blocks hashed after release and reuse them.
        evict_batch_blocks: cached blocks reclaimed at once when the plain free pool runs
            out (a low-watermark reclaim; LRU order is unaffected by the batch size).
        budget_controller: ``None`` or a :class:`BudgetController` that sets the prefill
            token budget of every decode-first iteration (capped by
            ``max_num_batched_tokens``) and observes every iteration's time.
        priority_preemption: before admitting, preempt (by ``preemption``) the worst-ranked
            running requests whose rank is strictly worse than that of a better-ranked
            waiting request that cannot be admitted (batch full or KV memory short);
            needed by preemptive schedulers (SRPT, LAS, MLFQ, round robin).
        speculation: ``None`` or a speculation decider
            (:class:`lpserve.policies.speculation.SpeculationDecider`): speculative
            decoding with a draft model on every pure-decode step (lpserve's simulator
            only; ``models/speculative-decoding.md``). Not combinable with
            ``budget_controller``.
    """

    batching: str = "prefill-first"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = False
    preemption: str = "recompute"
    reserve_tokens: int | None = None
    max_model_len: int | None = None
    watermark: float = 0.01
    prefix_caching: bool = True
    evict_batch_blocks: int = 32
    budget_controller: Any = None
    priority_preemption: bool = False
    speculation: Any = None
    compression_ratio: float = 4.0
    compression_accuracy_cost: float = 0.0
    preemption_decider: Any = None

    def __post_init__(self) -> None:
        from lpserve.cost.base import check_ratio
        from lpserve.preemption import PreemptionDecider

        check_ratio(self.compression_ratio, "EngineConfig.compression_ratio")
        c = self.compression_accuracy_cost
        if isinstance(c, bool) or not isinstance(c, (int, float, np.number)) or \
                not (np.isfinite(c) and c >= 0):
            raise ValueError("EngineConfig.compression_accuracy_cost must be a finite number "
                             f">= 0, got {c!r}")
        if self.preemption_decider is not None and not isinstance(self.preemption_decider,
                                                                   PreemptionDecider):
            raise ValueError("EngineConfig.preemption_decider must be None or a "
                             f"PreemptionDecider, got {self.preemption_decider!r}")
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"EngineConfig.batching must be one of {BATCHING_MODES}, "
                             f"got {self.batching!r}")
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"EngineConfig.preemption must be one of {PREEMPTION_MODES}, "
                             f"got {self.preemption!r}")
        for k in ("max_num_seqs", "max_num_batched_tokens", "evict_batch_blocks"):
            v = getattr(self, k)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"EngineConfig.{k} must be a positive integer, got {v!r}")
        for k in ("reserve_tokens", "max_model_len"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, (int, np.integer)) or v < 1):
                raise ValueError(f"EngineConfig.{k} must be None or a positive integer, "
                                 f"got {v!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"EngineConfig.watermark must be in [0, 1), got {self.watermark}")
        if self.budget_controller is not None and not isinstance(self.budget_controller,
                                                                  BudgetController):
            raise ValueError("EngineConfig.budget_controller must be None or a "
                             f"BudgetController, got {self.budget_controller!r}")
        if self.speculation is not None:
            from lpserve.policies.speculation import SpeculationDecider

            if not isinstance(self.speculation, SpeculationDecider):
                raise ValueError("EngineConfig.speculation must be None or a "
                                 f"SpeculationDecider, got {self.speculation!r}")
            if self.budget_controller is not None:
                raise ValueError("EngineConfig.speculation cannot be combined with "
                                 "EngineConfig.budget_controller")
        if self.chunked_prefill and self.batching != "decode-first":
            raise ValueError("EngineConfig.chunked_prefill needs batching='decode-first', "
                             f"got {self.batching!r}")


@dataclass(frozen=True)
class Policy:
    """One router, scheduler and evictor plus the engine they drive.

    ``decode_router`` routes the decode phase of disaggregated clusters (defaults to a
    fresh round robin). ``rebalancer`` (``None``: no migration), a
    :class:`lpserve.rebalancer.Rebalancer`, moves decoding requests between replicas of
    the decoding pool. ``meta`` is derived from the roles when not given: clairvoyant or
    stochastic if any role is.
    """

    router: Router = field(default_factory=RoundRobin)
    scheduler: Scheduler = field(default_factory=FCFS)
    evictor: Evictor = field(default_factory=LRU)
    engine: EngineConfig = field(default_factory=EngineConfig)
    decode_router: Router = field(default_factory=RoundRobin)
    name: str = "custom"
    meta: Meta | None = None
    rebalancer: Any = None  # a lpserve.rebalancer.Rebalancer

    def __post_init__(self) -> None:
        for role, cls in (("router", Router), ("scheduler", Scheduler),
                          ("evictor", Evictor), ("decode_router", Router)):
            v = getattr(self, role)
            if not isinstance(v, cls):
                lifter = {"router": as_router, "decode_router": as_router,
                          "scheduler": as_scheduler, "evictor": as_evictor}[role]
                if not callable(v):
                    raise ValueError(f"Policy.{role} must be a {cls.__name__} or a function, "
                                     f"got {v!r}")
                object.__setattr__(self, role, lifter(v))
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"Policy.engine must be an EngineConfig, got {self.engine!r}")
        from lpserve.rebalancer import Rebalancer

        rb = self.rebalancer
        if rb is not None and not (isinstance(rb, Rebalancer) and float(rb.period_s) > 0):
            raise ValueError(f"Policy.rebalancer must be None or a Rebalancer with period_s "
                             f"> 0, got {rb!r} (period_s={getattr(rb, 'period_s', None)!r})")
        if self.meta is None:  # from the roles, the rebalancer and the speculation decider
            metas = [r.meta for r in self.roles()]
            if rb is not None:
                metas.append(rb.meta)
            if self.engine.speculation is not None:
                metas.append(self.engine.speculation.meta)
            engines = set(ENGINES)
            for m in metas:
                engines &= set(m.engines)
            object.__setattr__(self, "meta", Meta(
                online=all(m.online for m in metas),
                clairvoyant=any(m.clairvoyant for m in metas),
                stochastic=any(m.stochastic for m in metas),
                engines=tuple(e for e in ENGINES if e in engines),
                claims=tuple(c for m in metas for c in m.claims),
            ))

    def roles(self) -> tuple[Router, Scheduler, Evictor, Router]:
        return (self.router, self.scheduler, self.evictor, self.decode_router)

    def with_(self, **changes: Any) -> "Policy":
        """A copy with fields changed (``engine`` may be a dict of EngineConfig changes)."""
        eng = changes.get("engine")
        if isinstance(eng, dict):
            changes["engine"] = replace(self.engine, **eng)
        if "meta" not in changes:
            changes["meta"] = None
        return replace(self, **changes)

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Reset every role, each with its own child generator of ``rng``."""
        for role, child in zip(self.roles(), rng.spawn(4)):
            role.reset(cluster, child)
        if self.rebalancer is not None:  # spawned after the four, which stay unchanged
            self.rebalancer.reset(cluster, rng.spawn(1)[0])
