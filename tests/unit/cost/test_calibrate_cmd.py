"""``lpserve calibrate``: recovery of known parameters, a real vLLM benchmark file, errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lpserve.cli import main
from lpserve.cost import cost_model, load_calibration_file
from lpserve.cost.measure import MeasurementError, read_iterations_csv, read_vllm_benchmark_json

FIXTURE = Path(__file__).parents[2] / "fixtures" / "vllm_bench" / \
    "vllm_docs_hermes3_llama31_8b_sharegpt10.json"
PAIR = dict(gpu="h100-sxm", llm="llama-3.1-8b", tp=1, engine="vllm")
CHANGED = {"eff_weights": 0.85, "eff_compute": 0.9, "eff_attn": 0.9, "eff_kv": 0.9,
           "layer_overhead_s": 1.6, "seq_overhead_s": 0.5}


# overheads the default profile has at (nearly) 0 are moved from this value instead, so
# that the truth's overheads are large enough to show in the iteration times
FLOOR_S = {"layer_overhead_s": 1e-5, "seq_overhead_s": 1e-5}


def _truth():
    start = cost_model(**PAIR)
    values = dict(start.values)
    for k, f in CHANGED.items():
        values[k] = min(values[k] * f, 1.0) if k.startswith("eff_") else \
            max(values[k], FLOOR_S[k]) * f
    return start, cost_model(**PAIR, **values)


def _fmt(xs) -> str:
    return ";".join(str(int(x)) for x in xs)


def test_recovers_known_parameters_from_a_csv_of_iterations(tmp_path, capsys):
    start, truth = _truth()
    rng = np.random.default_rng(0)
    lines = ["time_ms,prefill_tokens,prefill_cached,decode_context"]
    for _ in range(80):
        n_pre, n_dec = rng.integers(0, 3), rng.integers(0, 96)
        if n_pre + n_dec == 0:
            n_dec = 1
        pre = rng.integers(32, 8192, size=n_pre)
        cached = rng.integers(0, 4096, size=n_pre)
        dec = rng.integers(16, 16000, size=n_dec)
        t = truth.batch_time_s(pre, cached, dec)
        lines.append(f"{t * 1e3!r},{_fmt(pre)},{_fmt(cached)},{_fmt(dec)}")
    csv_path, out = tmp_path / "iters.csv", tmp_path / "mine.toml"
    csv_path.write_text("\n".join(lines) + "\n")
    assert main(["calibrate", "--csv", str(csv_path), "--gpu", "h100-sxm", "--llm",
                 "llama-3.1-8b", "--engine", "vllm", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fitted = {m["parameter"] for m in report["moved"]}
    assert set(CHANGED) <= fitted
    entry = load_calibration_file(out)[0]
    for k in CHANGED:
        assert entry[k] == pytest.approx(truth.values[k], rel=0.02), k
    assert report["after"]["mixed"]["max_abs"] < 1e-3 < report["before"]["mixed"]["max_abs"]
    # the saved file is a calibration lp.cost_model loads
    mine = cost_model(gpu="h100-sxm", llm="llama-3.1-8b", calibration=str(out))
    assert mine.engine == "vllm" and mine.calibration["name"] == "user-h100-sxm-llama-3.1-8b"
    assert mine.batch_time_s([3000], [0], [900] * 20) == pytest.approx(
        truth.batch_time_s([3000], [0], [900] * 20), rel=0.01)


def test_recovers_known_parameters_from_a_one_at_a_time_vllm_benchmark(tmp_path):
    """A detailed result at max_concurrency 1: each TTFT is one prefill, each ITL one decode
    iteration of a batch of one."""
    start, truth = _truth()
    rng = np.random.default_rng(1)
    doc = {"max_concurrency": 1, "input_lens": [], "output_lens": [], "ttfts": [], "itls": [],
           "errors": []}
    for _ in range(24):
        inp, out = int(rng.integers(16, 6000)), int(rng.integers(2, 60))
        doc["input_lens"].append(inp)
        doc["output_lens"].append(out)
        doc["ttfts"].append(truth.batch_time_s([inp], [0], []))
        doc["itls"].append([truth.batch_time_s([], [], [inp + k]) for k in range(1, out)])
        doc["errors"].append("")
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    rows = read_vllm_benchmark_json(path)
    from lpserve.cost.measure import calibrate_to

    res = calibrate_to(rows, "h100-sxm", "llama-3.1-8b", engine="vllm")
    fitted = [k for k, _, _ in res["moved"]]
    assert "seq_overhead_s" not in fitted  # batches of one: not identified, left alone
    for k in fitted:
        if k in CHANGED:
            assert res["entry"][k] == pytest.approx(truth.values[k], rel=0.02), k
    assert {"eff_weights", "eff_compute", "layer_overhead_s"} <= set(fitted)
    assert res["after"]["decode"]["max_abs"] < 1e-3


def test_runs_on_a_real_vllm_benchmark_json(tmp_path, capsys):
    out = tmp_path / "docs.toml"
    assert main(["calibrate", "--vllm-json", str(FIXTURE), "--gpu", "h100-sxm", "--llm",
                 "llama-3.1-8b", "--engine", "vllm", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "parameters that moved" in text and "decode" in text and "prefill" in text
    mine = cost_model(gpu="h100-sxm", llm="llama-3.1-8b", calibration=str(out))
    doc = json.loads(FIXTURE.read_text())
    batch = round(doc["output_throughput"] * doc["mean_itl_ms"] * 1e-3)
    ctx = round(1369 / 10 + 2212 / 10 / 2)
    itl = mine.batch_time_s([], [], [ctx] * batch)
    assert itl == pytest.approx(doc["mean_itl_ms"] * 1e-3, rel=0.05)
    assert mine.batch_time_s([137] * 10, [0] * 10, []) == pytest.approx(
        doc["mean_ttft_ms"] * 1e-3, rel=0.05)


def test_timeline_rows_rebuild_the_running_batch(tmp_path):
    """Two overlapping requests: their gaps are iterations of a batch of two."""
    doc = {"input_lens": [100, 50], "output_lens": [3, 3], "ttfts": [0.010, 0.012],
           "itls": [[0.005, 0.005], [0.005, 0.005]], "start_times": [0.0, 0.003],
           "errors": ["", ""]}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    rows = read_vllm_benchmark_json(path)
    gaps = [r for r in rows if "itls" in r["point"]]
    assert len(gaps) == 4
    first = next(r for r in gaps if r["point"].endswith("itls[0][0]"))
    assert first["decode_list"] == [101] and first["prefill_list"] == [50]  # 2nd prefills
    later = next(r for r in gaps if r["point"].endswith("itls[1][0]"))
    assert sorted(later["decode_list"]) == [51, 102]


@pytest.mark.parametrize("content,message", [
    ("prefill_tokens,decode_context\n512,\n", "needs a 'time_ms'"),
    ("time_ms,decode_context\n5.0,100;x\n", "line 2, field 'decode_context': 'x'"),
    ("time_ms,prefill_tokens,prefill_cached\n5.0,512;256,0\n", "line 2, field 'prefill_cached'"),
    ("time_ms,decode_context\n-1,100\n", "line 2, field 'time_ms': must be > 0"),
    ("time_ms,decode_context\n3.0,\n", "line 2: an iteration needs"),
])
def test_bad_csv_files_name_file_line_and_field(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(MeasurementError, match=message):
        read_iterations_csv(path)


@pytest.mark.parametrize("doc,message", [
    ('{"completed": 10,\n "oops"}', "line 2, column"),
    ({"completed": 10, "total_input_tokens": 5}, "field 'total_output_tokens' is missing"),
    ({"input_lens": [1, 2], "output_lens": [1], "ttfts": [0.1, 0.1], "itls": [[], []]},
     "field 'output_lens' has 1 entries"),
    ({"input_lens": [1], "output_lens": [2], "ttfts": [0.1], "itls": [[0.1]],
      "max_concurrency": 4}, "field 'start_times' is missing"),
])
def test_bad_benchmark_files_name_file_and_field(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(MeasurementError, match=message):
        read_vllm_benchmark_json(path)


def test_cli_reports_bad_files_and_calibration_files_errors(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("time_ms,decode_context\n5.0,abc\n")
    assert main(["calibrate", "--csv", str(bad), "--gpu", "h100-sxm", "--llm", "llama-3.1-8b"]) == 2
    assert "line 2, field 'decode_context'" in capsys.readouterr().err
    toml = tmp_path / "c.toml"
    toml.write_text('[[calibration]]\nname = "x"\ngpu = "h100-sxm"\nllm = "llama-3.1-8b"\n'
                    'engine = "vllm"\neff_weights = "fast"\n')
    with pytest.raises(ValueError, match="entry 0 .* field 'eff_weights' must be a finite number"):
        cost_model(gpu="h100-sxm", llm="llama-3.1-8b", calibration=str(toml))
    toml.write_text('[[calibration]]\nname = "x"\ngpu = "h100-sxm"\nllm = "llama-3.1-8b"\n'
                    'engine = "vllm"\neff_weights = 0.7\n')
    assert cost_model(gpu="h100-sxm", llm="llama-3.1-8b", calibration=str(toml)).values[
        "eff_weights"] == 0.7  # the rest from the vllm profile
    with pytest.raises(LookupError, match="has no entry for gpu 'a100-80gb'"):
        cost_model(gpu="a100-80gb", llm="llama-3.1-8b", calibration=str(toml))


def test_cli_cost_takes_an_engine_and_a_calibration_file(tmp_path, capsys):
    assert main(["cost", "--gpu", "h100-sxm", "--llm", "llama-3.1-8b", "--engine", "trtllm",
                 "--decode-batch", "1", "--context", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "trtllm" and out["calibration"] == "trtllm-h100"
    assert main(["cost", "--gpu", "mi300x", "--llm", "qwen3-32b", "--tp", "2", "--engine",
                 "trtllm", "--prefill", "10"]) == 2
    assert "does not run on amd GPUs" in capsys.readouterr().err
