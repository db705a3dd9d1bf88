"""KV sizes and capacities against hand computations."""
from __future__ import annotations

import pytest

from lpserve.cost import UnitRoundCost, cost_model


def test_kv_bytes_per_token_llama2_7b():
    # 2 (K,V) x 32 layers x 32 KV heads x 128 head dim x 2 bytes
    assert cost_model(llm="llama-2-7b").kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524288


def test_kv_capacity_llama2_7b_a100_80gb():
    m = cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)
    per_layer = 4096 * (4096 + 2 * 4096) + 4096 * 4096 + 3 * 4096 * 11008
    params = 32 * per_layer + 2 * 32000 * 4096          # 6,738,149,376
    assert params == 6_738_149_376
    free = 0.9 * 80 * 2**30 - 2 * params
    assert m.kv_capacity_tokens(0.9) == int(free // 524288) == 121_752
    assert m.kv_capacity_blocks(16, 0.9) == 121_752 // 16


def test_kv_capacity_llama3_70b_tp4():
    m = cost_model(gpu="a100-80gb", llm="llama-3-70b", tp=4)
    per_layer = 8192 * (8192 + 2 * 8 * 128) + 8192 * 8192 + 3 * 8192 * 28672
    params = 80 * per_layer + 2 * 128256 * 8192
    assert params == 70_552_387_584      # RMSNorm weights (1.3 M) are not counted
    kv_per_gpu = 2 * 80 * (8 // 4) * 128 * 2             # 81,920 bytes per token per GPU
    assert m.kv_bytes_per_token == 4 * kv_per_gpu == 327_680
    free = 0.9 * 80 * 2**30 - 2 * params / 4
    assert m.kv_capacity_tokens(0.9) == int(free // kv_per_gpu)
    assert m.kv_capacity_blocks(32, 0.8) == int((0.8 * 80 * 2**30 - 2 * params / 4)
                                                // kv_per_gpu) // 32


def test_kv_heads_replicated_when_tp_exceeds_them():
    m = cost_model(gpu="a100-80gb", llm="llama-3-70b", tp=8)   # 8 KV heads, 8 GPUs
    assert m.kv_bytes_per_token == 8 * 2 * 80 * 1 * 128 * 2


def test_swap_and_transfer_times():
    m = cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)
    # 10 blocks x 16 tokens x 512 KiB over one-way PCIe Gen4 (32 GB/s)
    assert m.swap_time_s(10, 16) == pytest.approx(10 * 16 * 524288 / 32e9)
    assert m.transfer_time_s(1000, link_gbps=25.0) == pytest.approx(1000 * 524288 / 25e9)
    # default link: NVLink one way, 300 GB/s per GPU
    assert m.transfer_time_s(1000) == pytest.approx(1000 * 524288 / 300e9)
    assert m.swap_time_s(0) == 0.0


def test_capacity_errors():
    m = cost_model(gpu="a100-40gb", llm="llama-2-13b", tp=1)
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        m.kv_capacity_tokens(1.5)
    with pytest.raises(ValueError, match="exceed"):
        m.kv_capacity_tokens(0.5)
    with pytest.raises(ValueError, match="block_tokens"):
        m.kv_capacity_blocks(0)
    with pytest.raises(ValueError, match="n_blocks"):
        m.swap_time_s(-1)


def test_unit_round():
    u = UnitRoundCost(memory_tokens=500)
    assert u.kind == 2
    assert u.batch_time_s([3], [0], [5, 6]) == 1.0
    assert u.batch_time_s([], [], []) == 0.0
    assert u.kv_capacity_tokens() == 500 and u.kv_capacity_blocks(16) == 31
    assert u.swap_time_s(4) == 0.0 and u.transfer_time_s(10) == 0.0
    with pytest.raises(ValueError, match="memory_tokens"):
        UnitRoundCost(memory_tokens=0)


@pytest.mark.parametrize("model", [
    cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1),
    cost_model(gpu="h100-sxm", llm="llama-3-70b", tp=4),
    UnitRoundCost(memory_tokens=64)], ids=["a100-7b", "h100-70b-tp4", "unit-round"])
def test_vectorized_swap_and_quantize_times_are_the_scalar_floats(model):
    """The simulator's price tables (``swap_times_s``, ``kv_quantize_times_s``) give the
    very floats of the scalar methods, so a swap is priced the same whether a table or
    the cost model prices it; bad counts are refused."""
    import numpy as np

    from lpserve.cost import TableCost

    models = [model]
    if not isinstance(model, UnitRoundCost):
        models.append(TableCost(linear=([1, 100], [1e-3, 2e-3]), layers=2, gpu=model.gpu.key,
                                llm=model.llm.key, tp=model.tp))
    k = np.array([0, 1, 2, 3, 7, 16, 999, 12_345, 10 ** 9], np.int64)
    for m in models:
        for bt in (1, 16):
            assert np.array_equal(m.swap_times_s(k, bt),
                                  [m.swap_time_s(int(x), bt) for x in k])
            assert np.array_equal(m.kv_quantize_times_s(k, bt, 4.0),
                                  [m.kv_quantize_time_s(int(x), bt, 4.0) for x in k])
        with pytest.raises(ValueError, match="n_blocks"):
            m.swap_times_s(np.array([3, -1]), 16)
        with pytest.raises(ValueError, match="n_blocks"):
            m.swap_times_s(np.array([1.5]), 16)
