"""Capacity search and the stability predictor's arithmetic (lpserve/evaluate/capacity.py,
lpserve/evaluate/stability.py; models/stability.md)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import lpserve as lp
from lpserve.evaluate.capacity import bisect_capacity, capacity, meets_slo
from lpserve.evaluate.stability import kv_token_iterations, predict_capacity, queue_growth


@pytest.mark.parametrize("threshold,start", [(1.7, 1.0), (0.013, 1.0), (40.0, 3.0)])
def test_bisection_finds_a_monotone_threshold_within_tolerance(threshold, start):
    out = bisect_capacity(lambda x: x <= threshold, start=start, rel_tol=0.01)
    assert out["capacity"] <= threshold < out["x_hi"]
    assert out["x_hi"] / out["capacity"] <= 1.01 + 1e-12
    assert out["monotone_violations"] == 0


def test_bisection_reports_non_monotone_answers():
    # met up to 1, missed on (0.6, 0.8): the search stops near 1, the re-check at half of
    # it passes and the one at 3/4 misses
    out = bisect_capacity(lambda x: x <= 1.0 and not 0.6 < x < 0.8, start=1.0,
                          rel_tol=0.01, check_below=(0.5, 0.75))
    assert out["capacity"] == 1.0 and out["monotone_violations"] == 1
    assert bisect_capacity(lambda x: True)["capacity"] == math.inf
    assert bisect_capacity(lambda x: False)["capacity"] == 0.0


def test_meets_slo_counts_unfinished_requests_as_misses():
    n = 200
    a = {"first_token_s": np.r_[np.ones(n - 3), np.full(3, np.nan)],
         "ttft_s": np.r_[np.full(n - 3, 0.5), np.full(3, np.nan)],
         "tpot_s": np.full(n, 0.05), "status": np.array(["finished"] * (n - 3) + ["waiting"] * 3)}
    ok, q_tt, q_tp = meets_slo(SimpleNamespace(arrays=a), 1.0, 0.1)
    assert not ok and math.isinf(q_tt) and q_tp == pytest.approx(0.05)
    a["first_token_s"][-3:] = 1.0
    a["ttft_s"][-3:] = 0.9
    assert meets_slo(SimpleNamespace(arrays=a), 1.0, 0.1)[0]


def _brute(s, o, chunk, bt):
    total, iters = 0, 0
    done = 0
    while done < s:  # prefill chunks
        done = min(s, done + (chunk or s))
        total += bt * -(-done // bt)
        iters += 1
    for j in range(1, o):
        total += bt * -(-(s + j) // bt)
        iters += 1
    return total, iters


@pytest.mark.parametrize("chunk,bt", [(None, 1), (None, 16), (100, 16), (7, 1)])
def test_kv_token_iterations_matches_iteration_by_iteration_count(chunk, bt):
    rng = np.random.default_rng(0)
    s, o = rng.integers(1, 400, 50), rng.integers(1, 60, 50)
    g, L = kv_token_iterations(s, o, chunk_tokens=chunk, block_tokens=bt)
    for k in range(50):
        assert (int(g[k]), int(L[k])) == _brute(int(s[k]), int(o[k]), chunk, bt)
    g2, _ = kv_token_iterations(s, o, chunk_tokens=chunk, block_tokens=bt,
                                reserve_tokens=100)
    assert np.array_equal(g2, L * bt * -(-100 // bt))


def test_unit_round_prediction_is_memory_over_mean_g():
    s, o = np.array([10, 20]), np.array([5, 3])
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 1.0], prompt_tokens=s, output_tokens=o)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                       cost=lp.UnitRoundCost(memory_tokens=1000))
    p = predict_capacity(inst, lp.make_policy("vllm-chunked", watermark=0.0))
    g = (5 * 10 + 10) + (3 * 20 + 3)        # sum_{j<o} (s + j)
    assert p["binding"] == "memory" and p["batch_time_s"] == 1.0
    assert p["rate_rps"] == pytest.approx(1000 / (g / 2))


def test_queue_growth_slope():
    t = np.linspace(0, 100, 1001)
    grow = {"arrival_s": t, "finish_s": t + 0.5 * t, "status": np.array(["finished"] * t.size)}
    flat = {"arrival_s": t, "finish_s": t + 1.0, "status": np.array(["finished"] * t.size)}
    g = queue_growth(SimpleNamespace(arrays=grow))
    assert g["relative"] == pytest.approx(1 - 1 / 1.5, abs=0.01)
    assert abs(queue_growth(SimpleNamespace(arrays=flat))["relative"]) < 1e-3


def test_capacity_replications_and_interval():
    rng = np.random.default_rng(1)
    insts = []
    for _ in range(2):
        n = 80
        tr = lp.Trace.from_arrays(arrival_s=np.cumsum(rng.exponential(1 / 0.3, n)),
                                  prompt_tokens=rng.integers(4, 16, n),
                                  output_tokens=rng.integers(4, 24, n))
        insts.append(lp.Instance(trace=tr, cost=lp.UnitRoundCost(memory_tokens=256),
                                 cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                                 slo=lp.SLO(ttft_s=20.0, tpot_s=5.0)))
    res = capacity(insts, "vllm-chunked", rel_tol=0.1, check_below=(0.5,))
    assert len(res.per_replication) == 2 and res.min_load <= res.load <= res.max_load
    assert res.ci[0] <= res.load <= res.ci[1]
    assert res.monotone_violations == 0
    for r in res.runs:   # every recorded run is consistent with the returned capacities
        cap = res.per_replication[r["replication"]]
        assert r["met"] == (r["load"] <= cap)
    with pytest.raises(ValueError, match="finite SLO"):
        capacity(insts[0].with_(slo=lp.SLO()), "vllm")


def test_capacity_cli_takes_engine_parameters_and_a_predictor(capsys):
    import json

    from lpserve.cli import main

    base = ["capacity", "--head", "40", "--replications", "1", "--slo-ttft", "5",
            "--slo-tpot", "0.5", "--rel-tol", "0.5", "--json"]
    assert main(base + ["--policy", "sjf-predicted"]) == 2
    assert "--predictor" in json.loads(capsys.readouterr().out)["error"]
    assert main(base + ["--policy", "sjf-predicted", "--predictor", "history",
                        "--engine", "max_num_seqs=64"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["engine"] == {"max_num_seqs": 64} and d["predictor"] == "history"
    assert d["runs"] and all("met" in r for r in d["runs"])  # the search ran with them
    assert main(base + ["--policy", "vllm", "--engine", "vllm:max_num_seqs=4"]) == 2
    assert "KEY=VALUE" in json.loads(capsys.readouterr().out)["error"]
