"""The analytic model's interface, breakdown and bad-input errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

import lpserve as lp
from lpserve.cost import AnalyticCost, CostModel, TableCost, cost_model, cost_model_for
from lpserve.cost import _kernels as K


def test_public_interface():
    m = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)
    assert isinstance(m, lp.CostModel) and m.kind == K.KIND_ANALYTIC
    assert m.params.dtype == np.float64 and m.params.ndim == 1 and m.params[0] == m.kind
    t = m.batch_time_s(prefill_tokens=[512], prefill_cached=[0], decode_context=[700, 1200])
    assert 0.01 < t < 0.2
    assert m.batch_time_s([], [], []) == 0.0          # empty batch: 0 s, documented
    assert K.iteration_time(m.params, np.array([512]), np.array([0]),
                            np.array([700, 1200])) == t


def test_breakdown_parts_sum_to_time():
    m = cost_model(gpu="a100-80gb", llm="llama-2-70b", tp=4)
    b = m.breakdown([2048], [0], [600] * 8)
    parts = b["linear_s"] + b["attention_s"] + b["communication_s"] + b["overhead_s"]
    assert parts == pytest.approx(b["time_s"], rel=1e-12)
    assert b["time_s"] == pytest.approx(m.batch_time_s([2048], [0], [600] * 8), rel=1e-12)
    assert b["linear_bound"] == "compute"
    d = m.breakdown([], [], [600])
    assert d["linear_bound"] == "memory" and d["communication_bound"] == "latency"


def test_prefill_compute_bound_decode_memory_bound_and_tp_speeds_up():
    m1 = cost_model(gpu="a100-80gb", llm="llama-2-13b", tp=1)
    m2 = cost_model(gpu="a100-80gb", llm="llama-2-13b", tp=2)
    assert m2.batch_time_s([4096], [0], []) < m1.batch_time_s([4096], [0], [])
    # one decode step is far cheaper than a long prefill
    assert m1.batch_time_s([], [], [1000]) < m1.batch_time_s([4096], [0], []) / 10


def test_moe_expert_loading_grows_with_tokens():
    m = cost_model(gpu="h100-sxm", llm="mixtral-8x7b", tp=2)
    f1, b1 = m.roofline_work([], [], [100])
    f8, b8 = m.roofline_work([], [], [100] * 64)
    assert b8 > b1 * 2            # more experts touched
    assert m.batch_time_s([], [], [100] * 64) > m.batch_time_s([], [], [100])


def test_h100_faster_than_a100_and_fp8_faster_than_bf16():
    a = cost_model(gpu="a100-80gb", llm="llama-3-8b")
    h = cost_model(gpu="h100-sxm", llm="llama-3-8b")
    h8 = cost_model(gpu="h100-sxm", llm="llama-3-8b", dtype="fp8")
    assert h.batch_time_s([2048], [0], []) < a.batch_time_s([2048], [0], [])
    assert h8.peak_flops == 1979e12 and h.peak_flops == 989e12
    assert h8.kv_bytes_per_token == h.kv_bytes_per_token / 2
    with pytest.raises(ValueError, match="FP8"):
        cost_model(gpu="a100-80gb", llm="llama-3-8b", dtype="fp8")


def test_overrides_change_params():
    base = cost_model()
    slow = cost_model(iter_overhead_s=0.01)
    assert slow.batch_time_s([], [], [10]) == pytest.approx(base.batch_time_s([], [], [10]) + 0.01)
    with pytest.raises(ValueError, match="unknown cost-model overrides"):
        cost_model(warp_speed=2)
    with pytest.raises(ValueError, match="eff_compute"):
        cost_model(eff_compute=1.5)


@pytest.mark.parametrize("kwargs,match", [
    ({"gpu": "a100"}, "unknown gpu 'a100'; known: a100-40gb"),
    ({"llm": "gpt-5"}, "unknown llm 'gpt-5'; known: bloom-176b"),
    ({"llm": "llama-2-70b", "tp": 1}, "weights need"),
    ({"llm": "qwen2.5-7b", "tp": 8}, "does not divide the 28 attention heads"),
    ({"tp": 3}, "tp must be one of"),
])
def test_bad_configurations(kwargs, match):
    with pytest.raises((KeyError, ValueError), match=match):
        cost_model(**kwargs)


@pytest.mark.parametrize("args,match", [
    (([-1], [0], []), "prefill_tokens must be >= 0"),
    (([5], [0], [1.5]), "decode_context must hold integers"),
    (([5], [0, 1], []), "prefill_cached has 2 entries"),
    (([5], [-3], []), "prefill_cached must be >= 0"),
    ((["a"], [0], []), "prefill_tokens must hold integers"),
    (([[1, 2]], None, []), "1-D"),
])
def test_bad_tokens(args, match):
    with pytest.raises(ValueError, match=match):
        cost_model().batch_time_s(*args)


def test_float_integers_accepted():
    m = cost_model()
    assert m.batch_time_s([512.0], [0.0], [10.0]) == m.batch_time_s([512], [0], [10])


def test_decode_run_matches_sum_of_iterations():
    m = cost_model(gpu="a100-80gb", llm="llama-2-70b", tp=4)
    total = m.decode_run_s([100, 200], 5)
    steps = sum(m.batch_time_s([], [], [100 + k, 200 + k]) for k in range(5))
    assert total == pytest.approx(steps, rel=1e-12)


@pytest.mark.parametrize("llm", ["llama-2-7b", "mistral-7b"])
def test_decode_time_at_is_the_iteration_at_shifted_contexts(llm):
    """decode_time_at prices a decode iteration from the contexts' sum: the same float as
    iteration_time of the batch at contexts + k, with a sliding window (mistral) too."""
    m = cost_model(gpu="a100-80gb", llm=llm)
    rng = np.random.default_rng(3)
    e = np.zeros(0, np.int64)
    for n in (0, 1, 7, 64):
        c = rng.integers(1, 9000, n)
        s = K.context_sum(c)
        for k in (0, 1, 5, 700):
            assert K.decode_time_at(m.params, c, s, k) == K.iteration_time(m.params, e, e,
                                                                           c + k)


def test_cost_model_for_cluster():
    cl = lp.Cluster(gpu="h100-sxm", llm="llama-3-70b", tp=4, replicas=2)
    m = cost_model_for(cl)
    assert isinstance(m, AnalyticCost) and m.tp == 4 and m.gpu.key == "h100-sxm"


def test_table_cost_vidur_profile_close_to_analytic():
    tab = TableCost.vidur_a100_llama2_7b(tp=1)
    ana = cost_model(gpu="a100-80gb", llm="llama-2-7b")
    assert isinstance(tab, CostModel) and tab.kind == K.KIND_TABLE
    for batch in (([2048], [0], []), ([], [], [1024] * 32), ([256], [512], [800] * 8)):
        assert tab.batch_time_s(*batch) == pytest.approx(ana.batch_time_s(*batch), rel=0.2)
    assert tab.kv_capacity_tokens() == ana.kv_capacity_tokens()
    b = tab.breakdown([128], [0], [64])
    assert b["linear_s"] + b["attention_s"] + b["overhead_s"] == pytest.approx(b["time_s"])


def test_table_cost_user_tables():
    t = TableCost(linear=([1, 100], [1e-3, 2e-3]), layers=2, iter_overhead_s=1e-3)
    assert t.batch_time_s([], [], [5]) == pytest.approx(2 * 1e-3 + 1e-3)
    assert t.batch_time_s([50], [0], []) == pytest.approx(2 * (1e-3 + 1e-3 * 49 / 99) + 1e-3)
    # past the last point the last segment extends
    assert t.batch_time_s([200], [0], []) == pytest.approx(2 * (1e-3 + 1e-3 * 199 / 99) + 1e-3)
    with pytest.raises(ValueError, match="linear"):
        TableCost(linear=([1, 2], [1.0]))
    with pytest.raises(ValueError, match="at least one"):
        TableCost()


def test_json_roundtrip_of_breakdown():
    b = cost_model().breakdown([100], [0], [])
    json.dumps({k: (float(v) if not isinstance(v, str) else v) for k, v in b.items()})
