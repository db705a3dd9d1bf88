"""Properties of the GPU cost models on hypothesis-generated batches."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lpserve.cost import TableCost, UnitRoundCost, cost_model
from lpserve.cost import _kernels as K

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

CONFIGS = [("a100-80gb", "llama-2-7b", 1), ("a100-80gb", "llama-2-70b", 4),
           ("h100-sxm", "mixtral-8x7b", 2), ("h200", "llama-3-70b", 8),
           ("l40s", "mistral-7b", 1), ("h100-sxm", "bloom-176b", 8),
           # MoE with expert parallelism and imbalance, sliding windows, latent attention,
           # a mesh interconnect and a PCIe-only GPU, under each engine profile
           ("h100-sxm", "qwen3-30b-a3b", 4), ("b200", "gpt-oss-120b", 2),
           ("h200", "deepseek-v3", 8), ("mi300x", "qwen3-32b", 2), ("l4", "llama-3.1-8b", 1)]
OPTIONS = {("h100-sxm", "qwen3-30b-a3b", 4): dict(ep=4, moe_imbalance=1.3, engine="vllm"),
           ("b200", "gpt-oss-120b", 2): dict(engine="sglang"),
           ("h200", "deepseek-v3", 8): dict(ep=8, moe_imbalance=1.1, engine="trtllm"),
           ("mi300x", "qwen3-32b", 2): dict(engine="vllm")}
MODELS = {c: cost_model(gpu=c[0], llm=c[1], tp=c[2], **OPTIONS.get(c, {})) for c in CONFIGS}


@st.composite
def batches(draw, min_size: int = 1):
    n_pre = draw(st.integers(0, 6))
    n_dec = draw(st.integers(0 if n_pre else min_size, 24))
    pt = draw(st.lists(st.integers(1, 4096), min_size=n_pre, max_size=n_pre))
    pc = draw(st.lists(st.integers(0, 8192), min_size=n_pre, max_size=n_pre))
    dc = draw(st.lists(st.integers(0, 32768), min_size=n_dec, max_size=n_dec))
    return (np.array(pt, dtype=np.int64), np.array(pc, dtype=np.int64),
            np.array(dc, dtype=np.int64))


configs = st.sampled_from(CONFIGS)


@SETTINGS
@given(configs, batches())
def test_time_positive(cfg, batch):
    assert MODELS[cfg].batch_time_s(*batch) > 0


@SETTINGS
@given(configs, batches(), st.integers(0, 2), st.integers(1, 3000), st.data())
def test_non_decreasing_in_every_count(cfg, batch, which, delta, data):
    model = MODELS[cfg]
    pt, pc, dc = batch
    base = model.batch_time_s(pt, pc, dc)
    arrays = [pt.copy(), pc.copy(), dc.copy()]
    if arrays[which].size == 0:
        arrays[which] = arrays[which]  # nothing to grow: grow the batch instead
        grown = model.batch_time_s(pt, pc, np.append(dc, delta))
    else:
        i = data.draw(st.integers(0, arrays[which].size - 1))
        arrays[which][i] += delta
        grown = model.batch_time_s(*arrays)
    assert grown >= base * (1 - 1e-12)


@SETTINGS
@given(configs, batches(), st.integers(0, 4096))
def test_adding_a_request_never_helps(cfg, batch, ctx):
    model = MODELS[cfg]
    pt, pc, dc = batch
    assert model.batch_time_s(pt, pc, np.append(dc, ctx)) >= model.batch_time_s(pt, pc, dc)
    assert (model.batch_time_s(np.append(pt, 1 + ctx), np.append(pc, 0), dc)
            >= model.batch_time_s(pt, pc, dc))


@SETTINGS
@given(configs, batches())
def test_never_below_roofline(cfg, batch):
    model = MODELS[cfg]
    t = model.batch_time_s(*batch)
    flops, nbytes = model.roofline_work(*batch)
    bound = max(flops / model.peak_flops, nbytes / (model.gpu.hbm_gbps * 1e9))
    assert bound > 0
    assert t >= bound


@SETTINGS
@given(configs, batches(min_size=0))
def test_kernel_equals_ref_analytic(cfg, batch):
    p = MODELS[cfg].params
    assert K.iteration_time(p, *batch) == pytest.approx(K.iteration_time_ref(p, *batch),
                                                        rel=1e-11, abs=0)


@SETTINGS
@given(configs, st.lists(st.integers(0, 8192), min_size=1, max_size=32), st.integers(0, 40))
def test_decode_run_equals_stepping(cfg, ctx, n_iters):
    p = MODELS[cfg].params
    dc = np.array(ctx, dtype=np.int64)
    out, out_ref = np.zeros(n_iters), np.zeros(n_iters)
    K.decode_run_times(p, dc, n_iters, out)
    K.decode_run_times_ref(p, dc, n_iters, out_ref)
    np.testing.assert_allclose(out, out_ref, rtol=1e-11)
    assert K.decode_run(p, dc, n_iters) == pytest.approx(K.decode_run_ref(p, dc, n_iters),
                                                         rel=1e-11)


TABLE = TableCost.vidur_a100_llama2_7b(tp=2)
UNIT = UnitRoundCost(memory_tokens=1000)


@SETTINGS
@given(batches(min_size=0))
def test_kernel_equals_ref_table_and_unit(batch):
    for m in (TABLE, UNIT):
        assert K.iteration_time(m.params, *batch) == pytest.approx(
            K.iteration_time_ref(m.params, *batch), rel=1e-11, abs=0)


@SETTINGS
@given(batches(), st.integers(0, 2), st.integers(1, 3000), st.data())
def test_table_non_decreasing(batch, which, delta, data):
    arrays = [a.copy() for a in batch]
    base = TABLE.batch_time_s(*batch)
    assert base > 0
    if arrays[which].size:
        i = data.draw(st.integers(0, arrays[which].size - 1))
        arrays[which][i] += delta
        assert TABLE.batch_time_s(*arrays) >= base * (1 - 1e-12)


@SETTINGS
@given(st.lists(batches(min_size=0), min_size=1, max_size=8))
def test_vectorized_equals_single(batch_list):
    model = MODELS[CONFIGS[1]]
    many = model.batch_times_s([{"prefill_tokens": b[0], "prefill_cached": b[1],
                                 "decode_context": b[2]} for b in batch_list])
    single = [model.batch_time_s(*b) for b in batch_list]
    np.testing.assert_allclose(many, single, rtol=1e-14)
