"""``lpserve gap`` on a small slice: the table, the report folder, JSON keys, and the bound
assertion (exit status 3 on a deliberately invalid bound)."""
from __future__ import annotations

import csv
import json

import pytest

from lpserve.cli import main

SMALL = ["gap", "--no-interval", "--duration", "30", "--windows", "2", "--loads", "1.0,1.5",
         "--policies", "vllm,vllm+least-outstanding,sarathi"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """One text run shared by the tests below (capsys is function-scoped: capture by hand)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("report")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(SMALL + ["--out", str(out)])
    return rc, buf.getvalue(), out


def test_gap_prints_the_table_and_robustness(text_run):
    rc, text, _ = text_run
    assert rc == 0
    lines = text.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("policy") and "ratio" in x)
    assert "TTFT mean s" in lines[head] and "TPOT mean s" in lines[head] and \
        "E2E mean s" in lines[head] and "goodput req/s" in lines[head] and \
        "P99/P50" in lines[head] and "hit rate" in lines[head]
    assert lines[head + 1].startswith("lower bound: cost-bound")
    rows = {x.split()[0]: x.split() for x in lines[head + 2:head + 5]}
    assert set(rows) == {"vllm", "vllm+least-outstanding", "sarathi"}
    for r in rows.values():
        ratio = float(r[-2])
        assert ratio >= 1.0
    assert "30-s window" in text and "of azure-conv-10min" in text
    assert "robustness: e2e_s_mean over the cases" in text
    rob = lines.index(next(x for x in lines if x.startswith("robustness:")))
    assert lines[rob + 1].split()[:2] == ["policy", "cases"]
    assert [x.split()[1] for x in lines[rob + 2:rob + 5]] == ["4", "4", "4"]
    assert "wall" in text


def test_gap_writes_the_report_folder(text_run):
    rc, _, out = text_run
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == ["gap_to_bound.png", "latency_cdf.png",
                                      "latency_vs_load.png"]
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == PNG and len(data) > 10_000
    md = (out / "gap_table.md").read_text()
    assert "| policy | kind | TTFT mean (s)" in md and "lower bound: cost-bound" in md
    assert "![latency CDF](latency_cdf.png)" in md
    with open(out / "gap_table.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["policy"] for r in rows] == ["vllm", "vllm+least-outstanding", "sarathi"]
    assert all(float(r["ratio_to_bound"]) >= 1.0 for r in rows)
    with open(out / "runs.csv") as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 2 * 2 * 3  # windows x loads x policies
    assert {r["load"] for r in runs} == {"1.0", "1.5"}
    assert (out / "robustness.csv").is_file()


def test_gap_json_keys(tmp_path, capsys):
    assert main(SMALL + ["--windows", "1", "--loads", "1.0", "--out", str(tmp_path),
                         "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("trace", "workload", "cluster", "slo", "load", "loads", "policies", "bounds",
                "table", "robustness", "sweep", "report", "wall_s"):
        assert key in d, key
    assert d["policies"] == ["vllm", "vllm+least-outstanding", "sarathi"]
    row = d["table"][0]
    for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        assert set(row[key]) == {"mean", "p50", "p90", "p99"}
    for key in ("throughput_rps", "goodput_rps", "prefix_hit_rate", "n_requests",
                "n_finished", "n_rejected", "ratio_to_bound", "bound_value",
                "e2e_s_p99_over_p50"):
        assert key in row, key
    assert row["ratio_to_bound"] == pytest.approx(row["e2e_s"]["mean"] / row["bound_value"])
    assert d["bounds"]["values"]["cost-bound"]["e2e_s_mean"] > 0
    assert len(d["report"]["files"]) >= 7
    assert sum(f.endswith(".png") for f in d["report"]["files"]) == 3


def test_metric_option_sets_the_ratio(tmp_path, capsys):
    assert main(SMALL + ["--windows", "1", "--loads", "1.0", "--metric", "ttft_s_p99",
                         "--out", str(tmp_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["metric"] == "ttft_s_p99"
    for row in d["table"]:
        assert row["ratio_to_bound"] == pytest.approx(row["ttft_s"]["p99"] / row["bound_value"])
        assert 0 < row["bound_value"] <= row["ttft_s"]["p99"]


def test_invalid_bound_is_asserted_with_exit_3(tmp_path, capsys):
    args = SMALL + ["--windows", "1", "--loads", "1.0", "--out", str(tmp_path),
                    "--check-bound", "e2e_s_mean=1000"]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "bound violated" in err and "'claimed'" in err and "e2e_s_mean" in err
    assert "'vllm'" in err and "1000" in err and "Traceback" not in err
    assert main(args + ["--json"]) == 3
    d = json.loads(capsys.readouterr().out)
    assert d["bound"] == "claimed" and d["policy"] == "vllm" and d["metric"] == "e2e_s_mean"
    assert d["bound_value"] == 1000 and d["policy_value"] < 1000
    # a valid claimed bound passes and becomes the best bound where it is larger
    assert main(SMALL[:-2] + ["--policies", "vllm", "--windows", "1", "--loads", "1.0",
                              "--out", str(tmp_path), "--check-bound", "e2e_s_mean=0.5",
                              "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["table"][0]
    assert row["bound_name"] == "cost-bound" and row["bound_value"] > 0.5


@pytest.mark.parametrize("extra, message", [
    (["--loads", "0,1"], "--loads must hold numbers > 0"),
    (["--loads", "a"], "--loads must be comma-separated numbers"),
    (["--policies", "nope"], "unknown policies ['nope']"),
    (["--check-bound", "e2e_s_mean"], "METRIC=VALUE"),
    (["--check-bound", "latency=1"], "unknown metric key"),
    (["--duration", "-5"], "--duration: must be a finite number > 0"),
    (["--windows", "0"], "--windows: must be an integer >= 1"),
    (["--seeds", "-1"], "--seeds: must be comma-separated integers >= 0"),
    (["--policies", ","], "--policies: must be comma-separated names"),
    (["--bounds", "nope"], "unknown bound 'nope'"),
    (["--metric", "latency"], "--metric must be one of"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, extra, message):
    assert main(SMALL + ["--out", str(tmp_path)] + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_gap_on_a_mixed_cluster(tmp_path, capsys):
    assert main(SMALL + ["--mix", "a100-80gb:1,a100-40gb:1", "--windows", "1", "--loads",
                         "1.0", "--policies", "vllm+dynamo-kv,lp-locality", "--out",
                         str(tmp_path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cluster"]["groups"][1]["gpu"] == "a100-40gb"
    assert [r["policy"] for r in d["table"]] == ["vllm+dynamo-kv", "lp-locality"]
    assert all(r["ratio_to_bound"] >= 1.0 for r in d["table"])


def test_gap_shows_the_optimality_interval(tmp_path, capsys):
    """The interval [best lower bound, best offline schedule] per load, with each bound's
    status and wall time, the plot, and every policy at or above the lower end."""
    args = ["gap", "--duration", "6", "--windows", "1", "--loads", "1.0,2.0", "--policies",
            "vllm,sarathi", "--bound-time-limit", "10", "--search-time-limit", "1",
            "--out", str(tmp_path), "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["load"] for r in d["interval"]] == [1.0, 2.0]
    for r in d["interval"]:
        assert r["lower_s"] <= r["upper_s"] and r["ratio"] >= 1.0
        assert {b["name"] for b in r["bounds"]} == {"cost-bound", "cost-lp", "srpt-bound"}
        assert all(b["status"] in ("optimal", "feasible", "limit") and b["wall_s"] >= 0
                   for b in r["bounds"])
        assert r["search"]["status"] == "feasible"
        for p in r["policies"].values():
            assert p["over_lower"] >= 1.0 - 1e-9
    assert (tmp_path / "interval_vs_load.png").exists()
    assert "## Optimality interval" in (tmp_path / "gap_table.md").read_text()


def test_gap_interval_defaults_are_reproducible_and_include_the_coarse_lp(tmp_path, capsys):
    """By default the schedule search runs a fixed number of simulations (the same upper
    end on every machine) and the cost-model LP runs on its coarse grid, in one round,
    within its time limit; its certified bound is never above the cost bound's interval
    partner and the run says which grid. Twice the same command gives the same interval."""
    args = ["gap", "--duration", "6", "--windows", "1", "--loads", "1.0", "--policies",
            "vllm", "--json"]
    runs = []
    for k in range(2):
        assert main(args + ["--out", str(tmp_path / str(k))]) == 0
        runs.append(json.loads(capsys.readouterr().out)["interval"])
    for r in runs[0]:
        bounds = {b["name"]: b for b in r["bounds"]}
        assert set(bounds) == {"cost-bound", "srpt-bound", "cost-lp"}
        assert bounds["cost-lp"]["status"] in ("optimal", "feasible")
        assert r["lower_s"] == max(b["total_s"] for b in r["bounds"])
        assert r["search"]["evaluations"] == 16
        for q in r["quantiles"].values():  # tails: cost bound's p99 below, vllm's above
            assert q["lower_s"] <= q["upper_s"] and q["upper_name"] == "vllm"
    assert [(r["lower_s"], r["upper_s"]) for r in runs[0]] == \
        [(r["lower_s"], r["upper_s"]) for r in runs[1]]
    assert "certified no bound" not in (tmp_path / "0" / "gap_table.md").read_text()
    # a limit too short to certify anything: the interval keeps the other bounds and the
    # report says what to change
    assert main(args[:-1] + ["--out", str(tmp_path / "t"), "--bound-time-limit", "0.001"]) == 0
    assert "certified no bound within --bound-time-limit" in capsys.readouterr().out
    assert main(args + ["--out", str(tmp_path / "z"), "--lp-grid-scale", "0"]) == 2
    assert "--lp-grid-scale must be > 0" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "y"), "--search-evaluations", "0"]) == 2
    assert "--search-evaluations must be an integer >= 1" in capsys.readouterr().err
