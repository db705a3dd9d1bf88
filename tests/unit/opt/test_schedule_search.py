"""schedule-search and schedule-exact: the value a search reports is the simulator's value
of the schedule it exports, and on tiny instances the search finds the enumerated optimum
of the same schedule space (``models/schedule-search.md``)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.opt import Status, formulation, solve


def _inst(seed, n, R=1):
    rng = np.random.default_rng(seed)
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 0.3, n)),
                              prompt_tokens=rng.integers(50, 1500, n),
                              output_tokens=rng.integers(2, 80, n))
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=R))


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 30), st.integers(1, 2))
def test_search_value_is_the_simulated_value_of_its_schedule(seed, n, R):
    inst = _inst(seed, n, R)
    sol = solve("schedule-search", inst, max_evaluations=25, time_limit_s=None, seed=seed)
    assert sol.status == Status.FEASIBLE and math.isnan(sol.bound)
    pol = formulation("schedule-search").export(sol, inst)
    res = lp.simulate(inst, pol)
    assert (res.arrays["status"] == "finished").all()
    assert float(res.arrays["e2e_s"].sum()) == sol.objective


def test_local_moves_keep_the_value_of_the_schedule_they_return():
    """The same check after the local search has moved the order (the hypothesis test's
    budget can end in the seeding stage)."""
    inst = _inst(3, 15, 1)
    sol = solve("schedule-search", inst, max_evaluations=70, time_limit_s=None, seed=3)
    assert sol.info["local_improvements"] >= 1
    res = lp.simulate(inst, formulation("schedule-search").export(sol, inst))
    assert float(res.arrays["e2e_s"].sum()) == sol.objective


def test_search_is_at_most_fcfs_and_its_seeds():
    inst = _inst(3, 25, 2)
    sol = solve("schedule-search", inst, max_evaluations=40, time_limit_s=None)
    model = formulation("schedule-search").build(inst)
    from lpserve.opt.schedule_search import schedule_policy

    fcfs = lp.simulate(inst, schedule_policy(model.seeds["fcfs"], model.engines[0],
                                             model.routers[0]))
    assert sol.objective <= float(fcfs.arrays["e2e_s"].sum())


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow),
                                  pytest.param(2, marks=pytest.mark.slow)])  # 2 in the slow tier
def test_exact_is_the_minimum_over_the_space_and_search_finds_it(seed):
    inst = _inst(seed, 3)
    ex = solve("schedule-exact", inst)
    assert ex.status == Status.OPTIMAL and ex.objective == ex.bound
    assert ex.info["evaluations"] == 6 * len(formulation("schedule-exact").build(inst).engines) * 2
    se = solve("schedule-search", inst, max_evaluations=80, time_limit_s=None)
    assert se.objective >= ex.objective - 1e-12
    assert se.objective == pytest.approx(ex.objective, rel=1e-12)
    lb = solve("cost-lp", inst)
    assert lb.bound <= ex.objective


def test_exact_refuses_big_instances():
    sol = solve("schedule-exact", _inst(0, 8))
    assert sol.status == Status.ERROR and "at most 7" in sol.message


def test_search_needs_a_limit():
    with pytest.raises(ValueError, match="time_limit_s or max_evaluations"):
        solve("schedule-search", _inst(0, 3), time_limit_s=None)


def test_search_of_one_request_ends_without_its_time_limit():
    """One request has one order: the local search has no neighbour, so the search ends
    with the seeds and engines tried, not at its time limit."""
    s = solve("schedule-search", _inst(0, 1), time_limit_s=3.0, max_evaluations=40)
    assert s.status is Status.FEASIBLE and math.isfinite(s.objective)
    assert not s.info["hit_time_limit"]
    assert s.info["evaluations"] < 40
