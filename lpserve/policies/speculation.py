"""Speculation deciders: how many draft tokens a replica speculates at each decode step.

An :class:`~lpserve.policy.EngineConfig` with ``speculation=<decider>`` runs speculative
decoding inside the simulator (``lpserve/sim/speculative.py``, equations in
``models/speculative-decoding.md``). The decider names the draft model(s), holds the
per-token acceptance rate of each request class and chooses, before every pure-decode
step of a replica, one arm of :meth:`lpserve.cost.speculation.SpeculationCost.arms`: ``Arm(0)``
(plain decoding) or ``Arm(k, d)`` (``k`` draft tokens from draft model ``d``).

Acceptance rates (where they come from). Each request's class is its trace ``tenant``
(``-1`` when the trace has none). ``acceptance`` is either one rate for every class, or a
mapping ``{tenant: rate}`` that must cover every tenant of the trace; a rate is one float
(every draft) or one float per draft, each in ``[0, 1)``. Per-token acceptances are
i.i.d. Bernoulli(rate) given the earlier tokens of the same step (Leviathan et al., ICML
2023), drawn from a generator the simulator derives from the run's seed.

Deciders (the interface of :class:`~lpserve.policy.hooks.SpeculationDecider`:
``reset(cluster, rng)``, ``choose(ctx) -> arm index``, ``observe(ctx, result)``; learned
state is kept per replica, keyed by ``ctx.replica``, and cleared by ``reset``):

- :class:`NeverSpeculate` -- always ``Arm(0)``; the draft is still loaded (its weights
  and KV share reduce the KV capacity), so it isolates the memory cost.
- :class:`FixedSpeculation` -- always ``k`` drafts from draft 0 (``k <= max_k``).
- :class:`UCBSpeculation` -- UCB1 per context (:class:`lpserve.policies.bandits.SpeculationBandit`),
  context = (request class of the batch, batch-size bucket); reward = emitted tokens /
  step time / ``U`` where ``U`` bounds the tokens/s of any arm (eq. (10) of the model).
- :class:`OracleSpeculation` -- clairvoyant: knows every request's true acceptance rate
  and picks the arm maximizing expected tokens/s of this step (the per-step analogue of
  :func:`lpserve.cost.speculation.optimal_k`, eq. (11)).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from lpserve.cost.speculation import check_k, expected_tokens
from lpserve.policies.bandits import AcceptanceUCB, SpeculationBandit
from lpserve.policy import DEFAULT_DRAFT, Meta, SpeculationDecider, StepContext, StepResult

__all__ = ["AcceptanceUCBSpeculation", "FixedSpeculation", "NeverSpeculate",
           "OracleSpeculation", "UCBSpeculation", "speculative"]

class NeverSpeculate(SpeculationDecider):
    """Always ``Arm(0)``: plain decoding with the draft loaded (its memory is reserved)."""

    name = "never"

    def __init__(self, draft: str | Sequence[str] = DEFAULT_DRAFT, acceptance: Any = 0.6,
                 **kw: Any) -> None:
        kw.setdefault("max_k", 0)
        super().__init__(draft, acceptance, **kw)

    def kernel_spec(self) -> tuple[str, tuple[int, int]]:
        """``(kind, (k, draft))`` of this decider's compiled twin in the simulator."""
        return "never", (0, 0)

    def choose(self, ctx: StepContext) -> int:
        """0, ``Arm(0)``: no draft tokens at any step."""
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

    def kernel_spec(self) -> tuple[str, tuple[int, int]]:
        """``(kind, (k, draft))`` of this decider's compiled twin in the simulator."""
        return "fixed", (self.k, self.draft_index)

    def choose(self, ctx: StepContext) -> int:
        """The index of ``Arm(k, draft_index)`` at every step."""
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

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Drop every replica's bandit (they are created again on first use)."""
        self._bandits: dict[tuple[str, int], SpeculationBandit] = {}

    def _bandit(self, replica: tuple[str, int]) -> SpeculationBandit:
        b = self.__dict__.setdefault("_bandits", {}).get(replica)
        if b is None:
            b = self._bandits[replica] = SpeculationBandit(len(self.arms))
        return b

    def kernel_spec(self) -> tuple[str, tuple[int, int]]:
        """``(kind, (k, draft))`` of this decider's compiled twin in the simulator."""
        return "ucb", (0, 0)

    def choose(self, ctx: StepContext) -> int:
        """The UCB1 arm of ``ctx.key`` in this replica's bandit (each arm is tried once
        before the index is used)."""
        return self._bandit(ctx.replica).select(ctx.key)

    def observe(self, ctx: StepContext, result: StepResult) -> None:
        """Credit ``result.reward`` (in ``[0, 1]``) to ``result.arm`` in context ``ctx.key``
        of this replica's bandit."""
        self._bandit(ctx.replica).update(ctx.key, result.arm, result.reward)


