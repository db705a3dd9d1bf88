"""Speculation deciders: how many draft tokens a replica speculates at each decode step.

An :class:`~lpserve.policy.EngineConfig` with ``speculation=<decider>`` runs speculative
decoding inside the simulator (``lpserve/sim/speculative.py``, equations in
``models/speculative-decoding.md``). The decider names the draft model(s), holds the
per-token acceptance rate of each request class and chooses, before every pure-decode
step of a replica, one arm of :meth:`lpserve.speculation.SpeculationCost.arms`: ``Arm(0)``
(plain decoding) or ``Arm(k, d)`` (``k`` draft tokens from draft model ``d``).

Acceptance rates (where they come from). Each request's class is its trace ``tenant``
(``-1`` when the trace has none). ``acceptance`` is either one rate for every class, or a
mapping ``{tenant: rate}`` that must cover every tenant of the trace; a rate is one float
(every draft) or one float per draft, each in ``[0, 1)``. Per-token acceptances are
i.i.d. Bernoulli(rate) given the earlier tokens of the same step (Leviathan et al., ICML
2023), drawn from a generator the simulator derives from the run's seed.

Deciders (all share the interface ``start() -> state``, ``choose(state, ctx) -> arm
index``, ``observe(state, ctx, arm, reward)``; ``state`` is per replica and per run):

- :class:`NeverSpeculate` -- always ``Arm(0)``; the draft is still loaded (its weights
  and KV share reduce the KV capacity), so it isolates the memory cost.
- :class:`FixedSpeculation` -- always ``k`` drafts from draft 0 (``k <= max_k``).
- :class:`UCBSpeculation` -- UCB1 per context (:class:`lpserve.speculation.SpeculationBandit`),
  context = (request class of the batch, batch-size bucket); reward = emitted tokens /
  step time / ``U`` where ``U`` bounds the tokens/s of any arm (eq. (10) of the model).
- :class:`OracleSpeculation` -- clairvoyant: knows every request's true acceptance rate
  and picks the arm maximizing expected tokens/s of this step (the per-step analogue of
  :func:`lpserve.speculation.optimal_k`, eq. (11)).
"""
from __future__ import annotations

import abc
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from lpserve.policy import Meta
from lpserve.speculation import (DEFAULT_BUCKET_EDGES, Arm, SpeculationBandit,
                                 check_acceptance, check_k)

__all__ = ["FixedSpeculation", "NeverSpeculate", "OracleSpeculation", "SpeculationDecider",
           "StepContext", "UCBSpeculation", "DEFAULT_DRAFT"]

#: Default draft model of the registered ``spec-*`` policies: it fits beside any catalog
#: target (68 M parameters, 6 KiB of KV per token).
DEFAULT_DRAFT = "llama-68m"


class StepContext:
    """What a decider sees before one speculative decode step of a replica.

    Attributes:
        key: the bandit context ``(request class, batch-size bucket)``; the class of a
            batch is the most common tenant among its sequences (ties: the smallest id).
        batch_size: sequences in the decode batch.
        arms: the arm set, ``arms[0] == Arm(0)``.
        rates: ``(batch_size, n_drafts)`` true per-token acceptance rates of the batch,
            given only to clairvoyant deciders (``meta.clairvoyant``), else ``None``.

        tenant: ``(batch_size,)`` tenant (request class) of each sequence, -1 if none.
        k, accepted: filled after the step, before ``observe``: the drafts actually drawn
            (fewer than the arm's when KV memory was short) and the accepted drafts of each
            sequence (int64 ``(batch_size,)``).

    ``time_s(j)`` is the step time (s) of arm ``j`` for this batch (eq. (5)-(6) of
    ``models/speculative-decoding.md``, computed on first use); ``reward_bound`` is
    ``U = max_j batch_size (k_j + 1) / time_s(j)`` (tokens/s), eq. (10).
    """

    def __init__(self, key: Hashable, batch_size: int, arms: tuple[Arm, ...], timer: Any,
                 rates: np.ndarray | None, tenant: np.ndarray | None = None) -> None:
        self.key = key
        self.batch_size = int(batch_size)
        self.arms = arms
        self.rates = rates
        self.tenant = (np.full(self.batch_size, -1, np.int64) if tenant is None
                       else np.asarray(tenant, np.int64))
        self.k = 0
        self.accepted = np.zeros(self.batch_size, np.int64)
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


