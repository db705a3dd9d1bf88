"""Learning per-token acceptance rates for speculative decoding: optimistic estimates,
their regret bound, and a stationary environment to check it.

:class:`AcceptanceUCB` keeps one optimistic estimate per (request class, draft model),
learned from every drafted token; a decider plugs the estimates into the expected tokens/s
of each speculation arm (``models/speculative-decoding.md`` (12)) and plays the best.
:func:`acceptance_ucb_bound` is the bound of ``proofs/speculation-acceptance-ucb.md``;
:func:`simulate_acceptance_ucb` runs the rule in the stationary environment of
:func:`lpserve.speculation.simulate_bandit`. Numpy only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np

from lpserve.speculation import (SpeculationCost, check_k, expected_tokens,
                                 stationary_environment)

__all__ = ["A_MAX", "AcceptanceRun", "AcceptanceUCB", "acceptance_ucb_bound",
           "simulate_acceptance_ucb"]

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
