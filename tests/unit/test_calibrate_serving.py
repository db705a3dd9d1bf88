"""``lpserve calibrate --serving``: a synthetic inference-perf run made from known
parameters is fitted back to them; a public run is matched within 5 % on mean TTFT, ITL
and E2E."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lpserve.cli import main
from lpserve.cost import load_calibration_file
from lpserve.evaluate.sim_to_real import simulate_run
from lpserve.trace.serving_runs import bundled_serving_runs, runs

TRUE = {"iter_overhead_s": 3e-3, "seq_overhead_s": 8e-5}
FRONTEND_S = 0.012  # the serving front end's latency (models/simulator.md (33))


def _write_inference_perf(root, stages, rows):
    """An inference-perf run folder whose measurements are ``rows``' simulated figures."""
    st = stages[0]
    (root / "results").mkdir(parents=True)
    (root / "exp-config.yaml").write_text(
        f"model: {st.model}\ntensor_parallelism: {st.tp}\nmax_model_len: {st.max_model_len}\n"
        f"max_num_batched_tokens: {st.max_num_batched_tokens}\n"
        f"max_num_seqs: {st.max_num_seqs}\n")
    load = "".join(f"  - rate: {s.rate_rps}\n    duration: {s.duration_s}\n" for s in stages)
    (root / "results" / "config.yaml").write_text(
        f"data:\n  type: shared_prefix\n  shared_prefix:\n    num_groups: {st.num_groups}\n"
        f"    num_prompts_per_group: {st.prompts_per_group}\n"
        f"    system_prompt_len: {st.system_prompt_tokens}\n"
        f"    question_len: {st.question_tokens}\n    output_len: {st.output_tokens}\n"
        f"load:\n  type: constant\n  stages:\n{load}server:\n  ignore_eos: true\n")
    names = ("min", "p1", "p5", "p10", "p25", "median", "p75", "p90", "p95", "p99", "max")
    for k, (s, row) in enumerate(zip(stages, rows)):
        lat = {"request_latency": {"mean": row.sim["e2e_s.mean"], "p90": row.sim["e2e_s.p90"]},
               "time_to_first_token": {"mean": row.sim["ttft_s.mean"],
                                       "p90": row.sim["ttft_s.p90"]},
               "inter_token_latency": {"mean": row.sim["itl_s.mean"] / 2, "p90": 0.0}}
        (root / "results" / f"stage_{k}_lifecycle_metrics.json").write_text(json.dumps(
            {"successes": {"count": s.n_requests, "latency": lat,
                           "prompt_len": dict(zip(names, s.prompt_quantiles))},
             "failures": {"count": 0}}))


@pytest.mark.slow
def test_serving_calibration_recovers_known_parameters(tmp_path, capsys):
    base = runs(bundled_serving_runs())["20260217-155451-llama-2-7b-tp1-codegen"]
    stages = [replace(base[0], rate_rps=3.0, duration_s=60.0, start_s=0.0),
              replace(base[1], rate_rps=12.0, duration_s=60.0, start_s=60.0)]
    rows = simulate_run(stages, engine="vllm", frontend_latency_s=FRONTEND_S, **TRUE)
    _write_inference_perf(tmp_path / "run", stages, rows)
    out = tmp_path / "mine.toml"
    assert main(["calibrate", "--serving", str(tmp_path / "run"), "--gpu", "h100-sxm",
                 "--fit", ",".join(TRUE), "--max-stage-s", "0", "--out", str(out),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    entry = load_calibration_file(out)[0]
    for k, v in {**TRUE, "frontend_latency_s": FRONTEND_S}.items():
        assert entry[k] == pytest.approx(v, rel=0.02), k
    assert all(report["after"][k] < 5.0 for k in ("e2e_s.mean", "ttft_s.mean", "itl_s.mean"))


@pytest.mark.slow
def test_serving_calibration_matches_a_public_run(tmp_path, capsys):
    stages = runs(bundled_serving_runs())["20260218-150956-codellama-34b-tp2-codegen"]
    table = tmp_path / "run.json"
    table.write_text(json.dumps({"stages": [s.as_dict() for s in stages]}))
    out = tmp_path / "mine.toml"
    assert main(["calibrate", "--serving", str(table), "--gpu", "h100-sxm",
                 "--fit", "eff_weights,iter_overhead_s", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(report["after"][k] < 5.0 for k in ("e2e_s.mean", "ttft_s.mean", "itl_s.mean"))


def test_serving_calibration_errors(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["calibrate", "--serving", str(tmp_path / "notes.txt"), "--gpu",
                 "h100-sxm"]) == 2
    assert "inference-perf run folder" in capsys.readouterr().err
    assert main(["calibrate", "--gpu", "h100-sxm"]) == 2
    assert "--serving PATH" in capsys.readouterr().err
