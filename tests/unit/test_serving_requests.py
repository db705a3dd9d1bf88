"""Serving benchmarks recorded request by request (``vllm bench serve --save-detailed``
JSON, per-request CSV): read, rebuilt exactly, simulated and fitted back."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import lpserve as lp
from lpserve.cli import main
from lpserve.cost import load_calibration_file
from lpserve.evaluate.sim_to_real import simulate_run
from lpserve.trace import TraceError
from lpserve.trace import generate as G
from lpserve.trace.serving_requests import load_request_csv, load_vllm_bench_serve
from lpserve.trace.serving_runs import stage_trace

H100 = dict(gpu="h100-sxm", llm="llama-2-7b")
TRUE = {"iter_overhead_s": 3e-3, "seq_overhead_s": 8e-5, "frontend_latency_s": 0.015}


def _measured(n: int = 240, rate: float = 12.0, **cost) -> tuple[lp.Trace, dict]:
    """A Poisson workload and what a server priced by ``cost`` answered, per request."""
    tr = G.synthetic(n, arrivals=G.Poisson(rate), prompt=G.Uniform(50, 1500),
                     output=G.Uniform(2, 300), seed=5)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**H100),
                       cost=lp.cost_model(**H100, engine="vllm", **cost))
    pol = lp.make_policy("vllm", max_num_batched_tokens=2048, max_num_seqs=128,
                         schedule_ahead=True)
    return tr, lp.simulate(inst, pol).arrays


def _bench_json(path, tr, a, *, fail: int | None = None) -> None:
    """``a`` written as vllm bench serve's detailed result (client clock starts at 1000 s;
    each request's tokens streamed one chunk each)."""
    ttft, e2e = a["ttft_s"].tolist(), a["e2e_s"].tolist()
    out = tr.output_tokens.tolist()
    itls = [[(e - t) / (o - 1)] * (o - 1) for t, e, o in zip(ttft, e2e, out)]
    errors = [""] * len(tr)
    if fail is not None:
        errors[fail], ttft[fail], e2e[fail], out[fail], itls[fail] = "timeout", 0.0, 0.0, 0, []
    path.write_text(json.dumps({
        "model_id": "meta-llama/Llama-2-7b-hf", "completed": len(tr), "input_lens":
        tr.prompt_tokens.tolist(), "output_lens": out, "ttfts": ttft, "latencies": e2e,
        "itls": itls, "start_times": (1000.0 + tr.arrival_s).tolist(), "errors": errors}))


def test_bench_json_is_read_and_rebuilt_request_for_request(tmp_path):
    tr, a = _measured(**TRUE)
    _bench_json(tmp_path / "run.json", tr, a)
    (st,) = load_vllm_bench_serve(tmp_path / "run.json", gpu="h100-sxm",
                                  max_num_batched_tokens=2048, max_num_seqs=128)
    assert (st.llm, st.n_ok, st.n_failed, st.n_requests) == ("llama-2-7b", len(tr), 0, len(tr))
    assert st.measured["ttft_s"]["mean"] == pytest.approx(a["ttft_s"].mean())
    per_token = (a["e2e_s"] - a["ttft_s"]) / np.maximum(tr.output_tokens - 1, 1)
    assert st.tpot_s() == pytest.approx(per_token.mean())
    rebuilt, stage_of = stage_trace([st])
    np.testing.assert_allclose(rebuilt.arrival_s, tr.arrival_s - tr.arrival_s[0], atol=1e-9)
    np.testing.assert_array_equal(rebuilt.prompt_tokens, tr.prompt_tokens)
    np.testing.assert_array_equal(rebuilt.output_tokens, tr.output_tokens)
    assert (stage_of == 0).all()
    # the same server settings and profile reproduce every figure
    (row,) = simulate_run([st], engine="vllm", **TRUE)
    for k in ("e2e_s.mean", "e2e_s.p90", "ttft_s.mean", "ttft_s.p90", "itl_s.mean"):
        assert row.ape(k) < 1e-6, (k, row.real[k], row.sim[k])