class SpeculationDecider(abc.ABC):
    """Base class: draft models, acceptance rates, ``max_k`` and the decision interface.

    Args:
        draft: catalog name of the draft LLM, or a sequence of names (several drafts are
            all loaded; the arm picks which one proposes).
        acceptance: per-token acceptance rate(s) in ``[0, 1)``: one float, one float per
            draft, or a mapping ``{tenant: rate}`` (see the module docstring).
        max_k: the largest number of draft tokens per step (``>= 0``).
        bucket_edges: upper edges of the batch-size buckets of the context.
    """

    name = "speculation"
    meta = Meta(engines=("lpserve",))
    learns = False  # True: the simulator computes the reward and calls observe

    def __init__(self, draft: str | Sequence[str] = DEFAULT_DRAFT, acceptance: Any = 0.6,
                 max_k: int = 4, bucket_edges: Sequence[int] = DEFAULT_BUCKET_EDGES) -> None:
        from lpserve.cost.catalog import llm_names

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
        edges = tuple(int(e) for e in bucket_edges)
        if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 1:
            raise ValueError(f"{cls}.bucket_edges must be increasing integers >= 1, "
                             f"got {bucket_edges!r}")
        self.bucket_edges = edges
        self.arms = (Arm(0),) + tuple(Arm(k, d) for d in range(len(names))
                                      for k in range(1, self.max_k + 1))

    def _rates(self, r: Any, field: str) -> tuple[float, ...]:
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

    # ---- the decision interface ------------------------------------------------------
    def start(self) -> Any:
        """Fresh per-replica state for one run (learned statistics live here)."""
        return None

    @abc.abstractmethod
    def choose(self, state: Any, ctx: StepContext) -> int:
        """Index into ``ctx.arms`` of the arm to play at this step."""

    def observe(self, state: Any, ctx: StepContext, arm: int, reward: float) -> None:
        """Told after the step: the arm actually played and its reward in ``[0, 1]``."""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(draft={list(self.drafts)!r}, "
                f"acceptance={self.acceptance!r}, max_k={self.max_k})")


class NeverSpeculate(SpeculationDecider):
    """Always ``Arm(0)``: plain decoding with the draft loaded (its memory is reserved)."""

    name = "never"

    def __init__(self, draft: str | Sequence[str] = DEFAULT_DRAFT, acceptance: Any = 0.6,
                 **kw: Any) -> None:
        kw.setdefault("max_k", 0)
        super().__init__(draft, acceptance, **kw)

    def choose(self, state: Any, ctx: StepContext) -> int:
        return 0


class FixedSpeculation(SpeculationDecider):
    """Always ``k`` draft tokens from draft model ``draft_index`` ("always k")."""

    name = "fixed"

    def __init__(self, k: int = 4, draft: str | Sequence[str] = DEFAULT_DRAFT,
                 acceptance: Any = 0.6, draft_index: int = 0, **kw: Any) -> None:
        self.k = check_k(k, "FixedSpeculation.k")
        kw.setdefault("max_k", self.k)
        super().__init__(draft, acceptance, **kw)
        if self.k > self.max_k:
            raise ValueError(f"FixedSpeculation.k={self.k} exceeds max_k={self.max_k}")
        if not 0 <= draft_index < len(self.drafts):
            raise ValueError(f"FixedSpeculation.draft_index must be in [0, {len(self.drafts)})"
                             f", got {draft_index!r}")
        self.draft_index = int(draft_index)
        self.name = f"fixed-k{self.k}"

    def choose(self, state: Any, ctx: StepContext) -> int:
        return self.arm_index(self.k, self.draft_index)


class UCBSpeculation(SpeculationDecider):
    """UCB1 over the arms, run independently per context and per replica.

    The reward of a step is ``min(1, tokens / time_s / U)`` (eq. (10)): emitted tokens of
    the whole batch over the step's seconds, normalized by the context's bound ``U``. The
    regret bound of ``proofs/speculation-ucb-regret.md`` assumes stationary contexts,
    which the simulator's batches are not (see the proof's note), so no claim is declared.
    """

    name = "ucb"
    learns = True

    def start(self) -> SpeculationBandit:
        return SpeculationBandit(len(self.arms))

    def choose(self, state: SpeculationBandit, ctx: StepContext) -> int:
        return state.select(ctx.key)

    def observe(self, state: SpeculationBandit, ctx: StepContext, arm: int,
                reward: float) -> None:
        state.update(ctx.key, arm, reward)


