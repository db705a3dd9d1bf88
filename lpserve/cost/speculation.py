"""Speculative decoding arithmetic: step time, expected tokens and the offline optimum.

Speculative decoding (Leviathan, Kalman, Matias, "Fast Inference from Transformers via
Speculative Decoding", ICML 2023) lets a small *draft* model propose ``k`` tokens one at a
time; the *target* model then checks all of them in a single forward pass over ``k + 1``
positions per sequence and keeps the longest accepted prefix plus one token of its own.

- :class:`SpeculationCost` / :func:`speculation_cost`: the time (s) of one speculative
  step for a decode batch, priced by the calibrated cost model
  (:meth:`lpserve.cost.CostModel.batch_time_s`), and the expected tokens per step under
  an i.i.d. per-token acceptance rate (:func:`expected_tokens`);
- :func:`optimal_k`: the offline optimum (exact enumeration over ``k in {0..K}`` and the
  draft models) for known acceptance rates, the regret reference of the learners in
  :mod:`lpserve.policies.bandits`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = ["DEFAULT_BUCKET_EDGES", "Arm", "SpeculationCost", "batch_bucket",
           "check_acceptance", "check_batch_size", "check_k", "expected_tokens", "optimal_k",
           "rates_per_draft", "sample_tokens", "speculation_cost", "uniform_contexts"]

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


def check_batch_size(b: Any) -> int:
    """``b`` as an int >= 1 (sequences in a decode batch), or a ValueError naming it."""
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


def uniform_contexts(batch_size: int, context_tokens: int) -> np.ndarray:
    """``(batch_size,)`` int64 contexts, every sequence at ``context_tokens`` tokens."""
    return np.full(check_batch_size(batch_size), int(context_tokens), dtype=np.int64)


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
    rates = rates_per_draft(cost, acceptance)
    c = uniform_contexts(batch_size, context_tokens)
    best, best_v = Arm(0), -math.inf
    for arm in cost.arms(max_k):
        a = rates[max(arm.draft, 0)]
        v = cost.tokens_per_s(a, arm.k, c, max(arm.draft, 0))
        if v > best_v:
            best, best_v = arm, v
    return best, best_v


def rates_per_draft(cost: SpeculationCost, acceptance: Any) -> np.ndarray:
    """One checked acceptance rate per draft model of ``cost`` (float64 ``(n_drafts,)``)."""
    a = check_acceptance(acceptance).reshape(-1)
    if a.size == 1:
        a = np.repeat(a, len(cost.drafts))
    if a.size != len(cost.drafts):
        raise ValueError(f"acceptance has {a.size} rates but there are {len(cost.drafts)} drafts")
    return a


def batch_bucket(batch_size: int, edges: Sequence[int] = DEFAULT_BUCKET_EDGES) -> int:
    """Index of the batch-size bucket: the first ``i`` with ``batch_size <= edges[i]``."""
    b = check_batch_size(batch_size)
    i = int(np.searchsorted(np.asarray(edges), b, side="left"))
    return min(i, len(edges))
