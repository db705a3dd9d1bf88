"""Speculative decoding as a contextual bandit: cost model, offline optimum, UCB1 learner.

Speculative decoding (Leviathan, Kalman, Matias, "Fast Inference from Transformers via
Speculative Decoding", ICML 2023) lets a small *draft* model propose ``k`` tokens one at a
time; the *target* model then checks all of them in a single forward pass over ``k + 1``
positions per sequence and keeps the longest accepted prefix plus one token of its own.

This module (layer 1-2, numpy only) provides

- :class:`SpeculationCost` / :func:`speculation_cost`: the time (s) of one speculative
  step for a decode batch, priced by the calibrated cost model
  (:meth:`lpserve.cost.CostModel.batch_time_s`), and the expected tokens per step under
  an i.i.d. per-token acceptance rate (:func:`expected_tokens`);
- :func:`optimal_k`: the offline optimum (exact enumeration over ``k in {0..K}`` and the
  draft models) for known acceptance rates, used as the regret reference;
- :class:`SpeculationBandit`: UCB1 per context (request class, batch-size bucket) over the
  finite arm set ``{0..K}`` (x draft models), with the baselines :class:`FixedSpeculation`
  ("always k", and "never" = ``k = 0``);
- :func:`simulate_bandit`: a seeded stationary environment that draws per-token
  acceptances and reports the cumulative pseudo-regret against :func:`optimal_k`.

The regret guarantee is stated in ``proofs/speculation-ucb-regret.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import numpy as np

__all__ = [
    "Arm", "BanditRun", "FixedSpeculation", "arm_means", "SpeculationBandit", "SpeculationCost", "batch_bucket", "check_acceptance",
    "check_k", "expected_tokens", "optimal_k", "sample_tokens", "simulate_bandit",
    "speculation_cost", "ucb1_regret_bound",
]

#: Upper edges of the default batch-size buckets: bucket i holds sizes in (edge[i-1], edge[i]].
DEFAULT_BUCKET_EDGES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


# ---- input checks -------------------------------------------------------------------
def check_acceptance(a: Any, name: str = "acceptance rate") -> np.ndarray:
    """``a`` as a float64 array with every entry in ``[0, 1)``, or a ValueError naming it.

    ``a = 1`` is excluded: the expected-tokens formula divides by ``1 - a`` (and a draft
    that is never rejected makes ``k`` unbounded).
    """
    arr = np.asarray(a, dtype=np.float64)
    bad = arr[~np.isfinite(arr) | (arr < 0.0) | (arr >= 1.0)]
    if bad.size:
        raise ValueError(f"{name} must be in [0, 1), got {float(bad.flat[0])!r}")
    return arr


def check_k(k: Any, name: str = "k") -> int:
    """``k`` as a non-negative int (number of draft tokens), or a ValueError naming it."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= 0, got {k!r}")
    if k < 0:
        raise ValueError(f"{name} must be >= 0, got {k!r}")
    return int(k)


def _check_batch_size(b: Any) -> int:
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {b!r}")
    return int(b)


# ---- expected tokens ----------------------------------------------------------------
def expected_tokens(a: Any, k: Any) -> np.ndarray | float:
    """Expected tokens emitted per sequence by one speculative step with ``k`` drafts.

    With an i.i.d. per-token acceptance rate ``a`` (each draft token is accepted with
    probability ``a`` given all earlier ones were), the step emits the accepted prefix
    plus one target token, so

        E[tokens] = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

    (Leviathan, Kalman, Matias, ICML 2023, Eq. (1) / Theorem 3.8). ``k = 0`` gives 1
    (plain decoding). Units: tokens per sequence per step. Vectorized over ``a`` and ``k``.
    """
    a_arr = check_acceptance(a)
    k_arr = np.asarray(k)
    if k_arr.dtype == bool or not np.issubdtype(k_arr.dtype, np.integer):
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    if (k_arr < 0).any():
        raise ValueError(f"k must be >= 0, got {int(k_arr[k_arr < 0].flat[0])!r}")
    out = (1.0 - a_arr ** (k_arr + 1)) / (1.0 - a_arr)
    return float(out) if out.ndim == 0 else out


