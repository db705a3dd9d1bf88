"""``lpserve gap`` as a research task in one command: engine parameters per policy, a
predictor, load as utilisation, rejections as a column and loud warnings, progress on
stderr, and checkpoints that make an interrupted run resume with the same table."""
from __future__ import annotations

import csv
import json

import pytest

from lpserve.cli import main

BASE = ["gap", "--trace", "mooncake-conv-5min", "--duration", "10", "--windows", "1",
        "--gpu", "h100-sxm", "--llm", "llama-3-8b", "--replicas", "2",
        "--policies", "vllm,sarathi,sjf-predicted", "--predictor", "history"]
SERVE_ALL = ["--engine", "vllm,sjf-predicted:max_num_batched_tokens=131072"]


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_engine_parameters_make_every_policy_serve_every_request(tmp_path, capsys):
    args = BASE + SERVE_ALL + ["--load-unit", "utilization", "--loads", "0.3",
                               "--load", "0.3", "--out", str(tmp_path), "--json"]
    assert main(args) == 0
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert not [x for x in cap.err.splitlines() if x.startswith("[")]  # quiet with --json
    assert d["engine"] == {"vllm": {"max_num_batched_tokens": 131072},
                           "sjf-predicted": {"max_num_batched_tokens": 131072}}
    assert d["predictor"] == "history" and d["load_unit"] == "utilization"
    n = d["table"][0]["n_requests"]
    for row in d["table"] + d["sweep"]:
        assert row["n_rejected"] == 0 and row["n_finished"] == n == row["n_compared"]
    assert {round(r["utilization"], 9) for r in d["sweep"]} == {0.3}
    cap = next(iter(d["capacity"].values()))
    for r in d["sweep"]:
        assert r["rate_scale"] == pytest.approx(r["utilization"] * cap["capacity_rps"]
                                                / cap["trace_rate_rps"])
    # only the context-length warning: Mooncake prompts exceed Llama-3-8B's 8,192 tokens
    assert len(d["warnings"]) == 1 and "context length 8,192" in d["warnings"][0]
    desc = {r["policy"]: r["description"] for r in d["table"]}
    assert "131072 tokens/iteration" in desc["vllm"]
    assert "512 tokens/iteration" in desc["sarathi"]  # an engine baseline keeps its engine
    src = {r["policy"]: r["engine_from"] for r in d["table"]}
    assert src["vllm"] == "own + given" and src["sarathi"] == "own"


def test_rejections_are_a_column_and_a_warning(tmp_path, capsys):
    # vLLM V0 (no chunked prefill) rejects the prompts above its 4,096-token budget;
    # sarathi chunks them and serves every request
    assert main(BASE + ["--policies", "vllm-v0,sarathi,sjf-predicted", "--loads", "1.0",
                        "--out", str(tmp_path), "--no-checkpoint", "--quiet"]) == 0
    cap = capsys.readouterr()
    assert not [x for x in cap.err.splitlines() if x.startswith("[")]  # no progress lines
    head = next(x for x in cap.out.splitlines() if x.startswith("policy") and "ratio" in x)
    assert "rejected" in head
    v0 = next(x for x in cap.out.splitlines() if x.startswith("vllm-v0 "))
    rejected = int(v0.split()[-5].replace(",", ""))
    assert rejected > 0
    assert "WARNING: vllm-v0 rejected" in cap.err and "WARNING: vllm-v0 rejected" in cap.out
    assert "max_num_batched_tokens" in cap.err
    md = (tmp_path / "gap_table.md").read_text()
    assert "## Warnings" in md and "| rejected |" in md.replace(" rejected |", " rejected |")
    with open(tmp_path / "gap_table.csv") as f:
        rows = {r["policy"]: r for r in csv.DictReader(f)}
    n = int(rows["vllm-v0"]["n_requests"])
    assert all(int(r["n_compared"]) == n - rejected for r in rows.values())
    # the optimality interval places sarathi, which served every request, by its total
    # over all of them (not over the fewer requests every policy served)
    with open(tmp_path / "interval.csv") as f:
        lower = float(next(csv.DictReader(f))["lower_mean_s"])
    assert int(rows["sarathi"]["n_finished"]) == n
    assert float(rows["sarathi"]["served_total_latency_s"]) >= lower * n


def test_a_prediction_reader_needs_a_predictor(tmp_path, capsys):
    args = [a for a in BASE if a not in ("--predictor", "history")]
    assert main(args + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "sjf-predicted" in err and "--predictor" in err and "Traceback" not in err


@pytest.mark.parametrize("extra, words", [
    (["--engine", "vllm:max_num_batched_tokens=many"], ["--engine", "integer"]),
    (["--engine", "orca:max_num_seqs=4"], ["'orca' is not among the policies"]),
    (["--engine", "budget=4"], ["unknown engine parameter 'budget'"]),
    (["--predictor", "oracl"], ["--predictor", "unknown predictor 'oracl'"]),
])
def test_bad_engine_and_predictor_exit_2(tmp_path, capsys, extra, words):
    assert main(BASE + extra + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


@pytest.mark.slow
def test_checkpoints_resume_with_the_same_table_and_progress(tmp_path, capsys):
    common = [a if a != "vllm,sarathi,sjf-predicted" else "vllm,sarathi" for a in BASE] + \
        ["--engine", "vllm:max_num_batched_tokens=131072"]
    fresh = tmp_path / "fresh"
    assert main(common + ["--loads", "1.0,1.5", "--out", str(fresh), "--no-checkpoint",
                          "--quiet"]) == 0
    ck = tmp_path / "ck"
    # a run that stopped after the first load, then the whole run from its checkpoints
    assert main(common + ["--loads", "1.0", "--out", str(tmp_path / "part"),
                          "--checkpoint", str(ck), "--quiet"]) == 0
    capsys.readouterr()
    assert main(common + ["--loads", "1.0,1.5", "--out", str(tmp_path / "whole"),
                          "--checkpoint", str(ck)]) == 0
    cap = capsys.readouterr()
    assert "2 of 4 runs loaded" in cap.out
    # one line per run on stderr (no terminal here): loaded runs say so, with time left
    lines = [x for x in cap.err.splitlines() if x.startswith("[")]
    assert len(lines) == 4 and lines[-1].startswith("[4/4 runs")
    assert lines[0].endswith("(checkpoint)") and "left]" in lines[2] and "e2e mean" in lines[2]

    def table(folder, name):
        with open(folder / name) as f:
            return [{k: v for k, v in r.items() if k not in ("wall_s", "from_checkpoint")}
                    for r in csv.DictReader(f)]

    for name in ("gap_table.csv", "runs.csv"):
        assert table(tmp_path / "whole", name) == table(fresh, name)


def test_progress_eta_leaves_out_runs_loaded_from_checkpoints(capsys):
    from lpserve.commands.runopts import Reporter

    row = {"policy": "vllm", "e2e_s_mean": 1.0, "n_finished": 100, "n_rejected": 0,
           "n_requests": 100, "wall_s": 2.0}
    rep = Reporter(300, 3, "test")
    rep.on_requests(100)
    rep.on_result({**row, "from_checkpoint": True})  # no time spent: no rate to estimate
    rep.t0 -= 10.0                                    # then 10 s for half of the rest
    rep.on_requests(100)
    rep.on_result({**row, "from_checkpoint": False})
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[")]
    assert "~? left" in lines[0] and "(checkpoint)" in lines[0]
    assert "0:10 elapsed, ~0:10 left" in lines[1]    # not ~0:05 (as if 2/3 were done in 10 s)
