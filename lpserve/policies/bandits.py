"""Bandit learners for speculative decoding and their regret bounds (numpy only).

- :class:`SpeculationBandit`: UCB1 per context (request class, batch-size bucket) over the
  finite arm set ``{0..K}`` (x draft models), with the baseline :class:`FixedArm`
  ("always k"; "never" is ``k = 0``); :func:`ucb1_regret_bound` is the bound of
  ``proofs/speculation-ucb-regret.md``;
- :class:`AcceptanceUCB`: one optimistic estimate of the per-token acceptance rate per
  (request class, draft model), learned from every drafted token, plugged into the
  expected tokens/s of each arm (``models/speculative-decoding.md`` (12));
  :func:`acceptance_ucb_bound` is the bound of ``proofs/speculation-acceptance-ucb.md``;
- :func:`simulate_bandit` and :func:`simulate_acceptance_ucb`: a seeded stationary
  environment that draws per-token acceptances and reports the cumulative pseudo-regret
  against :func:`lpserve.cost.speculation.optimal_k`.

The speculation deciders that run these learners inside the simulator are in
:mod:`lpserve.policies.speculation`; the step arithmetic is :mod:`lpserve.cost.speculation`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import numpy as np

from lpserve.cost.speculation import (
    Arm,
    SpeculationCost,
    batch_bucket,
    check_batch_size,
    check_k,
    expected_tokens,
    rates_per_draft,
    sample_tokens,
    uniform_contexts,
)

__all__ = ["A_MAX", "AcceptanceRun", "AcceptanceUCB", "BanditRun", "FixedArm",
           "SpeculationBandit", "acceptance_ucb_bound", "arm_means", "simulate_acceptance_ucb",
           "simulate_bandit", "stationary_environment", "ucb1_regret_bound"]


class SpeculationBandit:
    """UCB1 (Auer, Cesa-Bianchi, Fischer 2002) run independently in every context.

    A context is any hashable, here ``(request class, batch-size bucket)``; arms are the
    indices ``0..n_arms-1`` of :meth:`SpeculationCost.arms`. Rewards must lie in [0, 1]
    (normalized tokens/s). In context ``x`` with ``n_x`` plays so far, each arm is played
    once, then the arm maximizing ``mean_i + sqrt(2 ln n_x / n_i)`` (ties: lowest index).
    """

    name = "ucb1"

    def __init__(self, n_arms: int) -> None:
        if isinstance(n_arms, bool) or not isinstance(n_arms, (int, np.integer)) or n_arms < 1:
            raise ValueError(f"n_arms must be an integer >= 1, got {n_arms!r}")
        self.n_arms = int(n_arms)
        self._counts: dict[Hashable, np.ndarray] = {}
        self._sums: dict[Hashable, np.ndarray] = {}

    def _stats(self, context: Hashable) -> tuple[np.ndarray, np.ndarray]:
        if context not in self._counts:
            self._counts[context] = np.zeros(self.n_arms, dtype=np.int64)
            self._sums[context] = np.zeros(self.n_arms)
        return self._counts[context], self._sums[context]

    def select(self, context: Hashable) -> int:
        """The arm index to play in ``context``."""
        n, s = self._stats(context)
        unplayed = np.flatnonzero(n == 0)
        if unplayed.size:
            return int(unplayed[0])
        index = s / n + np.sqrt(2.0 * math.log(n.sum()) / n)
        return int(np.argmax(index))

    def update(self, context: Hashable, arm: int, reward: float) -> None:
        """Record a reward in [0, 1] for ``arm`` in ``context`` (ValueError otherwise)."""
        if not 0.0 <= reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {reward!r}")
        if not 0 <= arm < self.n_arms:
            raise ValueError(f"arm must be in [0, {self.n_arms}), got {arm!r}")
        n, s = self._stats(context)
        n[arm] += 1
        s[arm] += reward

    def counts(self, context: Hashable) -> np.ndarray:
        """Plays of each arm in ``context`` so far (a copy)."""
        return self._stats(context)[0].copy()


class FixedArm:
    """Baseline learner that always plays one arm ("always k"; arm 0 is "never speculate")."""

    def __init__(self, arm: int, name: str | None = None) -> None:
        self.arm = check_k(arm, "arm")
        self.name = name or ("never" if self.arm == 0 else f"always-arm{self.arm}")

    def select(self, context: Hashable) -> int:
        """The fixed arm, whatever the context."""
        return self.arm

    def update(self, context: Hashable, arm: int, reward: float) -> None:
        """Nothing to learn."""


# ---- environment and regret ---------------------------------------------------------
@dataclass
class BanditRun:
    """Result of :func:`simulate_bandit`.

    Attributes:
        regret: cumulative pseudo-regret after each play (normalized reward units),
            shape ``(n,)``: sum over plays of ``mu*(x_t) - mu(x_t, arm_t)``.
        bound: the UCB1 bound of ``proofs/speculation-ucb-regret.md`` at ``n`` plays,
            summed over contexts (from the true gaps and each context's play count).
        arms: arm index played at each step, shape ``(n,)``.
        contexts: context index of each step, shape ``(n,)``.
        means: true mean normalized reward, shape ``(n_contexts, n_arms)``.
        reward_bound: tokens/s normalizer of each context, shape ``(n_contexts,)``.
        tokens: tokens emitted at each step, shape ``(n,)``.
        time_s: seconds of each step, shape ``(n,)``.
    """

    regret: np.ndarray
    bound: float
    arms: np.ndarray
    contexts: np.ndarray
    means: np.ndarray
    reward_bound: np.ndarray
    tokens: np.ndarray
    time_s: np.ndarray
    arm_set: tuple[Arm, ...] = field(default=())

    @property
    def gaps(self) -> np.ndarray:
        """True gaps ``mu*(x) - mu(x, arm)``, shape ``(n_contexts, n_arms)``."""
        return self.means.max(axis=1, keepdims=True) - self.means

    def bound_at(self, m: int) -> float:
        """The UCB1 bound after the first ``m`` plays, summed over contexts."""
        if not 1 <= m <= self.regret.size:
            raise ValueError(f"m must be in [1, {self.regret.size}], got {m!r}")
        plays = np.bincount(self.contexts[:m], minlength=self.means.shape[0])
        g = self.gaps
        return sum(ucb1_regret_bound(g[i], int(plays[i])) for i in range(g.shape[0]))


def arm_means(cost: SpeculationCost, acceptance: Any, batch_size: int, max_k: int,
              context_tokens: int = 512) -> np.ndarray:
    """True mean normalized reward of each arm of ``cost.arms(max_k)`` (dimensionless).

    ``mu(arm) = b E[tokens](a, k) / T(arm) / U`` with ``U = max_arm b (k + 1) / T(arm)``
    (the tokens/s of a step that accepts every draft), as in :func:`simulate_bandit`.
    """
    arm_set = cost.arms(max_k)
    rates = rates_per_draft(cost, acceptance)
    b = check_batch_size(batch_size)
    times = cost.step_times_s(arm_set, uniform_contexts(b, context_tokens))
    ks = np.array([a.k for a in arm_set])
    upper = (b * (ks + 1) / times).max()
    tok = np.array([expected_tokens(rates[max(a.draft, 0)], a.k) for a in arm_set])
    return b * tok / times / upper


def ucb1_regret_bound(gaps: Any, n: int) -> float:
    """Auer et al. 2002, Theorem 1: ``sum_{D_i>0} 8 ln n / D_i + (1 + pi^2/3) sum D_i``.

    ``gaps`` are the true gaps ``D_i = mu* - mu_i >= 0`` of one context (normalized reward
    units); ``n`` the plays in that context. Returns 0 for ``n = 0``.
    """
    g = np.asarray(gaps, dtype=np.float64)
    if (g < -1e-12).any():
        raise ValueError(f"gaps must be >= 0, got {float(g[g < -1e-12][0])!r}")
    if n <= 0:
        return 0.0
    pos = g[g > 1e-15]
    return float((8.0 * math.log(n) / pos).sum() + (1.0 + math.pi ** 2 / 3.0) * pos.sum())


def stationary_environment(cost: SpeculationCost, contexts: Sequence[tuple[Any, int]],
                           acceptance: dict[Any, Any], n: int, max_k: int,
                           context_probs: Sequence[float] | None, context_tokens: int
                           ) -> tuple[tuple[Arm, ...], np.ndarray, np.ndarray, list[int],
                                      np.ndarray]:
    """Checked inputs of a stationary speculation environment: the arm set, the context
    probabilities ``(n_ctx,)``, the rates ``(n_ctx, n_drafts)``, the batch sizes and the
    step times ``(n_ctx, n_arms)`` (s). ValueErrors name the bad argument."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    arm_set = cost.arms(max_k)
    n_ctx = len(contexts)
    if n_ctx == 0:
        raise ValueError("contexts must not be empty")
    missing = [c for c, _ in contexts if c not in acceptance]
    if missing:
        raise ValueError(f"no acceptance rate for request class {missing[0]!r}")
    probs = (np.full(n_ctx, 1.0 / n_ctx) if context_probs is None
             else np.asarray(context_probs, dtype=np.float64))
    if probs.shape != (n_ctx,) or (probs < 0).any() or not math.isclose(probs.sum(), 1.0):
        raise ValueError(f"context_probs must be {n_ctx} non-negative numbers summing to 1, "
                         f"got {context_probs!r}")
    rates = np.array([rates_per_draft(cost, acceptance[c]) for c, _ in contexts])
    sizes = [check_batch_size(b) for _, b in contexts]
    times = np.array([cost.step_times_s(arm_set, uniform_contexts(b, context_tokens))
                      for b in sizes])
    return arm_set, probs, rates, sizes, times


def simulate_bandit(cost: SpeculationCost, policy: Any, contexts: Sequence[tuple[Any, int]],
                    acceptance: dict[Any, Any], n: int, max_k: int, seed: int,
                    context_probs: Sequence[float] | None = None,
                    context_tokens: int = 512) -> BanditRun:
    """Run ``policy`` for ``n`` speculative steps in a stationary environment (seeded).

    Each step draws a context ``(class, batch_size)`` from ``contexts`` (probabilities
    ``context_probs``, uniform by default); the policy sees ``(class, batch_bucket(b))``
    and picks an arm; the step then draws per-token Bernoulli acceptances with the
    class's true rate (:func:`sample_tokens`) and the policy is told the normalized reward
    ``tokens / T(arm) / U`` where ``U = max_arm b (k + 1) / T(arm)`` is the tokens/s of
    a step that accepts every draft, a bound known without the rates. Rewards are thus
    in [0, 1] and i.i.d. per (context, arm), as UCB1 requires.

    Args:
        cost: the speculation cost model.
        policy: an object with ``select(context) -> arm`` and ``update(context, arm, r)``.
        contexts: distinct ``(request class, batch size)`` pairs.
        acceptance: class -> acceptance rate in [0, 1) (float, or one per draft).
        n: number of steps.
        max_k: the largest k (the arm set is ``cost.arms(max_k)``).
        seed: seed of the numpy Generator (the only randomness).
        context_probs: probability of each context (sums to 1).
        context_tokens: context length (tokens) of every sequence.
    """
    arm_set, probs, rates, sizes, times = stationary_environment(
        cost, contexts, acceptance, n, max_k, context_probs, context_tokens)
    n_ctx = len(contexts)
    keys = [(c, batch_bucket(b)) for c, b in contexts]
    if len(set(keys)) != n_ctx:
        raise ValueError("two contexts fall into the same (class, batch bucket)")
    ks = np.array([a.k for a in arm_set])
    drafts = np.array([max(a.draft, 0) for a in arm_set])
    upper = np.array([(b * (ks + 1) / times[i]).max() for i, b in enumerate(sizes)])
    means = np.array([[sizes[i] * expected_tokens(rates[i, drafts[j]], ks[j])
                       / times[i, j] / upper[i] for j in range(len(arm_set))]
                      for i in range(n_ctx)])
    gaps = means.max(axis=1, keepdims=True) - means
    rng = np.random.default_rng(seed)
    ctx_idx = rng.choice(n_ctx, size=n, p=probs)
    played = np.empty(n, dtype=np.int64)
    tokens = np.empty(n, dtype=np.int64)
    for t in range(n):
        i = ctx_idx[t]
        j = int(policy.select(keys[i]))
        played[t] = j
        tok = sample_tokens(rng, rates[i, drafts[j]], int(ks[j]), sizes[i])
        tokens[t] = tok
        policy.update(keys[i], j, min(1.0, tok / times[i, j] / upper[i]))
    regret = np.cumsum(gaps[ctx_idx, played])
    plays = np.bincount(ctx_idx, minlength=n_ctx)
    bound = sum(ucb1_regret_bound(gaps[i], int(plays[i])) for i in range(n_ctx))
    return BanditRun(regret=regret, bound=float(bound), arms=played, contexts=ctx_idx, means=means,
                     reward_bound=upper, tokens=tokens, time_s=times[ctx_idx, played],
                     arm_set=arm_set)


# ---- acceptance-rate learning ---------------------------------------------------------
A_MAX = 1.0 - 1e-6  # the largest acceptance rate an optimistic estimate may take


class AcceptanceUCB:
    """Optimistic estimates of per-token acceptance rates, one per (request class, draft).

    Structured alternative to :class:`SpeculationBandit`: every drafted token is a
    Bernoulli(``a``) trial of its class's rate, whichever arm drew it, so one estimate per
    class serves every batch size and every ``k``. After ``n`` trials with ``s``
    acceptances, at step ``t`` (1-based), the optimistic rate is
    ``min(A_MAX, s / n + sqrt(2 ln t / n))`` (``A_MAX`` before any trial). A decider plugs
    the optimistic rates into the expected tokens/s of each arm and plays the best
    (``proofs/speculation-acceptance-ucb.md``). Plain steps (``k = 0``) teach nothing.
    """

    name = "acceptance-ucb"

    def __init__(self) -> None:
        self.steps = 0
        self._trials: dict[Hashable, list[int]] = {}  # key -> [acceptances, trials]

    def rate(self, key: Hashable) -> float:
        """The optimistic acceptance rate of ``key`` (a ``(class, draft)`` pair)."""
        s, n = self._trials.get(key, (0, 0))
        if n == 0:
            return A_MAX
        t = self.steps + 1  # the step about to be played (1-based)
        return min(A_MAX, s / n + math.sqrt(2.0 * math.log(max(t, 2)) / n))

    def trials(self, key: Hashable) -> int:
        """Drafted tokens of ``key`` whose acceptance was observed so far."""
        return self._trials.get(key, (0, 0))[1]

    def observe(self, keys: Sequence[Hashable], k: int, accepted: Any) -> None:
        """Record one step: sequence ``i`` of class-draft ``keys[i]`` drew ``k`` drafts and
        accepted the leading ``accepted[i]`` (``0 <= accepted[i] <= k``). The trials are
        the accepted drafts plus the first rejected one, if any."""
        k = check_k(k)
        acc = np.asarray(accepted, np.int64)
        if acc.shape != (len(keys),) or (acc < 0).any() or (acc > k).any():
            raise ValueError(f"accepted must be {len(keys)} integers in [0, {k}], got {accepted!r}")
        self.steps += 1
        if k == 0:
            return
        for key, a in zip(keys, acc.tolist()):
            st = self._trials.setdefault(key, [0, 0])
            st[0] += a
            st[1] += a + (1 if a < k else 0)


def acceptance_ucb_bound(gaps: Any, eps: Any, n: int, batch_size: int, max_k: int) -> float:
    """``proofs/speculation-acceptance-ucb.md``: expected regret after ``n`` steps,
    ``sum_{x, j} D_j(x) (8 ln n / eps_j(x)^2 + 1) + (1 + 2 B K) sum_x max_j D_j(x)``.

    ``gaps[x, j] = D_j(x) >= 0`` are the true gaps of arm ``j`` in context ``x`` (any
    reward unit: the bound is in the same unit); ``eps[x, j]`` the smallest over-estimate
    of the arm's acceptance rate that makes it look best (``inf``: never); ``B`` the
    largest batch and ``K`` the largest ``k``. Pass counts-only gaps (1 where suboptimal)
    to bound the number of suboptimal steps.
    """
    g = np.atleast_2d(np.asarray(gaps, dtype=np.float64))
    e = np.atleast_2d(np.asarray(eps, dtype=np.float64))
    if g.shape != e.shape:
        raise ValueError(f"gaps {g.shape} and eps {e.shape} must have the same shape")
    if (g < -1e-12).any() or (e <= 0).any() or np.isnan(e).any():
        raise ValueError("gaps must be >= 0 and eps > 0")
    if n < 1:
        return 0.0
    sub = (g > 0) & np.isfinite(e)
    head = float((g[sub] * (8.0 * math.log(n) / e[sub] ** 2 + 1.0)).sum())
    return head + (1.0 + 2.0 * int(batch_size) * int(max_k)) * float(g.max(axis=1).sum())


@dataclass
class AcceptanceRun:
    """Result of :func:`simulate_acceptance_ucb`.

    Attributes:
        regret: cumulative pseudo-regret after each step (tokens/s below the context's
            best arm, summed), shape ``(n,)``.
        arms: arm index played at each step, shape ``(n,)``.
        contexts: context index of each step, shape ``(n,)``.
        means: true tokens/s of each arm per context, shape ``(n_contexts, n_arms)``.
        eps: the margin of each arm per context, shape ``(n_contexts, n_arms)`` (``inf``
            where the arm is optimal or can never look best).
        max_batch: the largest batch size ``B``; max_k: the largest ``k``.
    """

    regret: np.ndarray
    arms: np.ndarray
    contexts: np.ndarray
    means: np.ndarray
    eps: np.ndarray
    max_batch: int
    max_k: int

    @property
    def gaps(self) -> np.ndarray:
        """True gaps (tokens/s), shape ``(n_contexts, n_arms)``."""
        return self.means.max(axis=1, keepdims=True) - self.means

    def bound_at(self, m: int, counts: bool = False) -> float:
        """The proved bound after the first ``m`` steps: on the regret (tokens/s), or with
        ``counts`` on the number of suboptimal steps."""
        if not 1 <= m <= self.regret.size:
            raise ValueError(f"m must be in [1, {self.regret.size}], got {m!r}")
        seen = np.bincount(self.contexts[:m], minlength=self.means.shape[0]) > 0
        g = self.gaps[seen]
        if counts:
            g = (g > 0).astype(np.float64)
        return acceptance_ucb_bound(g, self.eps[seen], m, self.max_batch, self.max_k)

    def suboptimal_steps(self, m: int) -> int:
        """Steps among the first ``m`` whose arm is not the context's best."""
        return int((self.gaps[self.contexts[:m], self.arms[:m]] > 0).sum())


def _margin(f_target: float, b: int, k: int, t_s: float, a: float) -> float:
    """Smallest ``e > 0`` with ``b E(a + e, k) / t_s >= f_target`` (``inf`` if none below
    ``A_MAX``), by bisection (``E`` increases in ``a`` for ``k >= 1``)."""
    def f(x: float) -> float:
        return b * float(expected_tokens(x, k)) / t_s

    if k == 0 or f(A_MAX) < f_target:
        return math.inf
    lo, hi = a, A_MAX
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if f(mid) >= f_target else (mid, hi)
    return max(hi - a, 1e-12)


def simulate_acceptance_ucb(cost: SpeculationCost, contexts: Sequence[tuple[Any, int]],
                            acceptance: dict[Any, Any], n: int, max_k: int, seed: int,
                            context_probs: Sequence[float] | None = None,
                            context_tokens: int = 512) -> AcceptanceRun:
    """Run the optimistic acceptance-rate rule for ``n`` steps in the stationary
    environment of :func:`simulate_bandit` (same contexts, times and per-token draws).

    Each step: context ``(class, batch size b)``; the rule plays
    ``argmax_j b E[tokens](a~, k_j) / T_j`` with ``a~`` the optimistic rate of
    ``(class, draft_j)`` (:class:`AcceptanceUCB`, ties to the smaller index); the step
    draws the per-sequence accepted drafts and the learner records them. Suboptimal steps
    (true tokens/s below the context's best) and the regret go beside the bound of
    ``proofs/speculation-acceptance-ucb.md`` (:meth:`AcceptanceRun.bound_at`).
    """
    arm_set, probs, rates, sizes, times = stationary_environment(
        cost, contexts, acceptance, n, max_k, context_probs, context_tokens)
    n_ctx = len(contexts)
    ks = [a.k for a in arm_set]
    drafts = [max(a.draft, 0) for a in arm_set]
    means = np.array([[sizes[i] * float(expected_tokens(rates[i, drafts[j]], ks[j]))
                       / times[i, j] for j in range(len(arm_set))] for i in range(n_ctx)])
    best = means.max(axis=1)
    means = np.where(means >= best[:, None] * (1 - 1e-12), best[:, None], means)  # ties
    eps = np.full(means.shape, math.inf)
    for i, (c, b) in enumerate(contexts):
        for j in range(len(arm_set)):
            if means[i, j] < best[i]:
                eps[i, j] = _margin(best[i], b, ks[j], times[i, j], rates[i, drafts[j]])
    learner = AcceptanceUCB()
    rng = np.random.default_rng(seed)
    ctx_idx = rng.choice(n_ctx, size=n, p=probs)
    played = np.empty(n, dtype=np.int64)
    for t in range(n):
        i = int(ctx_idx[t])
        c, b = contexts[i]
        opt = [b * float(expected_tokens(learner.rate((c, drafts[j])), ks[j])) / times[i, j]
               for j in range(len(arm_set))]
        j = int(np.argmax(opt))
        played[t] = j
        k, d = ks[j], drafts[j]
        if k:
            acc = rng.random((b, k)) < rates[i, d]
            accepted = np.cumprod(acc, axis=1).sum(axis=1)
        else:
            accepted = np.zeros(b, np.int64)
        learner.observe([(c, d)] * b, k, accepted)
    regret = np.cumsum(best[ctx_idx] - means[ctx_idx, played])
    return AcceptanceRun(regret=regret, arms=played, contexts=ctx_idx, means=means, eps=eps,
                         max_batch=max(sizes), max_k=int(max_k))
