"""Cost-based per-victim preemption: recompute, swap or compress-and-swap.

:class:`CostBasedDecider` applies the decision rule of models/kv-compression-swap.md (6) to
each victim, from the prices in its :class:`~lpserve.policy.hooks.PreemptionView` (the
cost model's recompute time (5), full swap time (1) and compressed swap time (4), out
plus in):

1. swap at full size (lossless) if the host has room for the victim's blocks, the swap
   takes at most ``swap_budget_s`` and is faster than recomputing;
2. otherwise compress-and-swap if the host has room for the compressed blocks, the
   victim's quality loss (``compression_accuracy_cost x context tokens``) is at most
   ``max_quality_loss`` and the compressed swap is faster than recomputing;
3. otherwise recompute.

So a full swap is preferred whenever it is allowed and pays off; compression steps in
when host memory is short or PCIe is too slow for a full swap (over the budget, or slower
than recompute). The chosen option never takes longer than recomputing and never needs
more host blocks than are free (proofs/kv-compress-decider.md).

:func:`vllm_compress_swap` and :func:`vllm_preempt_decider` register the rule on the
vLLM baseline engine (``vllm-compress-swap``: every swap compressed;
``vllm-preempt-decider``: this decider per victim).
"""
from __future__ import annotations

import math
from typing import Any

from lpserve.policy import Claim, Meta, Policy, PreemptionDecider, PreemptionView

#: what :class:`CostBasedDecider` guarantees (carried by ``vllm-preempt-decider``'s meta)
DECIDER_CLAIM = Claim(
    statement="the cost-based decider's choice never takes longer than recompute and never "
              "needs more host blocks than are free (models/kv-compression-swap.md (6))",
    proof="proofs/kv-compress-decider.md",
    test="tests/properties/test_kv_compress.py::test_decider_choice_is_safe_and_no_slower")


class CostBasedDecider(PreemptionDecider):
    """Rule (6) of models/kv-compression-swap.md (see the module docstring).

    Args:
        swap_budget_s: most seconds (out plus in) a full-size swap of one victim may take;
            ``inf`` (default) bounds it only by the recompute time.
        max_quality_loss: most quality loss (``compression_accuracy_cost x context
            tokens``) one compressed victim may cost; ``inf`` (default) accepts any.
    """

    name = "cost-based"

    def __init__(self, swap_budget_s: float = math.inf,
                 max_quality_loss: float = math.inf) -> None:
        for k, v in (("swap_budget_s", swap_budget_s), ("max_quality_loss", max_quality_loss)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
                raise ValueError(f"CostBasedDecider.{k} must be a number >= 0 (inf allowed), "
                                 f"got {v!r}")
        self.swap_budget_s = float(swap_budget_s)
        self.max_quality_loss = float(max_quality_loss)

    def kernel_spec(self) -> tuple[str, tuple[float, float]]:
        """``(kind, params)`` of this rule's compiled twin in the simulator."""
        return "cost-based", (self.swap_budget_s, self.max_quality_loss)

    def decide(self, view: PreemptionView) -> str:
        """models/kv-compression-swap.md (6)."""
        rec = view.recompute_s
        if view.swap_host_blocks <= view.host_free_blocks and \
                view.swap_s <= self.swap_budget_s and view.swap_s < rec:
            return "swap"
        if view.compress_host_blocks <= view.host_free_blocks and \
                view.quality_loss <= self.max_quality_loss and view.compress_swap_s < rec:
            return "compress-swap"
        return "recompute"


def vllm_compress_swap(**params: Any) -> Policy:
    """The ``vllm-v0`` engine (vLLM's V0 scheduler, which could swap; V1 only recomputes)
    with every preemption swapped compressed (recompute when the compressed KV does not
    fit in host memory)."""
    from lpserve.policies.baselines import engine_policy

    params.setdefault("name", "vllm-compress-swap")
    params.setdefault("preemption", "compress-swap")
    return _lpserve_only(engine_policy("vllm-v0", **params))


def vllm_preempt_decider(*, swap_budget_s: float = math.inf,
                         max_quality_loss: float = math.inf, **params: Any) -> Policy:
    """The ``vllm-v0`` engine with :class:`CostBasedDecider` choosing per victim."""
    from lpserve.policies.baselines import engine_policy

    params.setdefault("name", "vllm-preempt-decider")
    params.setdefault("preemption_decider", CostBasedDecider(swap_budget_s, max_quality_loss))
    return _lpserve_only(engine_policy("vllm-v0", **params), (DECIDER_CLAIM,))


def _lpserve_only(pol: Policy, claims: tuple[Claim, ...] = ()) -> Policy:
    """``pol`` marked as running in lpserve's simulator only (the vLLM and Vidur adapters
    have no compressed swap), with ``claims`` added to its meta."""
    m = pol.meta
    return pol.with_(meta=Meta(online=m.online, clairvoyant=m.clairvoyant,
                               stochastic=m.stochastic, engines=("lpserve",),
                               claims=m.claims + claims))
