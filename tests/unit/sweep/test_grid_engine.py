"""Sweep grids with engine parameters and predictors, and confidence intervals that stay
within the metric's range."""
from __future__ import annotations

import numpy as np
import pytest

from lpserve.sweep import GridError, load_grid, run_sweep
from lpserve.sweep.plot import mean_interval

from ._grids import sim_grid

FAKE = {"conv": "0" * 64}


def test_plain_grid_keys_do_not_change():
    g = load_grid(sim_grid())
    for c in g.cells(FAKE):
        assert "engine" not in c.inputs and "predictor" not in c.inputs


def test_engine_table_policy_tables_and_axes():
    g = load_grid(sim_grid(policies=("vllm", "sarathi"), loads=(1.0,), replications=1,
                           engine={"max_num_seqs": 64, "vllm": {"max_num_batched_tokens": 8192}},
                           params={"predictor": "history"}))
    by = {c.inputs["policy"]: c.inputs for c in g.cells(FAKE)}
    assert by["vllm"]["engine"] == {"max_num_batched_tokens": 8192, "max_num_seqs": 64}
    assert by["sarathi"]["engine"] == {"max_num_seqs": 64}
    assert by["vllm"]["predictor"] == "history"
    g2 = load_grid(sim_grid(policies=("vllm",), loads=(1.0,), replications=1,
                            axes={"policy": ["vllm"], "load": [1.0],
                                  "engine.max_num_seqs": [8, "64"]}))
    cells = g2.cells(FAKE)
    assert [c.inputs["engine"]["max_num_seqs"] for c in cells] == [8, 64]
    assert cells[0].columns()["engine.max_num_seqs"] == 8


@pytest.mark.parametrize("extra, words", [
    ({"engine": {"max_num_sqs": 4}}, ["[engine].max_num_sqs", "unknown EngineConfig field"]),
    ({"engine": {"orca2": {"max_num_seqs": 4}}}, ["[engine.orca2]", "not a registered"]),
    ({"engine": {"max_num_seqs": 0}}, ["max_num_seqs must be a positive integer", "'vllm'"]),
    ({"engine": {"chunked_prefill": "maybe"}}, ["chunked_prefill", "true or false"]),
    ({"params": {"predictor": "histori"}}, ["[params].predictor", "unknown predictor"]),
])
def test_bad_engine_and_predictor_name_the_key(extra, words):
    with pytest.raises(GridError) as e:
        load_grid(sim_grid(**extra))
    assert all(w in str(e.value) for w in words), str(e.value)


def test_engine_parameters_and_missing_predictions_in_a_sweep(tmp_path):
    # vLLM V0 (no chunked prefill) rejects the prompts above a small token budget
    grid = sim_grid(head=30, policies=("vllm-v0",), loads=(1.0,), replications=1,
                    engine={"vllm-v0": {"max_num_batched_tokens": 1024}})
    rep = run_sweep(grid, tmp_path / "a", backend="serial")
    plain = run_sweep(sim_grid(head=30, policies=("vllm-v0",), loads=(1.0,), replications=1),
                      tmp_path / "b", backend="serial")
    assert rep.table.iloc[0]["n_rejected"] > plain.table.iloc[0]["n_rejected"]
    assert rep.table.iloc[0]["engine.max_num_batched_tokens"] == 1024
    with pytest.raises(GridError, match="'sjf-predicted' decides on predicted output"):
        run_sweep(sim_grid(head=30, policies=("sjf-predicted",), loads=(1.0,),
                           replications=1), tmp_path / "c", backend="serial")
    ok = run_sweep(sim_grid(head=30, policies=("sjf-predicted",), loads=(1.0,),
                            replications=1, params={"predictor": "history"}),
                   tmp_path / "d", backend="serial")
    assert ok.n_failed == 0


def test_bootstrap_interval_respects_the_range():
    rates = [0.0, 0.02, 0.9]
    mean, lo, hi, n = mean_interval(rates)
    assert n == 3 and 0.0 <= lo <= mean <= hi <= 0.9
    # a symmetric t interval over the same values would go below 0
    from scipy import stats

    half = stats.t.ppf(0.975, 2) * np.std(rates, ddof=1) / np.sqrt(3)
    assert mean - half < 0
    lat = [0.1, 0.1, 5.0, 0.2]
    m, lo, hi, _ = mean_interval(lat)
    assert 0.1 <= lo < m < hi <= 5.0
    assert mean_interval(lat) == mean_interval(lat)           # seeded: reproducible
    assert np.isnan(mean_interval([1.0])[1]) and mean_interval([])[3] == 0
    with pytest.raises(ValueError, match="level"):
        mean_interval(lat, level=1.5)
