"""Compress-and-swap preemption: the equations of models/kv-compression-swap.md against the
cost model, the cost-based decider in clear-cut cases, and bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest

import lpserve as lp
from lpserve.cost.preemption import compressed_host_blocks, swap_one_way_s
from lpserve.policies.kvcompress import CostBasedDecider
from lpserve.policy import EngineConfig, PolicyError, PreemptionDecider, PreemptionView
from tests.strategies import preempting_instance


def test_quantize_time_is_a_memory_bound_pass_over_full_and_compressed_bytes():
    c = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b")
    # (3): n x b x KV bytes per token per GPU x (1 + 1/r) / (HBM peak x eff_kv)
    kv = 2 * 32 * 32 * 128 * 2  # layers x KV heads x head dim x fp16 bytes, x2 (K and V)
    want = 100 * 16 * kv * (1 + 1 / 4) / (2039e9 * c.values["eff_kv"])
    assert c.kv_quantize_time_s(100, 16, 4.0) == pytest.approx(want, rel=1e-12)
    assert c.kv_quantize_time_s(0, 16, 4.0) == 0.0
    # larger ratio writes fewer bytes; tp=2 halves each GPU's shard
    assert c.kv_quantize_time_s(100, 16, 8.0) < c.kv_quantize_time_s(100, 16, 2.0)
    c2 = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=2)
    assert c2.kv_quantize_time_s(100, 16) == pytest.approx(c.kv_quantize_time_s(100, 16) / 2)
    assert lp.UnitRoundCost(memory_tokens=100).kv_quantize_time_s(10, 1, 4.0) == 0.0


def test_swap_times_full_and_compressed():
    c = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", pcie_efficiency=0.5)
    full = c.swap_time_s(40, 16)
    # (1): 40 blocks x 16 tokens x 512 KiB over half of 32 GB/s one way
    assert full == pytest.approx(40 * 16 * 524288 / 16e9, rel=1e-12)
    assert swap_one_way_s(c, 40, 16, "swap", 4.0) == full
    # (4): compressed bytes over PCIe (exact, not rounded to blocks) plus the quantize pass
    comp = swap_one_way_s(c, 40, 16, "compress-swap", 4.0)
    assert comp == pytest.approx(full / 4 + c.kv_quantize_time_s(40, 16, 4.0), rel=1e-12)
    with pytest.raises(ValueError, match="mode"):
        swap_one_way_s(c, 40, 16, "recompute", 4.0)


def test_compressed_host_blocks_round_up_per_request():
    assert compressed_host_blocks(0, 4.0) == 0
    assert compressed_host_blocks(1, 4.0) == 1
    assert compressed_host_blocks(8, 4.0) == 2
    assert compressed_host_blocks(9, 4.0) == 3
    assert compressed_host_blocks(3, 1.5) == 2  # exact quotient is not rounded up
    assert compressed_host_blocks(7, 2.0) == 4


def _view(**kw):
    base = dict(now_s=0.0, replica=0, request=0, context_tokens=1000, held_blocks=63,
                block_tokens=16, host_free_blocks=1000, compression_ratio=4.0,
                compression_accuracy_cost=1e-3, recompute_s=0.10, swap_s=0.05,
                compress_swap_s=0.015, swap_host_blocks=63, compress_host_blocks=16)
    base.update(kw)
    return PreemptionView(**base)


def test_decider_clear_cut_cases():
    d = CostBasedDecider()
    assert d.decide(_view()) == "swap"  # lossless swap fits and beats recompute
    assert d.decide(_view(recompute_s=0.01)) == "recompute"  # recompute cheapest
    assert d.decide(_view(host_free_blocks=20)) == "compress-swap"  # only compressed fits
    assert d.decide(_view(host_free_blocks=10)) == "recompute"  # nothing fits
    assert d.decide(_view(recompute_s=0.03)) == "compress-swap"  # full swap slower than rec.
    assert CostBasedDecider(swap_budget_s=0.04).decide(_view()) == "compress-swap"
    assert CostBasedDecider(swap_budget_s=0.04, max_quality_loss=0.5).decide(
        _view()) == "recompute"  # loss 1e-3 x 1000 = 1.0 > 0.5
    assert _view().quality_loss == pytest.approx(1.0)


def test_decider_in_the_engine_and_reported_quality_loss():
    inst = preempting_instance(0, host_memory_gb=0.2)
    # host memory holds no full victim: the decider compresses (or recomputes)
    r = lp.simulate(inst, lp.make_policy("fastserve", compression_accuracy_cost=0.01,
                                         preemption_decider=CostBasedDecider()), check=True)
    s = r.stats
    assert s["compressed_swaps"] > 0 and s["swaps"] == s["compressed_swaps"]
    assert s["compression_quality_loss"] == pytest.approx(0.01 * s["compressed_tokens"])
    assert 0 < s["swap_wait_s"] < s["busy_s"]
    assert np.all(r.arrays["status"] == "finished")
    # a decider that never swaps reproduces recompute preemption exactly
    class Never(PreemptionDecider):
        def decide(self, view):
            return "recompute"

    never = lp.simulate(inst, lp.make_policy("fastserve", preemption="swap",
                                             preemption_decider=Never()))
    rec = lp.simulate(inst, lp.make_policy("fastserve", preemption="recompute"))
    assert never.digest() == rec.digest() and never.stats["swaps"] == 0


@pytest.mark.parametrize("transfers", ["serial", "overlap"])
def test_a_decider_written_in_python_is_asked_in_a_pause_of_the_compiled_replicas(transfers):
    """A preemption decider without a compiled twin (here a subclass of the cost-based
    one: the same choices in Python) is asked in a pause for each victim, with its view: the run stays compiled and equals the reference mode and the twin's run."""
    class InPython(CostBasedDecider):
        pass

    inst = preempting_instance(0, host_memory_gb=0.2)
    kw = dict(compression_accuracy_cost=0.01, transfers=transfers,
              proactive_swap=transfers == "overlap")
    py = lp.make_policy("fastserve", preemption_decider=InPython(), **kw)
    fast = lp.simulate(inst, py, check=True)
    assert fast.stats["engine"] == "compiled+python-decider"
    assert fast.stats["compressed_swaps"] > 0
    ref = lp.simulate(inst, py, reference=True)
    twin = lp.simulate(inst, lp.make_policy("fastserve", preemption_decider=CostBasedDecider(),
                                            **kw))
    assert twin.stats["engine"] == "compiled"
    assert fast.digest() == ref.digest() == twin.digest()


