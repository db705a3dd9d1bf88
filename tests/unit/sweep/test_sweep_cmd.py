"""``lpserve sweep``: JSON output, resume, figures, one-line errors for bad grids."""
from __future__ import annotations

import json

import pytest

from lpserve.cli import main

GRID = """
name = "cli"
replications = 2
seed = 1
[traces.conv]
source = "azure-conv-10min"
head = 30
arrivals = "poisson"
[slo]
ttft_s = 1.0
tpot_s = 0.1
[axes]
policy = ["vllm", "sarathi"]
load = [0.5, 2.0]
"""


@pytest.fixture
def grid_file(tmp_path):
    p = tmp_path / "grid.toml"
    p.write_text(GRID)
    return p


def test_sweep_json_then_resume_then_plot(grid_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["sweep", str(grid_file), "--backend", "serial", "--out", str(out), "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["n_cells"], first["n_run"], first["n_skipped"], first["n_failed"]) == \
        (8, 8, 0, 0)
    assert first["backend"] == "serial" and first["failures"] == []
    assert len(first["table"]) == 4  # policy x load, mean over 2 seeds
    row = first["table"][0]
    assert {"policy", "load", "n", "ttft_s_mean", "ttft_s_mean_lo", "ttft_s_mean_hi", "goodput_rps"} <= set(row)
    assert row["n"] == 2

    assert main(argv + ["--plot"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["n_run"], again["n_skipped"]) == (0, 8)
    assert sorted(p.rsplit("/", 1)[1] for p in again["figures"]) == \
        ["latency_vs_load.png", "throughput_vs_load.png"]
    for f in again["figures"]:
        with open(f, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_sweep_text_table(grid_file, tmp_path, capsys):
    assert main(["sweep", str(grid_file), "--backend", "serial", "--out",
                 str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "cells      8  (run 8, already done 0, failed 0)" in text
    assert "ttft_s_mean" in text and "sarathi" in text and "mean over seeds" in text


def test_failed_cells_exit_1_with_errors_listed(tmp_path, capsys):
    p = tmp_path / "g.toml"
    p.write_text(GRID.replace('load = [0.5, 2.0]', 'gpu = ["a100-80gb", "no-such-gpu"]'))
    rc = main(["sweep", str(p), "--backend", "serial", "--out", str(tmp_path / "o"), "--json"])
    assert rc == 1
    out = json.loads(capsys.readouterr().out)
    assert out["n_failed"] == 4 and all("no-such-gpu" in f["error"] for f in out["failures"])


@pytest.mark.parametrize("edit, words", [
    (('policy = ["vllm", "sarathi"]', 'policy = ["vllm", "nope"]'), ["axes.policy[1]", "'nope'"]),
    (('load = [0.5, 2.0]', 'loads = [0.5, 2.0]'), ["unknown axis", "'loads'"]),
    (('load = [0.5, 2.0]', 'load = []'), ["axes.load", "empty"]),
])
def test_bad_grid_is_one_line_error(tmp_path, capsys, edit, words):
    p = tmp_path / "bad.toml"
    p.write_text(GRID.replace(*edit))
    assert main(["sweep", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lpserve sweep: error:")
    for w in words:
        assert w in err


def test_missing_grid_file_and_bad_workers(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "none.toml")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["sweep", "default", "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