class AcceptanceUCBSpeculation(SpeculationDecider):
    """Optimistic acceptance rates per (tenant, draft), plugged into the step's tokens/s.

    Learns each request class's per-token acceptance rate from every drafted token
    (:class:`lpserve.policies.bandits.AcceptanceUCB`: empirical rate plus
    ``sqrt(2 ln t / n)``), and plays ``argmax_j sum_i E[tokens](a~_i, k_j) / time_s(j)``
    over the batch, as the oracle does with the true rates (eq. (11)). One estimate per
    class serves every batch size and every ``k``, so it learns far faster than UCB1 per
    (context, arm). The regret bound of ``proofs/speculation-acceptance-ucb.md`` assumes a
    stationary single-class context, which the simulator's batches are not, so no claim is
    declared here; the property test checks the bound in the stationary environment.
    """

    name = "acceptance-ucb"
    learns = True

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Drop every replica's acceptance learner (created again on first use)."""
        self._learners: dict[tuple[str, int], AcceptanceUCB] = {}

    def _learner(self, replica: tuple[str, int]) -> AcceptanceUCB:
        a = self.__dict__.setdefault("_learners", {}).get(replica)
        if a is None:
            a = self._learners[replica] = AcceptanceUCB()
        return a

    def kernel_spec(self) -> tuple[str, tuple[int, int]]:
        """``(kind, (k, draft))`` of this decider's compiled twin in the simulator."""
        return "acceptance-ucb", (0, 0)

    def choose(self, ctx: StepContext) -> int:
        """The arm maximizing ``sum_i E[tokens](a~_i, k_j) / time_s(j)`` over the batch,
        with ``a~_i`` the optimistic acceptance rate of sequence ``i``'s (tenant, draft); ties
        toward the smaller arm index."""
        state = self._learner(ctx.replica)
        tenants = ctx.tenant.tolist()
        best, best_v = 0, -np.inf
        for j, arm in enumerate(ctx.arms):
            d = max(arm.draft, 0)
            a = np.array([state.rate((t, d)) for t in tenants])
            v = sum(expected_tokens(a, arm.k).tolist()) / ctx.time_s(j)  # left to right
            if v > best_v:
                best, best_v = j, v
        return best

    def observe(self, ctx: StepContext, result: StepResult) -> None:
        """Update each (tenant, draft) of the batch with its ``result.accepted`` drafts
        out of the ``result.k`` drawn (Bernoulli trials up to the first rejection)."""
        d = max(ctx.arms[result.arm].draft, 0)
        self._learner(ctx.replica).observe([(t, d) for t in ctx.tenant.tolist()], result.k,
                                           result.accepted)


class OracleSpeculation(SpeculationDecider):
    """Clairvoyant: the arm maximizing expected tokens/s of the step with the true rates.

    ``argmax_j sum_i E[tokens](a_i, k_j) / time_s(j)`` over the batch's sequences ``i``
    (eq. (11); ties toward the smaller arm index). It knows the acceptance rates, not the
    draws, and ignores that a request near its end keeps fewer tokens.
    """

    name = "oracle"
    meta = Meta(engines=("lpserve",), clairvoyant=True)

    def kernel_spec(self) -> tuple[str, tuple[int, int]]:
        """``(kind, (k, draft))`` of this decider's compiled twin in the simulator."""
        return "oracle", (0, 0)

    def choose(self, ctx: StepContext) -> int:
        """The arm maximizing expected tokens/s of this step with the true rates
        ``ctx.rates`` (``(batch_size, n_drafts)``); ties toward the smaller arm index."""
        best, best_v = 0, -np.inf
        for j, arm in enumerate(ctx.arms):
            a = ctx.rates[:, max(arm.draft, 0)]
            v = sum(expected_tokens(a, arm.k).tolist()) / ctx.time_s(j)  # left to right
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
                max_k: int | None = None, engine: str = "vllm-v0", k: int | None = None,
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