def test_registered_policies_and_defaults():
    assert EngineConfig().preemption == "recompute"
    assert EngineConfig().compression_ratio == 4.0  # FP16 KV (the default dtype) to INT4
    p = lp.make_policy("vllm-compress-swap")
    assert p.engine.preemption == "compress-swap" and p.meta.engines == ("lpserve",)
    q = lp.make_policy("vllm-preempt-decider", swap_budget_s=0.1)
    assert q.engine.preemption_decider.swap_budget_s == 0.1
    assert q.meta.claims[0].proof == "proofs/kv-compress-decider.md"


@pytest.mark.parametrize("kw, field", [
    (dict(compression_ratio=1.0), "compression_ratio"),
    (dict(compression_ratio=0.5), "compression_ratio"),
    (dict(compression_ratio=math.inf), "compression_ratio"),
    (dict(compression_ratio=math.nan), "compression_ratio"),
    (dict(compression_ratio="int4"), "compression_ratio"),
    (dict(compression_accuracy_cost=-0.1), "compression_accuracy_cost"),
    (dict(compression_accuracy_cost=math.nan), "compression_accuracy_cost"),
    (dict(preemption="compress"), "preemption"),
    (dict(preemption_decider=lambda v: "swap"), "preemption_decider"),
])
def test_bad_engine_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=f"EngineConfig.{field}"):
        EngineConfig(**kw)


def test_bad_decider_input_and_output():
    with pytest.raises(ValueError, match="swap_budget_s"):
        CostBasedDecider(swap_budget_s=-1.0)
    with pytest.raises(ValueError, match="max_quality_loss"):
        CostBasedDecider(max_quality_loss=math.nan)
    with pytest.raises(ValueError, match="compression_ratio"):
        lp.cost_model().kv_quantize_time_s(4, 16, compression_ratio=1.0)

    class Bad(PreemptionDecider):
        name = "bad"

        def decide(self, view):
            return "drop"

    tr = lp.Trace.from_arrays(arrival_s=np.zeros(6), prompt_tokens=[200] * 6,
                              output_tokens=[300] * 6)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    gpu_memory_fraction=0.171))
    with pytest.raises(PolicyError, match="preemption_decider 'bad'.*'drop'"):
        lp.simulate(inst, lp.make_policy("vllm", preemption_decider=Bad()))


def test_instance_digest_sees_the_swap_bandwidth():
    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[10], output_tokens=[2])
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b")
    d = {e: lp.Instance(trace=tr, cluster=cl, cost=lp.cost_model(pcie_efficiency=e)).digest()
         for e in (1.0, 0.5, 0.25)}
    assert len(set(d.values())) == 3
    assert d[1.0] == lp.Instance(trace=tr, cluster=cl, cost=lp.cost_model()).digest()


def test_compressed_victims_come_back_with_their_context():
    """Every preemption a compressed swap (ample host memory): no request is prefilled
    again (``seen_tokens`` counts the tokens of each fresh admission), unlike recompute."""
    inst = preempting_instance(1, host_memory_gb=64.0)
    comp = lp.simulate(inst, lp.make_policy("fastserve", preemption="compress-swap"),
                       check=True)
    a = comp.arrays
    assert comp.stats["compressed_swaps"] == comp.summary()["preemptions"] > 0
    assert np.array_equal(a["seen_tokens"], a["prompt_tokens"])
    rec = lp.simulate(inst, lp.make_policy("fastserve", preemption="recompute"), check=True)
    assert np.any(rec.arrays["seen_tokens"] > rec.arrays["prompt_tokens"])


def test_tipping_bandwidth_interpolates_the_crossing():
    from lpserve.cost.preemption import tipping_bandwidth_gbps as tip

    # crosses recompute (4 s) halfway in log bandwidth between 16 and 4 GB/s: 8 GB/s
    assert tip([32, 16, 4], [3.0, 3.5, 4.5], 4.0) == pytest.approx(8.0)
    assert tip([32, 16], [5.0, 6.0], 4.0) == math.inf   # never better
    assert tip([32, 16], [1.0, 2.0], 4.0) == 0.0        # never worse
    with pytest.raises(ValueError, match="2 bandwidths but 1"):
        tip([32, 16], [1.0], 4.0)
