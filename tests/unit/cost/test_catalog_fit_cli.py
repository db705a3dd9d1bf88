"""Catalog entries, user entries, calibration fitting and the ``lpserve cost`` command."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lpserve.cli import main
from lpserve.cost import (
    cost_model,
    fit,
    get_gpu,
    get_llm,
    gpu_names,
    llm_from_hf_config,
    llm_names,
    load_catalog_file,
)
from lpserve.cost.analytic import calibrations
from lpserve.cost.fit import MAX_REL_ERROR, fit_minimax

GPUS = ["a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "l40s"]
LLMS = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "mistral-7b",
        "mixtral-8x7b", "codellama-34b", "yi-34b", "opt-13b", "opt-66b", "opt-175b",
        "bloom-176b", "qwen2.5-7b", "qwen2.5-72b"]


def test_catalog_complete_with_sources():
    assert set(GPUS) <= set(gpu_names()) and set(LLMS) <= set(llm_names())
    for g in GPUS:
        assert get_gpu(g).source
    for m in LLMS:
        assert get_llm(m).source
    assert get_llm("mixtral-8x7b").experts == 8 and get_llm("mixtral-8x7b").top_k == 2
    assert get_gpu("h100-sxm").fp8_tflops == 1979 and get_gpu("a100-80gb").fp8_tflops == 0


@pytest.mark.parametrize("llm", LLMS)
def test_parameter_counts_match_published_sizes(llm):
    published_b = {"llama-2-7b": 6.74, "llama-2-13b": 13.0, "llama-2-70b": 69.0, "llama-3-8b": 8.03,
                   "llama-3-70b": 70.6, "mistral-7b": 7.24, "mixtral-8x7b": 46.7,
                   "codellama-34b": 33.7, "yi-34b": 34.4, "opt-13b": 12.9, "opt-66b": 65.7,
                   "opt-175b": 175.0, "bloom-176b": 176.2, "qwen2.5-7b": 7.6,
                   "qwen2.5-72b": 72.7}[llm]
    assert get_llm(llm).n_params / 1e9 == pytest.approx(published_b, rel=0.03)


def test_user_catalog_file_and_hf_config(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('[gpu.my-gpu]\nbf16_tflops = 100.0\nhbm_gbps = 1000.0\nmemory_gib = 24.0\n'
                 'pcie_gbps = 64.0\n\n[llm.tiny]\nlayers = 2\nhidden = 256\nheads = 4\n'
                 'kv_heads = 4\nhead_dim = 64\nffn = 512\nvocab = 1000\n')
    out = load_catalog_file(f)
    assert "my-gpu" in gpu_names() and "tiny" in llm_names()
    assert out["gpu"]["my-gpu"].memory_gib == 24.0
    m = cost_model(gpu="my-gpu", llm="tiny")
    assert m.batch_time_s([10], [0], []) > 0 and m.calibration["name"] == "default"
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False}))
    spec = llm_from_hf_config(cfg, key="my-llama")
    assert spec.n_params == get_llm("llama-3-8b").n_params and spec.dtype == "bf16"
    assert cost_model(llm="my-llama").kv_bytes_per_token == cost_model(llm="llama-3-8b").kv_bytes_per_token
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpu.x]\nbf16_tflops = 1.0\nwarp = 3\n")
    with pytest.raises(ValueError, match="unknown fields"):
        load_catalog_file(bad)


def test_calibrations_have_provenance():
    for e in calibrations():
        pv = e["provenance"]
        assert pv["data"] and pv["date"] and pv["median_abs_error"] >= 0 and pv["rows"] > 0


def test_fit_recovers_known_parameters():
    truth = dict(cost_model().values)
    truth.update(eff_compute=0.55, iter_overhead_s=2e-3)
    ref = cost_model(**truth)
    rows = []
    for n in (64, 256, 1024, 4096):
        rows.append({"scope": "iteration", "tp": 1, "prefill_tokens": n, "prefill_chunks": 1,
                     "measured_s": ref.batch_time_s([n], [0], [])})
    for b in (1, 16, 64):
        rows.append({"scope": "iteration", "tp": 1, "decode_batch": b, "decode_context": 500,
                     "measured_s": ref.batch_time_s([], [], [500] * b)})
    start = dict(truth, eff_compute=0.8, iter_overhead_s=0.0)
    res = fit(rows, "a100-80gb", "llama-2-7b", parameters=("eff_compute", "iter_overhead_s"),
              base=start)
    assert res.values["eff_compute"] == pytest.approx(0.55, rel=1e-3)
    assert res.values["iter_overhead_s"] == pytest.approx(2e-3, rel=1e-2)
    assert res.max_abs_error < 1e-4
    with pytest.raises(ValueError, match="cannot fit"):
        fit(rows, "a100-80gb", "llama-2-7b", parameters=("warp",))
    with pytest.raises(ValueError, match="power"):
        fit(rows, "a100-80gb", "llama-2-7b", parameters=("eff_compute",), power=0.5)


def test_fit_power_trades_median_for_worst_row():
    """A larger power of the log-ratio lowers the worst error when one row is off."""
    ref = cost_model()
    rows = [{"scope": "iteration", "tp": 1, "prefill_tokens": n, "prefill_chunks": 1,
             "measured_s": ref.batch_time_s([n], [0], [])} for n in (64, 256, 1024, 2048, 4096)]
    rows[2]["measured_s"] *= 1.6  # one inconsistent measurement
    kw = dict(parameters=("eff_compute", "iter_overhead_s"), base=dict(ref.values))
    l2 = fit(rows, "a100-80gb", "llama-2-7b", **kw)
    l8 = fit(rows, "a100-80gb", "llama-2-7b", power=8.0, **kw)
    assert l8.max_abs_error < l2.max_abs_error - 0.02
    assert l8.median_abs_error > l2.median_abs_error
    # least squares within a band: every row inside it, the sum of squares no better than l2
    band = fit(rows, "a100-80gb", "llama-2-7b", max_rel_error=0.25, **kw)
    assert band.max_abs_error <= 0.25 + 1e-6 < l2.max_abs_error
    assert np.sum(np.log1p(band.rel_errors) ** 2) >= np.sum(np.log1p(l2.rel_errors) ** 2) - 1e-12
    # the minimax fit reaches the best worst error (1.6 / (1 + 1.6) * 2 - 1 = 0.2308 for
    # rows that differ only by the factor 1.6), and a band below it fails
    mm = fit_minimax(rows, "a100-80gb", "llama-2-7b", **kw)
    assert mm.max_abs_error <= band.max_abs_error + 1e-6
    assert mm.max_abs_error == pytest.approx(0.2308, abs=0.01)
    with pytest.raises(ValueError, match="keep every row within"):
        fit(rows, "a100-80gb", "llama-2-7b", max_rel_error=0.5 * mm.max_abs_error, **kw)
    with pytest.raises(ValueError, match="max_rel_error"):
        fit(rows, "a100-80gb", "llama-2-7b", max_rel_error=0.0, **kw)


def test_shipped_engine_calibrations_respect_their_band():
    for e in calibrations():
        if e["name"].startswith("splitwise-") and "held within" in e["provenance"]["note"]:
            assert e["provenance"]["max_abs_error"] <= MAX_REL_ERROR + 1e-4, e["name"]


def test_cli_cost_json(capsys):
    assert main(["cost", "--gpu", "a100-80gb", "--llm", "llama-2-7b", "--tp", "1",
                 "--decode-batch", "8", "--context", "1000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["time_s"] == pytest.approx(cost_model().batch_time_s([], [], [1000] * 8))
    assert {"linear_s", "attention_s", "communication_s", "overhead_s"} <= set(out)
    assert out["linear_bound"] == "memory"
    assert main(["cost", "--prefill", "2048", "--batch", "2"]) == 0
    assert "compute-bound" in capsys.readouterr().out


def test_cli_cost_errors(capsys):
    assert main(["cost", "--gpu", "nope", "--prefill", "10"]) == 2
    assert "known: a100-40gb" in capsys.readouterr().err
    assert main(["cost", "--prefill", "10", "--decode-batch", "2", "--context", "5"]) == 2
    assert main(["cost", "--prefill", "-4"]) == 2
    assert "--prefill must be" in capsys.readouterr().err
