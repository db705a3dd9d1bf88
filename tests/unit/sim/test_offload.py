"""vLLM's CPU KV offload (``EngineConfig.kv_offload_gib``, ``models/simulator.md`` (35)):
the host tier, its loads and its errors."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policy import EngineConfig
from tests.oracles.offload import GIB, HostTier, Offload, found_tokens, tier_blocks

A100 = dict(gpu="a100-80gb", llm="llama-2-7b")


# ------------------------------------------------------------------ the tier
def test_tier_matches_the_leading_run_after_the_gpu_hits():
    t = HostTier(10)
    t.touch(["a", "b", "c"])
    assert t.match(["a", "b", "c", "d"], 0) == 3
    assert t.match(["a", "b", "c", "d"], 1) == 2
    assert t.match(["x", "b"], 0) == 0
    assert t.match(["a", "b"], 2) == 0


def test_tier_drops_least_recently_used_and_keeps_a_prompts_head():
    t = HostTier(3)
    t.touch(["a", "b", "c"])  # c, then b, then a: "a" is the most recent
    t.touch(["d"])
    assert "c" not in t and {"a", "b", "d"} <= {k for k in "abcd" if k in t}
    t.touch(["b"])
    t.touch(["e"])  # drops "a", the least recently used now
    assert "a" not in t and len(t) == 3
    assert t.n_stored == 5 and t.n_dropped == 2


def test_tier_sizes_and_errors():
    assert tier_blocks(1.0, 524288.0, 16) == GIB // (524288 * 16) == 128
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        HostTier(0)
    cost = lp.cost_model(**A100)
    with pytest.raises(ValueError, match=r"kv_offload_gib=0\.001 holds no KV block of 16"):
        Offload.for_replica(0.001, cost, 16, 1.0)
    assert Offload.for_replica(0.0, cost, 16, 1.0) is None


def test_found_tokens_leaves_one_token_to_compute():
    off = Offload(8, lp.cost_model(**A100), 16, 1.0)
    off.tier.touch(["a", "b"])
    assert found_tokens(off, ["a", "b"], 0, 40, 16) == (32, 2)
    assert found_tokens(off, ["a", "b"], 0, 32, 16) == (31, 2)  # the last token recomputed
    assert found_tokens(off, ["a", "b"], 1, 40, 16) == (32, 1)
    assert found_tokens(None, ["a", "b"], 1, 40, 16) == (16, 0)


# ------------------------------------------------------------------ the engine option
def test_engine_option_is_checked_and_described():
    for bad in (-1.0, float("nan"), float("inf"), True, "8"):
        with pytest.raises(ValueError, match="kv_offload_gib must be a finite number"):
            EngineConfig(batching="decode-first", kv_offload_gib=bad)
    with pytest.raises(ValueError, match="needs prefix_caching=True and batching="):
        EngineConfig(batching="decode-first", prefix_caching=False, kv_offload_gib=8.0)
    with pytest.raises(ValueError, match="needs prefix_caching=True and batching="):
        EngineConfig(batching="prefill-first", kv_offload_gib=8.0)
    eng = lp.make_policy("vllm").engine.updated({"kv_offload_gib": "64"}, where="--engine")
    assert eng.kv_offload_gib == 64.0
    assert "CPU KV offload 64 GiB" in eng.describe()
    assert "offload" not in lp.make_policy("vllm").engine.describe()


def _evicted_prefix_instance() -> lp.Instance:
    """Request 0 computes a 4,096-token prefix; requests 1 and 2 (unique 4,096-token
    prompts) push it out of a 7,056-token GPU pool; request 3 returns to the prefix."""
    prefix, own = [1, 2, 3, 4, 5, 6, 7, 8], [[11, 12, 13, 14, 15, 16, 17, 18],
                                              [21, 22, 23, 24, 25, 26, 27, 28]]
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 2.0, 4.0, 6.0], prompt_tokens=[4096] * 4,
                              output_tokens=[4] * 4, block_ids=[prefix, *own, prefix],
                              block_tokens=512)
    return lp.Instance(trace=tr, cluster=lp.Cluster(**A100, gpu_memory_fraction=0.2))


def test_an_evicted_prefix_is_loaded_from_the_host_tier():
    inst = _evicted_prefix_instance()
    base = lp.simulate(inst, lp.make_policy("vllm"), check=True)
    res = lp.simulate(inst, lp.make_policy("vllm", kv_offload_gib=8.0), check=True)
    assert base.arrays["cached_prompt_tokens"][3] == 0  # the GPU lost the prefix
    assert res.arrays["cached_prompt_tokens"][3] == 4095  # the host tier had it
    off = res.stats["offload"]
    assert off["loaded_blocks"] == 256 and off["hit_tokens"] == 4095
    assert off["tier_blocks"] == 8 * GIB // (524288 * 16)
    load_s = lp.cost_model(**A100).swap_time_s(256, 16)
    assert off["load_s"] == pytest.approx(load_s)
    a = res.arrays
    # admitted on arrival, it waits for its load, then computes one token
    assert a["first_scheduled_s"][3] == 6.0
    assert a["first_token_s"][3] >= 6.0 + load_s
    assert a["ttft_s"][3] < 0.5 * base.arrays["ttft_s"][3]
    assert res.stats["engine"] == "compiled" and base.stats["offload"] is None


def test_fast_equals_reference_with_a_load():
    inst = _evicted_prefix_instance()
    pol = lp.make_policy("vllm", kv_offload_gib=8.0)
    fast = lp.simulate(inst, pol, check=True)
    ref = lp.simulate(inst, pol, reference=True, check=True)
    assert fast.digest() == ref.digest()


def test_an_unused_tier_changes_nothing():
    tr = lp.Trace.from_arrays(arrival_s=np.arange(8) * 0.05, prompt_tokens=[300] * 8,
                              output_tokens=[20] * 8)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**A100))
    plain = lp.simulate(inst, lp.make_policy("vllm"), reference=True)
    res = lp.simulate(inst, lp.make_policy("vllm", kv_offload_gib=8.0))
    assert res.stats["offload"]["loaded_blocks"] == 0
    for f in ("first_token_s", "finish_s", "cached_prompt_tokens", "preemptions"):
        assert np.array_equal(res.arrays[f], plain.arrays[f]), f


def test_offload_needs_a_colocated_cluster_without_a_rebalancer():
    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[100], output_tokens=[4])
    cl = lp.Cluster(**A100, prefill_replicas=1, decode_replicas=1)
    with pytest.raises(ValueError, match="kv_offload_gib needs a colocated cluster"):
        lp.simulate(lp.Instance(trace=tr, cluster=cl), lp.make_policy("vllm",
                                                                      kv_offload_gib=8.0))


def test_the_cli_reports_the_tier(capsys):
    import json

    from lpserve.cli import main

    assert main(["simulate", "--head", "40", "--engine", "kv_offload_gib=16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["offload"]["tier_blocks"] == 16 * GIB // (524288 * 16)
    assert out["engine"] == {"kv_offload_gib": 16.0}
    assert main(["simulate", "--head", "40", "--engine", "kv_offload_gib=16"]) == 0
    assert "CPU KV offload: 2,048 host blocks" in capsys.readouterr().out
    assert main(["simulate", "--head", "5", "--engine", "kv_offload_gib=-1"]) == 2
    assert "kv_offload_gib must be a finite number >= 0" in capsys.readouterr().err
