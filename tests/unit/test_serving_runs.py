"""Measured serving runs: the bundled public table, the inference-perf reader, the rebuilt
workload and the simulated-vs-measured comparison."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lpserve.evaluate.sim_to_real import mape, measured_figures, simulate_run, split_of
from lpserve.trace import TraceError
from lpserve.trace.serving_runs import (
    bundled_serving_runs,
    load_inference_perf,
    load_serving_runs,
    runs,
    stage_trace,
)


def test_bundled_runs_are_the_sixteen_public_runs():
    stages = bundled_serving_runs()
    assert len(stages) == 24 and len(runs(stages)) == 16
    assert {s.llm for s in stages} == {"llama-2-7b", "llama-2-70b", "mixtral-8x7b",
                                       "codellama-34b"}
    assert {s.gpu for s in stages} == {"h100-sxm"}
    over = {s.key for s in stages if s.overloaded}
    assert len(over) == 4 and all("reasoning" in k for k in over)
    assert {split_of(s) for s in stages} == {"train", "validation"}
    assert sum(split_of(s) == "train" for s in stages) == 8


def test_measured_inter_token_interval_is_per_generated_token():
    st = next(s for s in bundled_serving_runs() if s.key.endswith("llama-2-7b-tp1-codegen/0"))
    m = st.measured
    assert st.tpot_s() == pytest.approx((m["e2e_s"]["mean"] - m["ttft_s"]["mean"]) / 246)
    # inference-perf's ITL averages about two streamed chunks per generated token
    assert st.tpot_s() / m["itl_s"]["mean"] == pytest.approx(2.0, rel=0.03)
    assert measured_figures(st)["itl_s.mean"] == st.tpot_s()


def test_stage_trace_rebuilds_the_clients_workload():
    stages = runs(bundled_serving_runs())["20260217-155451-llama-2-7b-tp1-codegen"]
    tr, stage_of = stage_trace(stages, seed=3)
    assert len(tr) == 3000 + 6000 and (stage_of == 0).sum() == 3000
    assert np.allclose(np.diff(tr.arrival_s[:3000]), 0.2)
    assert tr.arrival_s[3000] == pytest.approx(600.0)
    assert set(tr.output_tokens.tolist()) == {247}
    q = stages[0].prompt_quantiles
    assert q[0] <= tr.prompt_tokens.min() and tr.prompt_tokens.max() <= q[-1]
    # the 100 distinct prompts repeat with period 100; a repeat has the same blocks
    blocks = [tuple(tr.block_flat[tr.block_offsets[i]:tr.block_offsets[i + 1]])
              for i in range(300)]
    assert len(set(blocks)) == 100 and blocks[:100] == blocks[100:200]
    # a group's six full system-prompt blocks are shared by its ten prompts
    firsts = {b[:6] for b in blocks}
    assert len(firsts) == 10 and len({b[6] for b in blocks}) == 100
    again, _ = stage_trace(stages, seed=3)
    assert np.array_equal(again.prompt_tokens, tr.prompt_tokens)


def _write_run(root, *, data_type="shared_prefix", ignore_eos=True, successes=40):
    (root / "results").mkdir(parents=True)
    (root / "exp-config.yaml").write_text(
        "model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\nmax_model_len: 4096\n"
        "max_num_batched_tokens: 2048\nmax_num_seqs: 128\n")
    (root / "results" / "config.yaml").write_text(
        f"data:\n  type: {data_type}\n  shared_prefix:\n    num_groups: 2\n"
        "    num_prompts_per_group: 3\n    system_prompt_len: 40\n    question_len: 60\n"
        f"    output_len: 20\nload:\n  type: constant\n  stages:\n  - rate: 2.0\n"
        f"    duration: 20\nserver:\n  ignore_eos: {'true' if ignore_eos else 'false'}\n")
    lat = {k: {"mean": v, "p90": 1.2 * v} for k, v in (
        ("request_latency", 0.5), ("time_to_first_token", 0.03), ("inter_token_latency", 0.012))}
    pl = dict(zip(("min", "p1", "p5", "p10", "p25", "median", "p75", "p90", "p95", "p99",
                   "max"), (98, 99, 99, 100, 100, 101, 102, 103, 104, 105, 106)))
    (root / "results" / "stage_0_lifecycle_metrics.json").write_text(json.dumps(
        {"successes": {"count": successes, "latency": lat, "prompt_len": pl},
         "failures": {"count": 0}}))


def test_inference_perf_reader_and_its_errors(tmp_path):
    _write_run(tmp_path / "run")
    (st,) = load_inference_perf(tmp_path / "run")
    assert (st.llm, st.tp, st.rate_rps, st.n_requests, st.output_tokens) == (
        "llama-2-7b", 1, 2.0, 40, 20)
    assert st.measured["ttft_s"] == {"mean": 0.03, "p90": pytest.approx(0.036)}
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"stages": [st.as_dict()]}))
    assert load_serving_runs(path) == [st]
    _write_run(tmp_path / "rnd", data_type="random")
    with pytest.raises(TraceError, match=r"config.yaml.*'data.type' is 'random'"):
        load_inference_perf(tmp_path / "rnd")
    _write_run(tmp_path / "eos", ignore_eos=False)
    with pytest.raises(TraceError, match="ignore_eos"):
        load_inference_perf(tmp_path / "eos")
    _write_run(tmp_path / "none", successes=0)
    with pytest.raises(TraceError, match="stage_0_lifecycle_metrics.json.*no successful"):
        load_inference_perf(tmp_path / "none")
    with pytest.raises(TraceError, match="exp-config.yaml' does not exist"):
        load_inference_perf(tmp_path / "missing")
    path.write_text(json.dumps({"stages": [{**st.as_dict(), "rate": 3}]}))
    with pytest.raises(TraceError, match=r"row 0: unknown fields \['rate'\]"):
        load_serving_runs(path)


def test_simulated_stage_is_compared_figure_by_figure(tmp_path):
    _write_run(tmp_path / "run")
    (row,) = simulate_run(load_inference_perf(tmp_path / "run"), engine="vllm")
    assert set(row.sim) == set(row.real) and all(math.isfinite(v) for v in row.sim.values())
    assert not row.sim_saturated and not row.real_saturated
    assert row.ape("e2e_s.mean") == pytest.approx(
        100 * abs(row.sim["e2e_s.mean"] - 0.5) / 0.5)
    assert mape([row])["itl_s.mean"] == row.ape("itl_s.mean")


def test_an_overloaded_stage_saturates_in_simulation(tmp_path):
    _write_run(tmp_path / "run")
    (st,) = load_inference_perf(tmp_path / "run")
    from dataclasses import replace
    hot = replace(st, rate_rps=400.0, duration_s=2.0, output_tokens=2000)
    (row,) = simulate_run([hot], engine="vllm")
    assert row.sim_saturated


@pytest.mark.slow
def test_default_vllm_profile_on_the_held_out_public_runs():
    """benchmarks/sim_to_real.py's validation bars, as a test: mean E2E MAPE <= 8 %, mean
    TTFT <= 19 %, inter-token latency <= 9 %, and no held-out stage saturates only in
    simulation."""
    from lpserve.evaluate.sim_to_real import compare_runs

    rows = compare_runs([s for s in bundled_serving_runs() if split_of(s) == "validation"],
                        engine="vllm")
    err = mape(rows)
    assert err["e2e_s.mean"] <= 8.0 and err["itl_s.mean"] <= 9.0, err
    assert err["ttft_s.mean"] <= 19.0, err
    assert not [r.stage.key for r in rows if r.sim_saturated and not r.real_saturated]
    assert {r.calibration for r in rows} == {"vllm-v1-h100"}