class AcceptanceUCBSpeculation(SpeculationDecider):
    """Optimistic acceptance rates per (tenant, draft), plugged into the step's tokens/s.

    Learns each request class's per-token acceptance rate from every drafted token
    (:class:`lpserve.acceptance.AcceptanceUCB`: empirical rate plus
    ``sqrt(2 ln t / n)``), and plays ``argmax_j sum_i E[tokens](a~_i, k_j) / time_s(j)``
    over the batch, as the oracle does with the true rates (eq. (11)). One estimate per
    class serves every batch size and every ``k``, so it learns far faster than UCB1 per
    (context, arm). The regret bound of ``proofs/speculation-acceptance-ucb.md`` assumes a
    stationary single-class context, which the simulator's batches are not, so no claim is
    declared here; the property test checks the bound in the stationary environment.
    """

    name = "acceptance-ucb"
    learns = True

    def start(self) -> Any:
        from lpserve.acceptance import AcceptanceUCB

        return AcceptanceUCB()

    def choose(self, state: Any, ctx: StepContext) -> int:
        from lpserve.speculation import expected_tokens

        tenants = ctx.tenant.tolist()
        best, best_v = 0, -np.inf
        for j, arm in enumerate(ctx.arms):
            d = max(arm.draft, 0)
            a = np.array([state.rate((t, d)) for t in tenants])
            v = float(np.sum(expected_tokens(a, arm.k))) / ctx.time_s(j)
            if v > best_v:
                best, best_v = j, v
        return best

    def observe(self, state: Any, ctx: StepContext, arm: int, reward: float) -> None:
        d = max(ctx.arms[arm].draft, 0)
        state.observe([(t, d) for t in ctx.tenant.tolist()], ctx.k, ctx.accepted)


class OracleSpeculation(SpeculationDecider):
    """Clairvoyant: the arm maximizing expected tokens/s of the step with the true rates.

    ``argmax_j sum_i E[tokens](a_i, k_j) / time_s(j)`` over the batch's sequences ``i``
    (eq. (11); ties toward the smaller arm index). It knows the acceptance rates, not the
    draws, and ignores that a request near its end keeps fewer tokens.
    """

    name = "oracle"
    meta = Meta(engines=("lpserve",), clairvoyant=True)

    def choose(self, state: Any, ctx: StepContext) -> int:
        from lpserve.speculation import expected_tokens

        best, best_v = 0, -np.inf
        for j, arm in enumerate(ctx.arms):
            a = ctx.rates[:, max(arm.draft, 0)]
            v = float(np.sum(expected_tokens(a, arm.k))) / ctx.time_s(j)
            if v > best_v:
                best, best_v = j, v
        return best


_DECIDERS = {"never": NeverSpeculate, "fixed": FixedSpeculation, "ucb": UCBSpeculation,
             "acceptance-ucb": AcceptanceUCBSpeculation, "oracle": OracleSpeculation}


def speculative(kind: str, name: str):
    """Registry factory: a baseline engine (``vllm`` by default) with a speculation decider.

    The factory takes ``draft`` (default :data:`DEFAULT_DRAFT`), ``acceptance`` (0.6),
    ``max_k`` (4; for ``fixed`` the default is ``k``), ``k`` (``fixed`` only, default 2),
    ``engine`` (a name of :data:`lpserve.policies.baselines.ENGINE_DEFAULTS`) and any
    :func:`lpserve.policies.baselines.engine_policy` parameter.
    """
    if kind not in _DECIDERS:
        raise KeyError(f"unknown speculation decider {kind!r}; known: {sorted(_DECIDERS)}")

    def factory(draft: str | Sequence[str] = DEFAULT_DRAFT, acceptance: Any = 0.6,
                max_k: int | None = None, engine: str = "vllm", k: int | None = None,
                **params: Any) -> Any:
        from lpserve.policies.baselines import engine_policy

        kw: dict[str, Any] = {} if max_k is None else {"max_k": max_k}
        if kind == "fixed":
            dec = FixedSpeculation(2 if k is None else k, draft, acceptance, **kw)
        else:
            if k is not None:
                raise ValueError(f"{name}: k is a parameter of spec-fixed only, got k={k!r}")
            if kind != "never":
                kw.setdefault("max_k", 4)
            dec = _DECIDERS[kind](draft=draft, acceptance=acceptance, **kw)
        params.setdefault("name", name)
        return engine_policy(engine, speculation=dec, **params)

    factory.__name__ = f"spec_{kind}"
    return factory
