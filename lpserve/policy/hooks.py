"""The optional engine hooks of the policy contract, all in one interface style.

Every hook is a :class:`~lpserve.policy.roles.Role`: it has a ``name``, a
:class:`~lpserve.policy.roles.Meta`, ``bind(cluster, slo)`` (called once per simulation
before ``reset``, with the instance's SLO and tiers, to take the parameters that mirror the instance, such as an SLO target
the user left unset) and ``reset(cluster, rng)`` (called once per simulation, before the
first decision, with a generator of its own spawned by
:meth:`lpserve.policy.Policy.reset`), one decision method that takes a read-only view, and
optional ``observe`` methods that take a read-only view of what happened. State a hook
keeps per replica lives inside the hook, keyed by the view's ``replica``, and ``reset``
clears it.

=======================  ================================  ==================================
hook                     decision                          where it is set
=======================  ================================  ==================================
:class:`BudgetController`  ``budget(BudgetView) -> tokens``  ``EngineConfig.budget_controller``
:class:`PreemptionDecider` ``decide(PreemptionView) -> str`` ``EngineConfig.preemption_decider``
:class:`SpeculationDecider` ``choose(StepContext) -> arm``   ``EngineConfig.speculation``
:class:`Rebalancer`      ``migrate(RebalanceView) -> moves``  ``Policy.rebalancer``
:class:`Predictor`       ``predict(PredictorView) -> Prediction``  ``lp.simulate(..., predictor=)``
=======================  ================================  ==================================
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from lpserve.policy.roles import Meta, Role

__all__ = ["BudgetController", "BudgetView", "DEFAULT_DRAFT", "DecodeRunView",
           "IterationView", "PREEMPTION_CHOICES", "Prediction", "PreemptionDecider",
           "PreemptionView", "Predictor", "PredictorView", "RebalanceView", "Rebalancer",
           "SpeculationDecider", "StepContext", "StepResult"]


# ===================================================================================== budget
@dataclass(frozen=True, eq=False)
class BudgetView:
    """One decode-first iteration about to be planned on one replica.

    Attributes:
        now_s: start of the iteration (s); replica: ``(role, index)`` of the replica.
        cost_params: the replica's cost-model parameters (float64, for
            :func:`lpserve.cost.iteration_time`).
        block_tokens, used_blocks, total_blocks: the replica's KV state (blocks).
        cap_tokens: the most prefill tokens the engine allows this iteration.
        decode_context: ``(m,)`` tokens in KV of each decode of this iteration.
        request, tenant, left_tokens, computed_tokens, waiting, resumable, rank: ``(q,)``
            the replica's candidates, waiting ones first, in queue order: tokens still to
            (re)compute (0 for a waiting request whose KV is on the host or arriving from
            a prefill replica), tokens in KV, whether waiting, whether its KV is ready
            elsewhere (swapped out or transferred), and the scheduler's rank.
    """

    now_s: float
    replica: tuple[str, int]
    cost_params: np.ndarray
    block_tokens: int
    used_blocks: int
    total_blocks: int
    cap_tokens: int
    decode_context: np.ndarray
    request: np.ndarray
    tenant: np.ndarray
    left_tokens: np.ndarray
    computed_tokens: np.ndarray
    waiting: np.ndarray
    resumable: np.ndarray
    rank: np.ndarray


@dataclass(frozen=True, eq=False)
class IterationView:
    """One iteration that just ran (prefill chunks and/or decodes).

    Attributes:
        now_s: end of the iteration (s); dt_s: its duration (s); replica: ``(role, index)``.
        cost_params, used_blocks, total_blocks: as in :class:`BudgetView`.
        chunk_tokens, chunk_cached: ``(c,)`` prefill chunks run and the tokens already in
            KV before each.
        decode_context: ``(m,)`` contexts of the decodes before the iteration.
        produced_request: ``(k,)`` requests that produced a token in it;
        produced_generated: ``(k,)`` their output tokens before this one.
    """

    now_s: float
    dt_s: float
    replica: tuple[str, int]
    cost_params: np.ndarray
    used_blocks: int
    total_blocks: int
    chunk_tokens: np.ndarray
    chunk_cached: np.ndarray
    decode_context: np.ndarray
    produced_request: np.ndarray
    produced_generated: np.ndarray


@dataclass(frozen=True, eq=False)
class DecodeRunView:
    """A run of pure-decode iterations of one batch between two events.

    Attributes:
        now_s: start of the run (s); replica: ``(role, index)``; cost_params, used_blocks,
            total_blocks: as in :class:`BudgetView`.
        request, context, held_blocks: ``(m,)`` the batch, its contexts and KV blocks at
            the start of the run.
        max_iters: iterations the engine could run before its next event.
    """

    now_s: float
    replica: tuple[str, int]
    cost_params: np.ndarray
    used_blocks: int
    total_blocks: int
    request: np.ndarray
    context: np.ndarray
    held_blocks: np.ndarray
    max_iters: int


class BudgetController(Role):
    """Sets each decode-first iteration's prefill token budget.

    The simulator calls ``budget(view)`` when it plans a decode-first iteration (the
    prefill tokens allowed, at most ``view.cap_tokens``) and ``observe(view)`` after every
    planned iteration. For runs of pure-decode iterations between events it calls
    ``decode_limit(view)`` (most iterations before the next budget decision could differ)
    and then ``observe_decode_run(view, n_iters)``. The defaults leave the engine's
    budget unchanged and observe nothing.
    """

    name = "budget"

    def budget(self, view: BudgetView) -> int:
        """Prefill tokens allowed in the iteration of ``view`` (``<= view.cap_tokens``)."""
        return int(view.cap_tokens)

    def observe(self, view: IterationView) -> None:
        """Told after every planned iteration."""

    def decode_limit(self, view: DecodeRunView) -> int:
        """Most iterations of the decode run before a budget decision could differ."""
        return int(view.max_iters)

    def observe_decode_run(self, view: DecodeRunView, n_iters: int) -> None:
        """Told after a decode run of ``n_iters`` iterations that started at ``view``."""


# ===================================================================================== preemption
PREEMPTION_CHOICES = ("recompute", "swap", "compress-swap")


@dataclass(frozen=True)
class PreemptionView:
    """One victim about to be preempted, with the cost model's prices of each choice.

    Attributes:
        now_s: simulated time (s); replica: replica index; request: trace index.
        context_tokens: tokens of KV the victim holds (computed so far).
        held_blocks: GPU KV blocks it holds; block_tokens: tokens per block.
        host_free_blocks: free host blocks (full-size blocks of ``block_tokens`` tokens).
        compression_ratio: full / compressed KV bytes; compression_accuracy_cost: quality
            loss per context token swapped compressed (a stated parameter, unitless).
        recompute_s: (5) seconds to prefill ``context_tokens`` again in an iteration alone.
        swap_s: (1) seconds out plus in at full size; compress_swap_s: (4) out plus in of
            the compressed KV including quantize and dequantize.
        swap_host_blocks: host blocks a full swap needs (``held_blocks``);
            compress_host_blocks: (2) host blocks a compressed swap needs.

    Equation numbers are those of ``models/kv-compression-swap.md``.
    """

    now_s: float
    replica: int
    request: int
    context_tokens: int
    held_blocks: int
    block_tokens: int
    host_free_blocks: int
    compression_ratio: float
    compression_accuracy_cost: float
    recompute_s: float
    swap_s: float
    compress_swap_s: float
    swap_host_blocks: int
    compress_host_blocks: int

    @property
    def quality_loss(self) -> float:
        """Accuracy cost of a compressed swap of this victim (``cost x context_tokens``)."""
        return self.compression_accuracy_cost * self.context_tokens


class PreemptionDecider(Role):
    """Chooses, per victim, ``"recompute"``, ``"swap"`` or ``"compress-swap"``.

    Set as ``EngineConfig.preemption_decider``; its choice replaces
    ``EngineConfig.preemption`` for that victim. A swap whose host blocks do not fit in
    ``host_free_blocks`` falls back to recompute (the engine never exceeds host memory).
    """

    name = "decider"

    @abc.abstractmethod
    def decide(self, view: PreemptionView) -> str:
        """One of :data:`PREEMPTION_CHOICES` for the victim of ``view``."""


# ===================================================================================== speculation
#: Default draft model of the registered ``spec-*`` policies: it fits beside any catalog
#: target (68 M parameters, 6 KiB of KV per token).
DEFAULT_DRAFT = "llama-68m"


class StepContext:
    """What a decider sees before one speculative decode step of a replica.

    Attributes:
        replica: ``(role, index)`` of the replica (per-replica learner state is keyed by it).
        key: the bandit context ``(request class, batch-size bucket)``; the class of a
            batch is the most common tenant among its sequences (ties: the smallest id).
        batch_size: sequences in the decode batch.
        arms: the arm set, ``arms[0] == Arm(0)``.
        rates: ``(batch_size, n_drafts)`` true per-token acceptance rates of the batch,
            given only to clairvoyant deciders (``meta.clairvoyant``), else ``None``.
        tenant: ``(batch_size,)`` tenant (request class) of each sequence, -1 if none.

    ``time_s(j)`` is the step time (s) of arm ``j`` for this batch (eq. (5)-(6) of
    ``models/speculative-decoding.md``, computed on first use); ``reward_bound`` is
    ``U = max_j batch_size (k_j + 1) / time_s(j)`` (tokens/s), eq. (10).
    """

    def __init__(self, key: Hashable, batch_size: int, arms: tuple[Any, ...],
                 timer: Callable[[Any], float], rates: np.ndarray | None,
                 tenant: np.ndarray | None = None,
                 replica: tuple[str, int] = ("colocated", 0)) -> None:
        self.replica = replica
        self.key = key
        self.batch_size = int(batch_size)
        self.arms = arms
        self.rates = rates
        self.tenant = (np.full(self.batch_size, -1, np.int64) if tenant is None
                       else np.asarray(tenant, np.int64))
        self._timer = timer
        self._times: dict[int, float] = {}

    def time_s(self, j: int) -> float:
        """Seconds of one step with arm ``j`` for this batch."""
        t = self._times.get(j)
        if t is None:
            t = self._times[j] = float(self._timer(self.arms[j]))
        return t

    @property
    def reward_bound(self) -> float:
        """``U`` (tokens/s): the tokens/s of the best arm if every draft were accepted."""
        return max(self.batch_size * (a.k + 1) / self.time_s(j) for j, a in enumerate(self.arms))


@dataclass(frozen=True, eq=False)
class StepResult:
    """What one speculative step did: the arm played, the drafts actually drawn ``k``
    (fewer than the arm's when KV memory was short), the accepted drafts of each sequence
    (int64 ``(batch_size,)``) and the normalized reward in ``[0, 1]`` (eq. (10))."""

    arm: int
    k: int
    accepted: np.ndarray
    reward: float


class SpeculationDecider(Role):
    """Draft models, acceptance rates, ``max_k`` and the speculation decision.

    Args:
        draft: catalog name of the draft LLM, or a sequence of names (several drafts are
            all loaded; the arm picks which one proposes).
        acceptance: per-token acceptance rate(s) in ``[0, 1)``: one float, one float per
            draft, or a mapping ``{tenant: rate}`` that must cover every tenant of the
            trace (``-1`` when the trace has none).
        max_k: the largest number of draft tokens per step (``>= 0``).
        bucket_edges: upper edges of the batch-size buckets of the context.

    ``choose(ctx)`` returns an index into ``ctx.arms``; a decider with ``learns = True``
    is told ``observe(ctx, result)`` after each step. Deciders are in
    :mod:`lpserve.policies.speculation`.
    """

    name = "speculation"
    meta = Meta(engines=("lpserve",))
    learns = False  # True: the simulator computes the reward and calls observe

    def __init__(self, draft: str | Sequence[str] = DEFAULT_DRAFT, acceptance: Any = 0.6,
                 max_k: int = 4, bucket_edges: Sequence[int] | None = None) -> None:
        from lpserve.cost.catalog import llm_names
        from lpserve.cost.speculation import DEFAULT_BUCKET_EDGES, Arm, check_k

        cls = type(self).__name__
        names = (draft,) if isinstance(draft, str) else tuple(draft)
        if not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{cls}.draft must be a catalog LLM name or a non-empty list of "
                             f"them, got {draft!r}")
        known = llm_names()
        for n in names:
            if n not in known:
                raise ValueError(f"{cls}.draft: unknown LLM {n!r}; known: {', '.join(known)}")
        self.drafts = names
        self.max_k = check_k(max_k, f"{cls}.max_k")
        if isinstance(acceptance, Mapping):
            if not acceptance:
                raise ValueError(f"{cls}.acceptance: the mapping of tenant -> rate is empty")
            bad = [t for t in acceptance
                   if isinstance(t, bool) or not isinstance(t, (int, np.integer))]
            if bad:
                raise ValueError(f"{cls}.acceptance: tenant ids must be integers, got {bad[0]!r}")
            self.acceptance: Any = {int(t): self._rates(r, f"{cls}.acceptance[{t!r}]")
                                    for t, r in acceptance.items()}
        else:
            self.acceptance = self._rates(acceptance, f"{cls}.acceptance")
        edges = tuple(int(e) for e in (DEFAULT_BUCKET_EDGES if bucket_edges is None
                                       else bucket_edges))
        if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 1:
            raise ValueError(f"{cls}.bucket_edges must be increasing integers >= 1, "
                             f"got {bucket_edges!r}")
        self.bucket_edges = edges
        self.arms = (Arm(0),) + tuple(Arm(k, d) for d in range(len(names))
                                      for k in range(1, self.max_k + 1))

    def _rates(self, r: Any, field: str) -> tuple[float, ...]:
        from lpserve.cost.speculation import check_acceptance

        a = check_acceptance(r, field).reshape(-1)
        if a.size == 1:
            a = np.repeat(a, len(self.drafts))
        if a.size != len(self.drafts):
            raise ValueError(f"{field} has {a.size} rates but there are {len(self.drafts)} "
                             f"draft models")
        return tuple(float(x) for x in a)

    def rates_for(self, tenant: np.ndarray) -> np.ndarray:
        """Acceptance rates of requests with these tenants, shape ``(n, n_drafts)``.

        A ValueError names the first tenant the ``acceptance`` mapping does not cover.
        """
        t = np.asarray(tenant, np.int64)
        if not isinstance(self.acceptance, dict):
            return np.tile(np.asarray(self.acceptance), (t.size, 1))
        out = np.empty((t.size, len(self.drafts)))
        for v in np.unique(t).tolist():
            if v not in self.acceptance:
                raise ValueError(f"{type(self).__name__}.acceptance has no rate for tenant "
                                 f"{v} (rates given for tenants {sorted(self.acceptance)})")
            out[t == v] = self.acceptance[v]
        return out

    def arm_index(self, k: int, draft: int) -> int:
        """Index of ``Arm(k, draft)`` in :attr:`arms` (``k = 0`` is index 0)."""
        return 0 if k == 0 else 1 + draft * self.max_k + (k - 1)

    @abc.abstractmethod
    def choose(self, ctx: StepContext) -> int:
        """Index into ``ctx.arms`` of the arm to play at this step."""

    def observe(self, ctx: StepContext, result: StepResult) -> None:
        """Told after the step (only when ``learns``): what it did and its reward."""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(draft={list(self.drafts)!r}, "
                f"acceptance={self.acceptance!r}, max_k={self.max_k})")


# ===================================================================================== rebalancing
@dataclass(frozen=True, eq=False)
class RebalanceView:
    """A pool of replicas at one rebalancing point.

    Replica arrays, shape ``(n_replicas,)`` (int64): ``free_blocks`` (KV blocks free or
    evictable, minus the admission watermark; may be negative), ``total_blocks``,
    ``running`` and ``waiting`` (request counts), ``seats`` (room left in the running
    batch), ``waiting_blocks`` (tuple of int64 arrays: KV blocks each waiting request
    needs to be admitted, in queue order). Candidate arrays, shape ``(n,)``: the running
    requests in decode phase, the only ones that may migrate: ``request`` (trace index),
    ``replica`` (source), ``prompt_tokens``, ``generated_tokens``, ``context_tokens``
    (tokens whose KV would move), ``blocks`` (KV blocks held, taken on the destination),
    ``migration_s`` (transfer time of that KV over the source's link, s),
    ``predicted_lo``/``predicted_hi`` (or ``None``), ``output_tokens`` (clairvoyant
    policies only, else ``None``). ``decode_iteration_s(context_tokens)`` is the cost
    model's time (s) of one decode iteration over a batch with those contexts.
    """

    now_s: float
    block_tokens: int
    free_blocks: np.ndarray
    total_blocks: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    seats: np.ndarray
    waiting_blocks: tuple[np.ndarray, ...]
    request: np.ndarray
    replica: np.ndarray
    prompt_tokens: np.ndarray
    generated_tokens: np.ndarray
    context_tokens: np.ndarray
    blocks: np.ndarray
    migration_s: np.ndarray
    predicted_lo: np.ndarray | None
    predicted_hi: np.ndarray | None
    output_tokens: np.ndarray | None
    decode_iteration_s: Callable[[np.ndarray], float]

    @property
    def n_replicas(self) -> int:
        """Replicas in the pool."""
        return int(self.free_blocks.shape[0])

    def __len__(self) -> int:
        return int(self.request.shape[0])


class Rebalancer(Role):
    """Moves running (decoding) requests between replicas of one pool.

    ``period_s``: the simulator asks every ``period_s`` seconds of simulated time (never
    per iteration). ``migrate(view)`` returns ``(request, destination)`` rows; each
    request's KV is copied to the destination (``models/simulator.md``, migration).
    """

    period_s: float = 1.0
    meta: Meta = Meta(engines=("lpserve",))  # live migration exists in lpserve's simulator

    @abc.abstractmethod
    def migrate(self, view: RebalanceView) -> np.ndarray:
        """int64 array ``(n_moves, 2)`` of (request, destination replica) rows."""


# ===================================================================================== prediction
@dataclass(frozen=True)
class Prediction:
    """Predicted output lengths of ``n`` requests (int64 arrays of shape ``(n,)``)."""

    lo: np.ndarray
    hi: np.ndarray
    point: np.ndarray


@dataclass(frozen=True, eq=False)
class PredictorView:
    """Requests at one prediction point (all arrays ``(n,)``, read-only).

    At ``predict`` the requests arriving now: ``output_tokens`` holds their true output
    lengths only for a clairvoyant predictor (``meta.clairvoyant``: the oracle family),
    else ``None``. At ``observe`` the requests completed since the last prediction, with
    their true ``output_tokens``.
    """

    now_s: float
    request: np.ndarray
    prompt_tokens: np.ndarray
    tenant: np.ndarray
    output_tokens: np.ndarray | None

    def __len__(self) -> int:
        return int(self.request.shape[0])


class Predictor(Role):
    """Predicts each arriving request's output length as an interval plus a point.

    The simulator owns the predictor and is the only party that shows it true lengths:
    ``predict(view)`` at arrival, ``observe(view)`` with every completion before the next
    arrival, so a learning predictor trains on completed requests only. Predictors are in
    :mod:`lpserve.policies.predictors`.
    """

    name = "predictor"

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget learned state and take a new random stream."""
        self._rng = rng

    @property
    def rng(self) -> np.random.Generator:
        """The generator given to :meth:`reset` (an error before the first reset)."""
        r = getattr(self, "_rng", None)
        if r is None:
            raise RuntimeError(f"predictor {self.name!r}: call reset(cluster, rng) before "
                               "predict()")
        return r

    @abc.abstractmethod
    def predict(self, view: PredictorView) -> Prediction:
        """Predictions for the requests of ``view``."""

    def observe(self, view: PredictorView) -> None:
        """Completed requests' true output lengths (default: nothing to learn)."""
