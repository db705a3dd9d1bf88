"""``lpserve simulate`` CLI."""
from __future__ import annotations

import json

from lpserve.cli import main


def test_simulate_json_has_design_keys(capsys):
    rc = main(["simulate", "--policy", "vllm", "--replicas", "2", "--head", "60",
               "--rate-scale", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for k in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        assert set(out[k]) == {"mean", "p50", "p90", "p99"}
    for k in ("throughput_rps", "goodput_rps", "prefix_hit_rate", "n_requests", "n_finished",
              "n_rejected", "wall_s", "kv_utilization"):
        assert k in out
    assert out["n_requests"] == 60 and out["n_finished"] == 60


def test_simulate_unknown_policy_lists_registered(capsys):
    rc = main(["simulate", "--policy", "nope", "--json"])
    assert rc == 2
    out = json.loads(capsys.readouterr().out)
    assert "vllm" in out["error"] and "sarathi" in out["error"]


def test_simulate_text_output(capsys):
    assert main(["simulate", "--policy", "sarathi", "--head", "30"]) == 0
    text = capsys.readouterr().out
    assert "ttft_s" in text and "throughput" in text


def test_simulate_on_a_mixed_cluster(capsys):
    rc = main(["simulate", "--policy", "vllm+dynamo-kv", "--mix", "a100-80gb:1,a100-40gb:1:2",
               "--head", "40", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_finished"] == 40
    assert out["cluster"]["groups"] == [{"gpu": "a100-80gb", "count": 1, "tp": 1},
                                        {"gpu": "a100-40gb", "count": 1, "tp": 2}]
    assert main(["simulate", "--policy", "vllm", "--mix", "a100-80gb", "--json"]) == 2
    assert "GPU:COUNT" in json.loads(capsys.readouterr().out)["error"]
    assert main(["simulate", "--policy", "vllm", "--mix", "a100-80gb:2", "--replicas", "3",
                 "--json"]) == 2
    assert "--replicas 3 conflicts with --mix" in json.loads(capsys.readouterr().out)["error"]
