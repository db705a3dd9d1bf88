"""``lpserve simulate`` with engine parameters, a predictor and a utilisation."""
from __future__ import annotations

import json

import pytest

from lpserve.cli import main

BASE = ["simulate", "--head", "60", "--replicas", "2", "--json"]


def test_engine_and_utilization(capsys):
    assert main(BASE + ["--policy", "vllm-v0", "--engine", "max_num_batched_tokens=2048",
                        "--utilization", "0.5"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["engine"] == {"max_num_batched_tokens": 2048}
    assert d["utilization"] == pytest.approx(0.5)
    assert d["n_rejected"] > 0 and "prompt_exceeds_token_budget" in d["reasons"]
    import lpserve as lp

    base_rate = lp.bundled_trace().head(60).rate_per_s
    assert d["capacity"]["trace_rate_rps"] == pytest.approx(d["rate_scale"] * base_rate)
    assert d["capacity"]["trace_rate_rps"] == pytest.approx(0.5 * d["capacity_rps"])


def test_predictor_is_required_and_used(capsys):
    assert main(BASE + ["--policy", "sjf-predicted"]) == 2
    assert "--predictor" in json.loads(capsys.readouterr().out)["error"]
    assert main(BASE + ["--policy", "sjf-predicted", "--predictor", "history"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["predictor"] == "history" and d["n_finished"] == 60


@pytest.mark.parametrize("extra, words", [
    (["--engine", "max_num_seqs=0"], ["--engine", "max_num_seqs must be a positive"]),
    (["--engine", "vllm:max_num_seqs=4"], ["KEY=VALUE"]),
    (["--utilization", "0.5", "--rate-scale", "2"], ["--utilization", "--rate-scale"]),
])
def test_bad_options(capsys, extra, words):
    assert main(BASE + ["--policy", "vllm"] + extra) == 2
    err = json.loads(capsys.readouterr().out)["error"]
    assert all(w in err for w in words), err
