"""lpserve.evaluate and lpserve.evaluate.plots: tidy comparisons, asserted lower bounds, robustness,
labelled figures."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.evaluate import (
    BASELINES,
    METRIC_KEYS,
    BoundViolation,
    ClaimedBound,
    CostModelBound,
    PolicyUnavailable,
    check_bound,
    common_cases,
    compare,
    default_policies,
    flatten,
    resolve_bounds,
    robustness,
    robustness_summary,
)

POLICIES = ["vllm", "vllm+least-outstanding", "sarathi"]


@pytest.fixture(scope="module")
def inst():
    trace = lp.bundled_trace().window(0.0, 40.0)
    return lp.Instance(trace=trace, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                       replicas=2),
                       slo=lp.SLO(ttft_s=1.0, tpot_s=0.1))


@pytest.fixture(scope="module")
def table(inst):
    return compare(inst, POLICIES)


def test_compare_one_row_per_policy_with_design_keys(inst, table):
    assert table["policy"].tolist() == POLICIES
    for col in (*METRIC_KEYS, "throughput_rps", "goodput_rps", "prefix_hit_rate",
                "n_requests", "n_finished", "n_rejected", "ratio_to_bound", "bound_value",
                "e2e_s_p99_over_p50", "n_seeds", "kind", "description"):
        assert col in table.columns, col
    assert (table["n_seeds"] == 1).all()
    assert set(table["kind"]) == {"baseline"}
    # the same numbers as the simulator's own summary (one definition of every metric)
    s = lp.simulate(inst, "sarathi", seed=0).summary()
    row = table.set_index("policy").loc["sarathi"]
    assert row["e2e_s_mean"] == pytest.approx(s["e2e_s"]["mean"], rel=1e-12)
    assert row["ttft_s_p99"] == pytest.approx(s["ttft_s"]["p99"], rel=1e-12)
    assert row["goodput_rps"] == pytest.approx(s["goodput_rps"], rel=1e-12)
    assert row["e2e_s_p99_over_p50"] == pytest.approx(s["e2e_s"]["p99"] / s["e2e_s"]["p50"])


def test_ratio_is_metric_over_best_bound_and_at_least_one(table):
    r = table["e2e_s_mean"] / table["bound_value"]
    np.testing.assert_allclose(table["ratio_to_bound"], r, rtol=1e-12)
    assert (table["ratio_to_bound"] >= 1.0).all()
    assert (table["bound_name"] == "cost-bound").all()
    vals = table.attrs["samples"].bound_values["cost-bound"]
    for key in ("ttft_s_mean", "tpot_s_p50", "e2e_s_p99", "e2e_s_mean"):
        assert 0 < vals[key] < np.inf
    assert vals["ttft_s_p50"] <= vals["ttft_s_p99"] and vals["e2e_s_p50"] <= vals["e2e_s_p99"]


def test_mean_bound_equals_the_cost_bound_formulation(inst):
    """On all requests, the total-latency bound is exactly lp.solve('cost-bound')."""
    pb = CostModelBound().prepare(inst)
    vals = pb.values(np.ones(len(inst.trace), bool))
    sol = lp.solve("cost-bound", inst)
    assert vals["total_latency_s"] == pytest.approx(sol.objective, rel=1e-12)
    assert vals["e2e_s_mean"] == pytest.approx(sol.info["mean_e2e_lb_s"], rel=1e-12)
    # a subset is bounded too, by at least the mean of its per-request bounds
    sub = np.zeros(len(inst.trace), bool)
    sub[::3] = True
    v = pb.values(sub)
    assert v["e2e_s_mean"] >= np.mean(pb.e2e_lb_s[sub]) - 1e-12
    assert v["e2e_s_p50"] == pytest.approx(np.percentile(pb.e2e_lb_s[sub], 50))


def test_a_request_that_fits_nowhere_gets_no_bound(inst):
    """A request needing more KV than a replica holds cannot finish; the others keep their
    bounds (built without it: it never leaves blocks in a prefix cache)."""
    cap = int(inst.cost_model().kv_capacity_tokens(inst.cluster.gpu_memory_fraction))
    t = inst.trace.head(20)
    prompt = np.asarray(t.prompt_tokens).copy()
    prompt[5] = cap + 1
    big = lp.Trace.from_arrays(arrival_s=t.arrival_s, prompt_tokens=prompt,
                               output_tokens=t.output_tokens)
    pb = CostModelBound().prepare(inst.with_(trace=big))
    assert pb.n_unservable == 1
    assert np.isnan(pb.e2e_lb_s[5]) and np.isfinite(np.delete(pb.e2e_lb_s, 5)).all()
    rest = np.arange(20) != 5
    ok = CostModelBound().prepare(inst.with_(trace=big.take(rest)))
    np.testing.assert_allclose(pb.ttft_lb_s[rest], ok.ttft_lb_s, rtol=1e-12)
    np.testing.assert_allclose(pb.e2e_lb_s[rest], ok.e2e_lb_s, rtol=1e-12)
    vals = pb.values(np.ones(20, bool))
    assert np.isfinite(vals["e2e_s_mean"])
    assert vals["e2e_s_p50"] == pytest.approx(np.percentile(np.delete(pb.e2e_lb_s, 5), 50))


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "orca"])
def test_per_request_bounds_hold_in_the_simulator(inst, policy):
    pb = CostModelBound().prepare(inst)
    a = lp.simulate(inst, policy, seed=0).arrays
    fin = a["status"] == "finished"
    assert fin.sum() > 0
    tol = 1e-9
    assert np.all(a["e2e_s"][fin] >= pb.e2e_lb_s[fin] - tol)
    assert np.all(a["ttft_s"][fin] >= pb.ttft_lb_s[fin] - tol)
    t = fin & np.isfinite(a["tpot_s"])
    assert np.all(a["tpot_s"][t] >= pb.tpot_lb_s[t] * (1 - 1e-9))
    # per-request TTFT + decode part = the end-to-end bound
    o = inst.trace.output_tokens
    m = o > 1
    np.testing.assert_allclose(pb.ttft_lb_s[m] + pb.tpot_lb_s[m] * (o[m] - 1),
                               pb.e2e_lb_s[m], rtol=1e-9)


def test_bounds_hold_with_prefix_caching():
    """Mooncake block ids: the simulator hits its prefix cache and stays above the bound."""
    trace = lp.bundled_trace("mooncake-conv-5min").window(0.0, 10.0)
    inst = lp.Instance(trace=trace, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                       replicas=2))
    df = compare(inst, ["vllm-chunked"])
    assert df["prefix_hit_rate"].iloc[0] > 0
    assert df["ratio_to_bound"].iloc[0] >= 1.0


def test_invalid_bound_raises_naming_policy_bound_and_values(inst):
    with pytest.raises(BoundViolation) as e:
        compare(inst, ["vllm"], bounds=["cost-bound", ClaimedBound("too-high",
                                                                   {"e2e_s_mean": 1e4})])
    exc = e.value
    assert (exc.policy, exc.bound, exc.metric) == ("vllm", "too-high", "e2e_s_mean")
    assert exc.bound_value == 1e4 and exc.policy_value < 1e4
    msg = str(exc)
    assert "'too-high'" in msg and "'vllm'" in msg and "e2e_s_mean" in msg and "10000" in msg
    # check=False reports without asserting
    df = compare(inst, ["vllm"], bounds=[{"name": "too-high", "e2e_s_mean": 1e4}], check=False)
    assert df["ratio_to_bound"].iloc[0] < 1


def test_a_custom_bound_object_is_checked_on_the_common_requests(inst):
    """compare() asks a bound once per run (that run's finished requests), then once over
    the requests every policy finished; a violation there is reported as such."""

    class TooHighOnCommon:
        name, description = "too-high-common", "violated only over the common requests"

        def __init__(self, n_runs):
            self.n_runs, self.calls = n_runs, 0

        def prepare(self, instance):
            return self

        def values(self, served):
            self.calls += 1
            return {"ttft_s_p99": 1e3} if self.calls > self.n_runs else {}

    b = TooHighOnCommon(n_runs=2)
    with pytest.raises(BoundViolation, match="every policy finished"):
        compare(inst, ["vllm", "sarathi"], bounds=[b])
    assert b.calls == 3


def test_check_bound_tolerance():
    kw = dict(policy="p", bound="b", seed=0, n_requests=1, scope="test")
    check_bound(bound_values={"e2e_s_mean": 2.0}, policy_values={"e2e_s_mean": 2.0}, **kw)
    check_bound(bound_values={"e2e_s_mean": 2.0},
                policy_values={"e2e_s_mean": 2.0 * (1 - 1e-8)}, **kw)
    check_bound(bound_values={"e2e_s_p99": 9.0}, policy_values={"e2e_s_mean": 1.0}, **kw)
    with pytest.raises(BoundViolation):
        check_bound(bound_values={"e2e_s_mean": 2.0}, policy_values={"e2e_s_mean": 1.99},
                    **kw)


def test_bad_inputs_are_clear_errors(inst):
    with pytest.raises(KeyError, match="unknown policy 'nope'"):
        compare(inst, ["nope"])
    with pytest.raises(ValueError, match="distinct"):
        compare(inst, ["vllm", "vllm"])
    with pytest.raises(ValueError, match="at least one policy"):
        compare(inst, [])
    with pytest.raises(ValueError, match="seeds"):
        compare(inst, ["vllm"], seeds=())
    with pytest.raises(KeyError, match="unknown bound 'nope'"):
        resolve_bounds(["nope"])
    with pytest.raises(ValueError, match="unknown metric key"):
        ClaimedBound("x", {"latency": 1.0})
    assert [b.name for b in resolve_bounds(None)] == ["cost-bound"]
    assert resolve_bounds([]) == []


def test_several_seeds_average_into_one_row(inst):
    df = compare(inst, ["vllm+random"], bounds=[], seeds=(0, 1))
    assert len(df) == 1 and df["n_seeds"].iloc[0] == 2
    per_seed = [lp.simulate(inst, "vllm+random", seed=s).summary()["e2e_s"]["mean"]
                for s in (0, 1)]
    assert per_seed[0] != per_seed[1]
    assert df["e2e_s_mean"].iloc[0] == pytest.approx(np.mean(per_seed), rel=1e-12)
    assert np.isnan(df["ratio_to_bound"].iloc[0])


def test_default_policies():
    two = default_policies(2)
    assert two[:len(BASELINES)] == list(BASELINES) and "lp-index" in two
    one = default_policies(1)
    assert "lp-index" not in one and not any("+" in p for p in one)


def test_robustness_summary_over_loads(inst):
    cases = {"x1": inst, "x1.5": inst.with_(trace=inst.trace.scale_rate(1.5))}
    summary, runs = robustness(cases, ["vllm", "sarathi"], return_runs=True)
    assert summary["policy"].tolist() == ["vllm", "sarathi"]
    assert (summary["n_cases"] == 2).all() and len(runs) == 4
    for _, r in summary.iterrows():
        assert r["e2e_s_mean_min"] <= r["e2e_s_mean_mean"] <= r["e2e_s_mean_max"]
        assert r["ratio_to_bound_max"] >= r["ratio_to_bound_mean"] >= 1.0
        g = runs[runs["policy"] == r["policy"]]
        assert r["e2e_s_mean_mean"] == pytest.approx(g["e2e_s_mean"].mean())
        assert r["worst_case"] == f"instance={g.loc[g['ratio_to_bound'].idxmax(), 'instance']}"


def test_unavailable_solved_policy_is_an_error_or_skipped(inst):
    heavy = inst.with_(trace=inst.trace.scale_rate(10.0))
    with pytest.raises(PolicyUnavailable, match="lp-index: routing-fluid LP did not solve"):
        compare(heavy, ["vllm", "lp-index"], bounds=[])
    df = compare(heavy, ["vllm", "lp-index"], bounds=[], skip_unavailable=True)
    assert df["policy"].tolist() == ["vllm"]
    assert "routing-fluid" in df.attrs["skipped"]["lp-index"]


def test_common_cases_keep_only_cases_every_policy_ran():
    import pandas as pd

    runs = pd.DataFrame({"instance": ["a", "a", "b"], "policy": ["p", "q", "p"],
                         "e2e_s_mean": [1.0, 2.0, 9.0], "ratio_to_bound": [1.0, 2.0, 9.0]})
    same, dropped = common_cases(runs)
    assert same["instance"].tolist() == ["a", "a"] and dropped == ["b"]
    summary = robustness_summary(same)
    assert summary.set_index("policy").loc["p", "e2e_s_mean_max"] == 1.0


def test_flatten():
    s = {"e2e_s": {"mean": 1.0, "p50": 2.0, "p90": 3.0, "p99": 4.0}, "goodput_rps": 5.0,
         "n_finished": 3, "reasons": {"x": 1}}
    f = flatten(s)
    assert f == {"e2e_s_mean": 1.0, "e2e_s_p50": 2.0, "e2e_s_p90": 3.0, "e2e_s_p99": 4.0,
                 "goodput_rps": 5.0, "n_finished": 3}


def test_plots_are_labelled_figures(inst, table, tmp_path):
    from lpserve.evaluate.plots import plot_gap_to_bound, plot_latency_cdf, plot_latency_vs_load

    _, runs = robustness({"0.5": inst.with_(trace=inst.trace.scale_rate(0.5)), "1.0": inst},
                         ["vllm", "sarathi"], return_runs=True)
    runs["load"] = runs["instance"].astype(float)
    figs = {"cdf": plot_latency_cdf(table), "load": plot_latency_vs_load(runs),
            "gap": plot_gap_to_bound(runs)}
    for name, fig in figs.items():
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
            unit_label = ax.get_ylabel() if name != "cdf" else ax.get_xlabel()
            assert unit_label.endswith(("(s)", "(ratio, x)")), unit_label
        assert any(ax.get_legend() is not None for ax in fig.axes), name
        out = tmp_path / f"{name}.png"
        fig.savefig(out)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
        assert fig._repr_png_()[:4] == b"\x89PNG"
    cdf_labels = [t.get_text() for t in figs["cdf"].axes[-1].get_legend().get_texts()]
    assert cdf_labels[:3] == POLICIES and "lower bound" in cdf_labels[-1]
    load_labels = [t.get_text() for t in figs["load"].axes[0].get_legend().get_texts()]
    assert load_labels == ["vllm", "sarathi", "lower bound"]
    with pytest.raises(KeyError, match="load"):
        plot_latency_vs_load(table)
    with pytest.raises(ValueError, match="compare"):
        plot_latency_cdf(42)