def test_csv_gives_the_same_stage_as_the_json(tmp_path):
    tr, a = _measured(n=60, **TRUE)
    _bench_json(tmp_path / "run.json", tr, a)
    with open(tmp_path / "run.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s", "ok"])
        for i in range(len(tr)):
            w.writerow([tr.arrival_s[i], tr.prompt_tokens[i], tr.output_tokens[i],
                        a["ttft_s"][i], a["e2e_s"][i], 1])
    (j,) = load_vllm_bench_serve(tmp_path / "run.json", gpu="h100-sxm")
    (c,) = load_request_csv(tmp_path / "run.csv", gpu="h100-sxm", llm="llama-2-7b")
    for k in ("e2e_s", "ttft_s", "tpot_s"):
        assert c.measured[k] == pytest.approx(j.measured[k]), k
    assert c.requests["prompt_tokens"] == j.requests["prompt_tokens"]
    np.testing.assert_allclose(c.requests["offset_s"], j.requests["offset_s"], atol=1e-9)


def test_failed_requests_are_counted_and_left_out(tmp_path):
    tr, a = _measured(n=40)
    _bench_json(tmp_path / "run.json", tr, a, fail=7)
    (st,) = load_vllm_bench_serve(tmp_path / "run.json", gpu="h100-sxm")
    assert (st.n_ok, st.n_failed, st.n_requests) == (39, 1, 39) and st.overloaded
    ok = np.arange(40) != 7
    assert st.measured["e2e_s"]["mean"] == pytest.approx(a["e2e_s"][ok].mean())


def test_errors_name_the_file_field_and_request(tmp_path):
    tr, a = _measured(n=10)
    _bench_json(tmp_path / "run.json", tr, a)
    doc = json.loads((tmp_path / "run.json").read_text())
    cases = [({"start_times": None}, "field 'start_times' is missing or not a list"),
             ({"ttfts": doc["ttfts"][:5]}, "field 'ttfts' has 5 entries, 'input_lens' 10"),
             ({"latencies": [-1.0] * 10}, "request 0: e2e must be a positive number"),
             ({"input_lens": [1.5] * 10}, r"field 'input_lens'\[0\] must be a non-negative"),
             ({"model_id": "acme/secret-13b"}, "'acme/secret-13b' has no catalog entry"),
             ({"errors": ["x"] * 10}, "no successful request")]
    for change, msg in cases:
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**doc, **change}))
        with pytest.raises(TraceError, match=msg):
            load_vllm_bench_serve(bad, gpu="h100-sxm")
    (tmp_path / "bad.csv").write_text("arrival_s,prompt_tokens,ttft_s\n0,10,0.1\n")
    with pytest.raises(TraceError, match=r"missing columns \['output_tokens', 'e2e_s'\]"):
        load_request_csv(tmp_path / "bad.csv", gpu="h100-sxm", llm="llama-2-7b")
    (tmp_path / "bad.csv").write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n"
                                      "0,10,5,0.1,0.3\n1,ten,5,0.1,0.3\n")
    with pytest.raises(TraceError, match="line 3, column 'prompt_tokens': not a number"):
        load_request_csv(tmp_path / "bad.csv", gpu="h100-sxm", llm="llama-2-7b")


def test_cli_errors_for_request_files(tmp_path, capsys):
    (tmp_path / "run.csv").write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n")
    assert main(["calibrate", "--serving", str(tmp_path / "run.csv"), "--gpu",
                 "h100-sxm"]) == 2
    assert "needs --llm" in capsys.readouterr().err
    assert main(["calibrate", "--serving", str(tmp_path / "run.csv"), "--gpu", "h100-sxm",
                 "--llm", "llama-2-7b", "--max-num-seqs", "-3"]) == 2
    assert "--max-num-seqs must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_calibrate_recovers_known_parameters_from_bench_jsons(tmp_path, capsys):
    """Two loads (one benchmark each: per-iteration and per-sequence costs separate only
    across batch sizes) fitted back to the parameters that made them."""
    files = []
    for rate in (4.0, 16.0):
        tr, a = _measured(n=int(40 * rate), rate=rate, **TRUE)
        files += ["--serving", str(tmp_path / f"rate{rate:g}.json")]
        _bench_json(tmp_path / f"rate{rate:g}.json", tr, a)
    out = tmp_path / "mine.toml"
    fit = ",".join(k for k in TRUE if k != "frontend_latency_s")
    assert main(["calibrate", *files, "--gpu", "h100-sxm", "--fit", fit,
                 "--max-num-batched-tokens", "2048", "--max-num-seqs", "128",
                 "--max-stage-s", "0", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    entry = load_calibration_file(out)[0]
    for k, v in TRUE.items():
        assert entry[k] == pytest.approx(v, rel=0.02), (k, entry[k])
    assert all(report["after"][k] < 1.0 for k in ("e2e_s.mean", "ttft_s.mean", "itl_s.mean"))
