"""Scheduling IP and its LP relaxation: statuses, certification, export."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt import Status, solve
from lpserve.opt import schedule_ip as S
from lpserve.opt.exact import KVProblem, check_schedule, kv_optimal
from lpserve.opt.solution import SolutionError


def _instance(a, s, o, M):
    tr = lp.Trace.from_arrays(arrival_s=np.asarray(a, float), prompt_tokens=s, output_tokens=o)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"),
                       cost=lp.UnitRoundCost(memory_tokens=M))


def test_ip_matches_dp_and_certifies():
    a, s, o, M = [0, 0, 1, 2, 2], [2, 3, 1, 2, 4], [4, 3, 5, 2, 3], 10
    inst = _instance(a, s, o, M)
    model = S.build(inst)
    sol = S.solve(model)
    assert sol.status == Status.OPTIMAL
    assert sol.objective == kv_optimal(KVProblem.from_instance(inst))[0]
    # the round model of an instance holds one token less than its prompt (3b)
    assert KVProblem.from_instance(inst).prompt_tokens.tolist() == [x - 1 for x in s]
    assert sol.bound == sol.objective and sol.digest == inst.digest()
    assert all(v == 0 for v in S.certify(model, sol).values())
    assert not check_schedule(model.problem, sol.primal["start_round"])


def test_lp_relaxation_and_capped_window_are_lower():
    inst = _instance([0, 0, 0, 1, 1, 3], [1, 2, 2, 1, 3, 1], [5, 4, 6, 3, 2, 4], 11)
    ip = solve("schedule-ip", inst).objective
    lp_full = solve("schedule-lp", inst)
    lp_cap = S.solve(S.build(inst, relax=True, max_columns=6 * 3))
    assert lp_cap.info["overflow"] and lp_cap.status == Status.OPTIMAL
    assert lp_cap.objective <= lp_full.objective + 1e-7 <= ip + 1e-7
    assert set(lp_full.dual) == {"assign", "memory"} and np.all(lp_full.dual["memory"] >= -1e-9)
    assert lp_full.primal["late_mass"].sum() == 0


def test_infeasible_names_the_request():
    inst = _instance([0, 1], [2, 7], [3, 5], 10)  # request 1 holds 7 + 5 - 1 tokens
    sol = solve("schedule-ip", inst)
    assert sol.status == Status.INFEASIBLE
    assert "request 1" in sol.message and "11 tokens > memory_tokens 10" in sol.message
    assert solve("schedule-lp", inst).status == Status.INFEASIBLE
    with pytest.raises(SolutionError, match="infeasible"):
        S.export(sol, inst)


def test_time_limit_returns_feasible_or_limit_quickly():
    rng = np.random.default_rng(0)
    n, M = 14, 40
    s = rng.integers(1, 6, n)
    o = np.array([rng.integers(1, M - si + 1) for si in s])
    inst = _instance(np.zeros(n), s, o, M)
    sol = solve("schedule-ip", inst, time_limit_s=0.5)
    assert sol.status in (Status.FEASIBLE, Status.LIMIT, Status.OPTIMAL)
    assert sol.wall_s < 30
    if sol.status == Status.FEASIBLE:
        assert sol.bound <= sol.objective and sol.gap >= 0


def test_export_plan_and_refusals():
    inst = _instance([0, 0, 1], [1, 2, 1], [2, 3, 1], 6)
    sol = solve("schedule-ip", inst)
    sched = S.export(sol, inst)
    view = type("V", (), {"request": np.array([2, 0, 1, 7])})()
    r = sched.rank(view)
    assert np.array_equal(r[:3], sol.primal["start_round"][[2, 0, 1]].astype(float))
    assert r[3] == np.inf
    other = _instance([0, 0, 1], [1, 2, 1], [2, 3, 2], 6)
    with pytest.raises(SolutionError, match="solved for instance"):
        S.export(sol, other)
    with pytest.raises(SolutionError, match="no integral"):
        S.export(solve("schedule-lp", inst), inst)


def test_bad_options_raise():
    inst = _instance([0], [1], [1], 4)
    with pytest.raises(ValueError, match="time_limit_s"):
        solve("schedule-ip", inst, time_limit_s=-1)
    with pytest.raises(KeyError, match="unknown formulation"):
        solve("no-such", inst)
    plain = inst.with_(cost=None)
    with pytest.raises(ValueError, match="memory_tokens"):
        solve("schedule-ip", plain)
    assert solve("schedule-ip", plain, memory_tokens=4).status == Status.OPTIMAL


def test_too_large_ip_returns_incumbent_and_area_bound():
    rng = np.random.default_rng(0)
    n, M = 14, 40
    s = rng.integers(1, 6, n)
    o = np.array([rng.integers(1, M - si + 1) for si in s])
    inst = _instance(np.zeros(n), s, o, M)
    sol = solve("schedule-ip", inst, max_columns=50)
    assert sol.status == Status.FEASIBLE and "max_columns" in sol.message
    assert sol.bound <= sol.objective
    assert not check_schedule(KVProblem.from_instance(inst), sol.primal["start_round"])
    assert S.export(sol, inst).start_round.size == n
