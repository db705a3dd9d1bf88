"""run_sweep on the serial and local backends: results, resume, failures, worker cache."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.sweep import load_grid, load_results, run_sweep
from lpserve.sweep import worker as W
from lpserve.sweep.runner import build_payload, expand, load_traces

from ._grids import comparable, sim_grid, stats_grid


@pytest.fixture(autouse=True)
def _fresh_worker_cache():
    W.clear_cache()
    yield
    W.clear_cache()


def test_simulate_cells_match_a_direct_simulation(tmp_path):
    grid = sim_grid(head=40, policies=("vllm",), loads=(2.0,), replications=1)
    rep = run_sweep(grid, tmp_path, backend="serial")
    assert (rep.n_cells, rep.n_run, rep.n_failed) == (1, 1, 0)
    row = rep.table.iloc[0]
    for key in ("ttft_s_mean", "ttft_s_p99", "tpot_s_mean", "e2e_s_p90", "queue_s_p50",
                "throughput_rps", "goodput_rps", "n_requests", "n_finished"):
        assert key in rep.table.columns, key
    # rebuild the cell by hand: slice, Poisson arrivals at 2x the slice's rate, simulate
    sub = lp.bundled_trace().slice(0, 40).rebased()
    from lpserve.trace.generate import Poisson, with_arrivals

    tr = with_arrivals(sub, Poisson(rate_per_s=2.0 * sub.rate_per_s),
                       seed=W.arrival_seed(int(row["seed"])))
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"),
                       slo=lp.SLO(ttft_s=1.0, tpot_s=0.1),
                       cost=lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1))
    res = lp.simulate(inst, "vllm", seed=int(row["seed"]))
    assert row["result_digest"] == res.digest()
    assert row["ttft_s_mean"] == pytest.approx(res.summary()["ttft_s"]["mean"])
    assert int(row["n_requests"]) == 40


def test_resume_skips_finished_cells(tmp_path):
    grid = sim_grid(head=30)
    first = run_sweep(grid, tmp_path, backend="serial", batch_size=2)
    assert first.n_run == first.n_cells == 8 and first.n_skipped == 0
    parts = sorted(p.name for p in (tmp_path / "parts").iterdir())
    again = run_sweep(grid, tmp_path, backend="serial")
    assert (again.n_run, again.n_skipped) == (0, 8)
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == parts
    # a grid that adds one load runs only the new cells
    bigger = sim_grid(head=30, loads=(0.5, 2.0, 4.0))
    more = run_sweep(bigger, tmp_path, backend="serial")
    assert (more.n_run, more.n_skipped, more.n_cells) == (4, 8, 12)
    stored = load_results(tmp_path)
    assert len(stored) == 12 and stored["cell"].is_unique


def test_failing_cell_is_recorded_and_the_sweep_goes_on(tmp_path):
    grid = sim_grid(head=30, policies=("vllm",), loads=(1.0,),
                    axes={"policy": ["vllm"], "gpu": ["a100-80gb", "no-such-gpu"]})
    rep = run_sweep(grid, tmp_path, backend="serial")
    assert rep.n_cells == 4 and rep.n_failed == 2
    bad = rep.table[rep.table["status"] == "error"]
    assert set(bad["gpu"]) == {"no-such-gpu"}
    assert all("no-such-gpu" in e for e in bad["error"])
    assert (bad["result_digest"] == "").all()
    good = rep.table[rep.table["status"] == "ok"]
    assert len(good) == 2 and good["ttft_s_mean"].notna().all()
    assert [f["cell"] for f in rep.failures()] == list(bad["cell"])
    # failed cells are retried on a re-run unless told otherwise; finished ones are not
    assert run_sweep(grid, tmp_path, backend="serial", retry_failed=False).n_run == 0
    retry = run_sweep(grid, tmp_path, backend="serial")
    assert (retry.n_run, retry.n_failed) == (2, 2)
    assert load_results(tmp_path)["cell"].is_unique


def test_solve_and_cache_cells_report_their_errors_in_the_cell(tmp_path):
    grid = {"name": "mixed", "kind": "stats", "replications": 1,
            "traces": {"conv": {"source": "azure-conv-10min", "head": 20}},
            "params": {"formulation": "no-such-formulation", "capacity_blocks": 64},
            "axes": {"kind": ["stats", "solve", "cache"]}}
    rep = run_sweep(grid, tmp_path, backend="serial")
    t = rep.table.set_index("kind")
    assert t.loc["stats", "status"] == "ok" and t.loc["stats", "n_requests"] == 20
    for kind in ("solve", "cache"):
        assert t.loc[kind, "status"] == "error"
        assert t.loc[kind, "error"]  # e.g. "lp.solve is not available" or an unknown name


def test_stats_cells_set_the_load(tmp_path):
    rep = run_sweep(stats_grid(loads=(1.0, 4.0), replications=1), tmp_path, backend="serial")
    rates = rep.table.set_index("load")["metric_rate_per_s"]
    assert rates[4.0] / rates[1.0] == pytest.approx(4.0)
    grid = stats_grid(loads=(1.0,), replications=1)
    grid["traces"]["conv"]["arrivals"] = "trace"
    grid["axes"] = {"rate_per_s": [3.0, 6.0]}
    rep = run_sweep(grid, tmp_path / "rate", backend="serial")
    assert list(rep.table["metric_rate_per_s"]) == pytest.approx([3.0, 6.0])


def test_poisson_arrivals_common_across_loads_independent_across_seeds():
    g = load_grid(stats_grid(loads=(1.0, 2.0), replications=2))
    traces = load_traces(g)
    cells = expand(g, traces)
    W.install(build_payload(cells, traces))
    arr = {(c.inputs["load"], c.inputs["rep"]): W.cell_trace(c.inputs).arrival_s
           for c in cells}
    np.testing.assert_allclose(arr[(2.0, 0)], arr[(1.0, 0)] / 2.0)
    assert not np.allclose(arr[(1.0, 0)], arr[(1.0, 1)])
    assert arr[(1.0, 0)][0] == 0.0


def test_worker_cache_installs_a_payload_once_and_reports_missing_traces():
    g = load_grid(sim_grid(head=20, policies=("vllm",), loads=(1.0,), replications=1))
    traces = load_traces(g)
    cells = expand(g, traces)
    payload = build_payload(cells, traces)
    assert list(payload.costs) == ["a100-80gb|llama-2-7b|1"]
    row = W.run_cell(cells[0])
    assert row["status"] == "error" and "was not shipped" in row["error"]
    W.install(payload)
    assert W.installed(payload.key)
    held = W._CACHE["traces"][cells[0].inputs["trace"]["digest"]]
    W.install(build_payload(cells, traces))  # same key: nothing replaced
    assert W._CACHE["traces"][cells[0].inputs["trace"]["digest"]] is held
    assert W.run_batch(cells)[0]["status"] == "ok"


def test_local_pool_matches_serial(tmp_path):
    grid = sim_grid(head=30, policies=("vllm",), loads=(0.5, 2.0))
    serial = run_sweep(grid, tmp_path / "serial", backend="serial")
    local = run_sweep(grid, tmp_path / "local", backend="local", workers=2, batch_size=1)
    assert local.n_run == serial.n_run == 4
    assert dict(zip(local.table["cell"], local.table["result_digest"])) == \
        dict(zip(serial.table["cell"], serial.table["result_digest"]))
    assert len(set(local.table["worker"])) >= 1
    assert comparable(serial.table).equals(comparable(local.table))


def test_bad_backend_and_workers_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="backend.*'spark'"):
        run_sweep(stats_grid(), tmp_path, backend="spark")
    with pytest.raises(ValueError, match="workers.*0"):
        run_sweep(stats_grid(), tmp_path / "w", backend="local", workers=0)


def test_cache_cells_match_a_direct_replay(tmp_path):
    replay = lp.cache_replay
    grid = {"name": "cache", "kind": "cache", "replications": 1,
            "traces": {"mc": {"source": "mooncake-conv-5min", "head": 300}},
            "axes": {"capacity_blocks": [64, 512], "cache_policy": ["lru"]}}
    rep = run_sweep(grid, tmp_path, backend="serial")
    assert rep.n_failed == 0, rep.failures()
    tr = lp.bundled_trace("mooncake-conv-5min").slice(0, 300).rebased()
    for cap, hit_rate in zip(rep.table["capacity_blocks"], rep.table["hit_rate"]):
        assert hit_rate == pytest.approx(replay(tr, capacity_blocks=int(cap)).hit_rate)
    assert rep.table["hit_rate"].iloc[1] >= rep.table["hit_rate"].iloc[0]


def test_solve_and_bound_cells_call_lp_solve(tmp_path, monkeypatch):
    """The plumbing of solve/bound cells, with a stand-in ``lpserve.opt.solve`` in this
    process."""
    import math

    import lpserve.opt
    from lpserve.opt.solution import Solution, Status

    calls = []

    def fake_solve(name, instance, **kw):
        calls.append((name, len(instance.trace), kw))
        work = float(instance.trace.prompt_tokens.sum())
        bound = math.nan if name == "no-bound" else work / 2
        return Solution(formulation=name, status=Status.OPTIMAL, objective=work,
                        bound=bound, digest=instance.digest(), objective_units="tokens")

    monkeypatch.setattr(lpserve.opt, "solve", fake_solve)
    grid = {"name": "solve", "kind": "solve", "replications": 1,
            "traces": {"conv": {"source": "azure-conv-10min", "head": 25}},
            "params": {"time_limit_s": 5.0},
            "axes": {"kind": ["solve", "bound"], "formulation": ["schedule-ip", "no-bound"]}}
    rep = run_sweep(grid, tmp_path, backend="serial")
    t = rep.table.set_index(["kind", "formulation"])
    work = float(lp.bundled_trace().slice(0, 25).prompt_tokens.sum())
    assert t.loc[("solve", "schedule-ip"), "objective"] == work
    assert t.loc[("solve", "schedule-ip"), "metric_status"] == "optimal"
    assert t.loc[("bound", "schedule-ip"), "bound"] == work / 2
    assert t.loc[("solve", "no-bound"), "status"] == "ok"
    assert t.loc[("bound", "no-bound"), "status"] == "error"
    assert "no proven bound" in t.loc[("bound", "no-bound"), "error"]
    assert all(c == (c[0], 25, {"time_limit_s": 5.0}) for c in calls) and len(calls) == 4