def sample_tokens(rng: np.random.Generator, a: float, k: int, batch_size: int) -> int:
    """Tokens emitted by one step for ``batch_size`` sequences, from per-token Bernoulli draws.

    Each sequence draws ``k`` Bernoulli(``a``) acceptances; it keeps the leading run of
    accepted drafts plus one target token. Returns the total over the batch (tokens).
    """
    if k == 0:
        return int(batch_size)
    acc = rng.random((batch_size, k)) < a
    return int(np.cumprod(acc, axis=1).sum()) + int(batch_size)


# ---- cost model ---------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    """One speculation choice: ``k`` draft tokens from draft model number ``draft``.

    ``k = 0`` means no speculation (``draft`` is then -1).
    """

    k: int
    draft: int = -1


class SpeculationCost:
    """Time of speculative steps of a target LLM with one or more draft LLMs on one replica.

    All models share the GPU and tensor-parallel degree (they are co-located on the same
    replica). One step with ``k >= 1`` drafts for a decode batch whose sequences have
    contexts ``c_j`` takes

        T(k) = sum_{i=0}^{k-1} draft.batch_time_s(decode_context = c + i)
               + target.batch_time_s(prefill_tokens = k + 1, prefill_cached = c)

    seconds: ``k`` sequential draft decode iterations, then one target verification that
    is priced as a prefill chunk of ``k + 1`` tokens on top of each context. ``k = 0`` is
    plain decoding: ``T(0) = target.batch_time_s(decode_context = c)``.

    Args:
        target: the target cost model (:class:`lpserve.cost.CostModel`).
        drafts: the draft cost models (same GPU and TP as the target).
    """

    def __init__(self, target: Any, drafts: Sequence[Any]) -> None:
        if not drafts:
            raise ValueError("at least one draft model is needed")
        for d in drafts:
            for attr in ("gpu", "tp"):
                if hasattr(target, attr) and getattr(d, attr, None) != getattr(target, attr):
                    raise ValueError(f"draft {getattr(d, 'llm', d)!r} has {attr}="
                                     f"{getattr(d, attr, None)!r} but the target has "
                                     f"{getattr(target, attr)!r}; both must share the replica")
        self.target = target
        self.drafts = tuple(drafts)

    @staticmethod
    def _contexts(decode_context: Any) -> np.ndarray:
        c = np.asarray(decode_context, dtype=np.int64).reshape(-1)
        if c.size == 0:
            raise ValueError("decode_context must hold at least one sequence")
        if (c < 0).any():
            raise ValueError(f"decode_context must be >= 0, got {int(c[c < 0][0])!r}")
        return c

    def _draft_index(self, draft: int) -> int:
        if isinstance(draft, bool) or not isinstance(draft, (int, np.integer)) \
                or not 0 <= draft < len(self.drafts):
            raise ValueError(f"draft must be an index in [0, {len(self.drafts)}), got {draft!r}")
        return int(draft)

    def step_time_s(self, k: int, decode_context: Any, draft: int = 0) -> float:
        """Seconds of one speculative step with ``k`` drafts for a batch with these contexts."""
        k = check_k(k)
        c = self._contexts(decode_context)
        if k == 0:
            return float(self.target.batch_time_s(decode_context=c))
        d = self.drafts[self._draft_index(draft)]
        t = sum(float(d.batch_time_s(decode_context=c + i)) for i in range(k))
        t += float(self.target.batch_time_s(prefill_tokens=np.full(c.size, k + 1),
                                            prefill_cached=c))
        return t

    def tokens_per_s(self, a: float, k: int, decode_context: Any, draft: int = 0) -> float:
        """Expected output tokens per second of the whole batch (tokens/s), rate ``a``."""
        c = self._contexts(decode_context)
        return c.size * float(expected_tokens(a, k)) / self.step_time_s(k, c, draft)

    def time_per_output_token_s(self, a: float, k: int, decode_context: Any,
                                draft: int = 0) -> float:
        """Expected seconds per output token of one sequence (step time / E[tokens])."""
        return self.step_time_s(k, decode_context, draft) / float(expected_tokens(a, k))

    def arms(self, max_k: int) -> tuple[Arm, ...]:
        """The finite arm set: ``Arm(0)`` then ``Arm(k, d)`` for every draft d and 1 <= k <= K."""
        max_k = check_k(max_k, "max_k")
        return (Arm(0),) + tuple(Arm(k, d) for d in range(len(self.drafts))
                                 for k in range(1, max_k + 1))

    def step_times_s(self, arms: Sequence[Arm], decode_context: Any) -> np.ndarray:
        """Step time (s) of each arm for this batch; shape ``(len(arms),)``."""
        return np.array([self.step_time_s(arm.k, decode_context, max(arm.draft, 0))
                         for arm in arms])

    def __repr__(self) -> str:
        return f"SpeculationCost(target={self.target!r}, drafts={list(self.drafts)!r})"


def speculation_cost(target: str = "llama-2-70b", draft: str | Sequence[str] = "llama-2-7b",
                     gpu: str = "a100-80gb", tp: int = 1) -> SpeculationCost:
    """A :class:`SpeculationCost` from catalog names (unknown names raise a KeyError)."""
    from lpserve.cost import cost_model

    names = [draft] if isinstance(draft, str) else list(draft)
    return SpeculationCost(cost_model(gpu=gpu, llm=target, tp=tp),
                           [cost_model(gpu=gpu, llm=n, tp=tp) for n in names])


def _contexts_for(batch_size: int, context_tokens: int) -> np.ndarray:
    return np.full(_check_batch_size(batch_size), int(context_tokens), dtype=np.int64)


# ---- offline optimum ----------------------------------------------------------------
def optimal_k(cost: SpeculationCost, acceptance: Any, batch_size: int, max_k: int,
              context_tokens: int = 512) -> tuple[Arm, float]:
    """The arm maximizing expected tokens/s for a known acceptance rate, by enumeration.

    Args:
        cost: the speculation cost model.
        acceptance: per-token acceptance rate in [0, 1): one float (every draft) or one
            per draft model.
        batch_size: sequences in the decode batch (all with ``context_tokens`` context).
        max_k: the largest number of drafts K considered (arms ``{0..K}`` x drafts).
        context_tokens: context length (tokens) of every sequence.

    Returns:
        ``(arm, tokens_per_s)`` with ties broken toward the earlier arm (smaller k).
    """
    rates = _rates_per_draft(cost, acceptance)
    c = _contexts_for(batch_size, context_tokens)
    best, best_v = Arm(0), -math.inf
    for arm in cost.arms(max_k):
        a = rates[max(arm.draft, 0)]
        v = cost.tokens_per_s(a, arm.k, c, max(arm.draft, 0))
        if v > best_v:
            best, best_v = arm, v
    return best, best_v


def _rates_per_draft(cost: SpeculationCost, acceptance: Any) -> np.ndarray:
    a = check_acceptance(acceptance).reshape(-1)
    if a.size == 1:
        a = np.repeat(a, len(cost.drafts))
    if a.size != len(cost.drafts):
        raise ValueError(f"acceptance has {a.size} rates but there are {len(cost.drafts)} drafts")
    return a


def batch_bucket(batch_size: int, edges: Sequence[int] = DEFAULT_BUCKET_EDGES) -> int:
    """Index of the batch-size bucket: the first ``i`` with ``batch_size <= edges[i]``."""
    b = _check_batch_size(batch_size)
    i = int(np.searchsorted(np.asarray(edges), b, side="left"))
    return min(i, len(edges))


# ---- learners -----------------------------------------------------------------------
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


class FixedSpeculation:
    """Baseline that always plays one arm ("always k"; arm 0 is "never speculate")."""

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
    rates = _rates_per_draft(cost, acceptance)
    b = _check_batch_size(batch_size)
    times = cost.step_times_s(arm_set, _contexts_for(b, context_tokens))
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
    rates = np.array([_rates_per_draft(cost, acceptance[c]) for c, _ in contexts])
    sizes = [_check_batch_size(b) for _, b in contexts]
    times = np.array([cost.step_times_s(arm_set, _contexts_for(b, context_tokens))
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
