"""The compiled replica's swap prices (``models/simulator.md`` (13)): every swap is priced
by the cost model's own method (its table grown before a step that could swap past it),
also for a cost model whose swap time is not affine in blocks, written by subclassing a
built-in one, and both engines agree."""
from __future__ import annotations

import numpy as np

import lpserve as lp
from lpserve.cost.analytic import AnalyticCost
from tests.strategies import preempting_instance


class CurvedSwap(AnalyticCost):
    """PCIe swaps that slow down with the size of the copy (not affine in blocks)."""

    def swap_time_s(self, n_blocks: int, block_tokens: int = 16) -> float:
        base = super().swap_time_s(n_blocks, block_tokens)
        return base * (1.0 + 0.01 * n_blocks)


def test_a_subclass_scalar_price_is_the_table():
    m = CurvedSwap(gpu="a100-80gb", llm="llama-2-7b", tp=1)
    k = np.arange(50)
    assert np.array_equal(m.swap_times_s(k, 16), [m.swap_time_s(int(x), 16) for x in k])
    plain = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b")
    assert np.array_equal(plain.swap_times_s(k, 16), [plain.swap_time_s(int(x), 16)
                                                      for x in k])


def test_compiled_equals_reference_with_a_curved_swap_price():
    swapped = 0
    for seed in range(3):
        base = preempting_instance(seed, host_memory_gb=64.0)
        inst = base.with_(cost=CurvedSwap(gpu="a100-80gb", llm="llama-2-7b", tp=1))
        pol = lp.make_policy("vllm-v0", preemption="swap")
        fast = lp.simulate(inst, pol, seed=0, check=True)
        ref = lp.simulate(inst, pol, seed=0, reference=True)
        assert fast.stats["engine"] == "compiled"
        assert fast.digest() == ref.digest(), seed
        swapped += int(fast.stats.get("swaps", 0) or fast.arrays["preemptions"].sum())
    assert swapped > 0  # the instances do swap
