"""Calibration from serving measurements: a synthetic benchmark generated from known
parameters is fitted back to them."""
from __future__ import annotations

from dataclasses import replace

import pytest

from lpserve.evaluate.serving_fit import fit_serving, truncate
from lpserve.evaluate.sim_to_real import simulate_run
from lpserve.trace.serving_runs import bundled_serving_runs, runs

TRUE = {"iter_overhead_s": 4e-3, "seq_overhead_s": 1e-4}
FRONTEND_S = 0.02  # the serving front end's latency (models/simulator.md (33))


def _synthetic_benchmark():
    """Two stages (3 and 12 requests/s, 60 s each) of the Llama-2-7B codegen workload whose
    'measurements' are the simulator's own figures under TRUE."""
    base = runs(bundled_serving_runs())["20260217-155451-llama-2-7b-tp1-codegen"]
    stages = [replace(base[0], rate_rps=3.0, duration_s=60.0, start_s=0.0),
              replace(base[1], rate_rps=12.0, duration_s=60.0, start_s=60.0)]
    rows = simulate_run(stages, engine="vllm", frontend_latency_s=FRONTEND_S, **TRUE)
    out = []
    for st, row in zip(stages, rows):
        measured = {m: {"mean": row.sim[f"{m}.mean"], "p90": row.sim.get(f"{m}.p90", 0.0)}
                    for m in ("e2e_s", "ttft_s")}
        # the per-token interval is what the fit reads: store the ITL that reproduces it
        measured["itl_s"] = {"mean": row.sim["itl_s.mean"] / 2, "p90": 0.0}
        out.append(replace(st, measured=measured, n_ok=st.n_requests, n_failed=0))
        assert out[-1].tpot_s() == pytest.approx(row.sim["itl_s.mean"], rel=0.02)
    return out


@pytest.mark.slow
def test_fit_recovers_known_parameters_within_two_percent():
    stages = _synthetic_benchmark()
    fit = fit_serving(stages, params=tuple(TRUE), max_stage_s=None, max_evaluations=40)
    for k, v in {**TRUE, "frontend_latency_s": FRONTEND_S}.items():
        assert fit.values[k] == pytest.approx(v, rel=0.02), (k, fit.values, fit.start)
    err = fit.errors()
    assert err["after"]["ttft_s.mean"] < 1.0
    assert err["after"]["e2e_s.mean"] < 1.0 < err["before"]["e2e_s.mean"]


def test_truncate_cuts_and_retimes_each_run():
    stages = runs(bundled_serving_runs())["20260217-231439-llama-2-7b-tp1-general"]
    cut = truncate(stages, 30.0)
    assert [(s.start_s, s.duration_s) for s in cut] == [(0.0, 30.0), (30.0, 30.0)]


def test_unknown_parameter_is_refused():
    with pytest.raises(ValueError, match="cannot fit .'eff_magic'."):
        fit_serving(bundled_serving_runs()[:1], params=("eff_magic",))


def test_frontend_latency_is_the_shift_that_matches():
    """Rows whose simulated TTFT and E2E sit 15 ms short of the measured ones give 15 ms."""
    from types import SimpleNamespace

    from lpserve.evaluate.serving_fit import fit_frontend_latency

    rows = [SimpleNamespace(real_saturated=False,
                            sim={"ttft_s.mean": t, "e2e_s.mean": e},
                            real={"ttft_s.mean": t + 0.015, "e2e_s.mean": e + 0.015})
            for t, e in ((0.02, 2.0), (0.05, 4.5), (0.03, 3.0))]
    assert fit_frontend_latency(rows) == pytest.approx(0.015, abs=1e-6)
    rows.append(SimpleNamespace(real_saturated=True, sim={"ttft_s.mean": 0.02, "e2e_s.mean": 2},
                                real={"ttft_s.mean": 9.0, "e2e_s.mean": 20.0}))
    assert fit_frontend_latency(rows) == pytest.approx(0.015, abs=1e-6)  # overloaded: left out
    with pytest.raises(ValueError, match="did not overload"):
        fit_frontend_latency(rows[-1:])
