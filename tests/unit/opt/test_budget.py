"""Time limits that cover build and solve: deadlines, the killable HiGHS child, fallbacks.

Regression for: ``lp.solve(..., time_limit_s=2)`` running minutes (an unbounded greedy
search and column windows before HiGHS's clock started, and HiGHS phases that overrun its
own limit), returning ``limit`` with no bound, and ``feasible`` with MIP bound 0.0 where
the area bound is known. The wall-time checks here are loose hang guards; the figures
come from ``benchmarks/solve_time_limits.py``.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt import Status, solve
from lpserve.opt import budget as B
from lpserve.opt import schedule_ip as S
from lpserve.opt.exact import KVProblem
from lpserve.opt.lower_bounds import area_bound
from lpserve.opt.mcsf_ref import best_memory_safe_schedule, mcsf_schedule
from lpserve.opt.solution import highs_status


def overloaded(n: int, seed: int = 0, M: int = 16) -> lp.Instance:
    """Poisson arrivals at one per round, M = 16 (the shape of instances/small)."""
    rng = np.random.default_rng(seed)
    s = rng.integers(1, 3, n)
    o = np.array([rng.integers(1, M - x + 1) for x in s])
    a = np.floor(np.cumsum(rng.exponential(1.0, n)))
    tr = lp.Trace.from_arrays(arrival_s=a - a[0], prompt_tokens=s, output_tokens=o)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                       cost=lp.UnitRoundCost(memory_tokens=M))


def _area(inst: lp.Instance) -> float:
    return area_bound(KVProblem.from_instance(inst))


def test_deadline_validates_and_checks():
    for bad in (0, -1, math.inf, math.nan, True, "2"):
        with pytest.raises(ValueError, match="time_limit_s"):
            B.Deadline(bad)
    assert not B.Deadline().limited and B.Deadline().remaining_s() == math.inf
    d = B.Deadline(1e-6)
    time.sleep(1e-3)
    with pytest.raises(B.TimeLimitReached, match="while testing") as exc:
        d.check("testing", {"incumbent": 3})
    assert exc.value.partial == {"incumbent": 3}


def test_a_build_past_the_limit_returns_the_area_bound():
    inst = overloaded(3000)  # the greedy search alone takes seconds here
    for name in ("schedule-ip", "schedule-lp"):
        t0 = time.perf_counter()
        sol = solve(name, inst, time_limit_s=0.2)
        wall = time.perf_counter() - t0
        assert wall < 0.2 * 1.1 + 1.0 + 2.0, (name, wall)  # hang guard
        assert sol.status in (Status.LIMIT, Status.FEASIBLE), name
        assert "time limit" in sol.message and sol.bound == _area(inst), name
        assert sol.wall_s == pytest.approx(wall, abs=0.05)


def test_the_greedy_keeps_its_best_finished_order():
    p = KVProblem.from_instance(overloaded(40))
    full = best_memory_safe_schedule(p)
    with pytest.raises(B.TimeLimitReached) as exc:
        mcsf_schedule(p, deadline=_expired())
    assert exc.value.stage == "running the memory-check greedy"
    with pytest.raises(B.TimeLimitReached) as exc:
        best_memory_safe_schedule(p, deadline=_expired())
    assert exc.value.partial["incumbent"] is None
    assert np.array_equal(best_memory_safe_schedule(p, deadline=B.Deadline(60)), full)


def _expired() -> B.Deadline:
    d = B.Deadline(1e-6)
    time.sleep(1e-3)
    return d


def test_ip_at_the_limit_reports_the_better_of_mip_and_area_bound():
    inst = overloaded(60)
    sol = solve("schedule-ip", inst, time_limit_s=0.5)
    assert sol.status == Status.FEASIBLE
    assert sol.bound >= _area(inst) > 0 and sol.bound <= sol.objective
    assert S.certify(S.build(inst), sol)["memory_excess_tokens"] == 0


def _model(n: int) -> tuple[S.ScheduleModel, dict]:
    m = S.build(overloaded(n))
    return m, dict(col_cost=m.col_cost, col_lower=np.zeros(m.col_cost.size),
                   col_upper=np.ones(m.col_cost.size), integer=True, **S._rows(m))


def test_the_child_process_gives_what_the_solver_gives_here():
    m, model = _model(6)
    opts = {"mip_abs_gap": 1.0 - 1e-6, "mip_rel_gap": 0.0}
    here = B.run_highs(model, deadline=B.Deadline(30), options=opts, in_process=True)
    child = B.run_highs(model, deadline=B.Deadline(30), options=opts, in_process=False)
    assert here.in_process and not child.in_process
    assert here.model_status == child.model_status == "kOptimal"
    assert here.objective == child.objective
    assert np.array_equal(np.round(here.col_value), np.round(child.col_value))


def test_a_child_past_its_deadline_is_killed_and_the_answer_falls_back():
    m, model = _model(60)
    d = B.Deadline(0.05)
    t0 = time.perf_counter()
    run = B.run_highs(model, deadline=d, in_process=False)
    assert time.perf_counter() - t0 < 0.05 + d.grace_s() + 1.0
    assert run.killed or run.model_status == "kTimeLimit"
    status, obj, bound, _ = highs_status(run, has_integers=True)
    if run.killed:
        assert status == Status.LIMIT and math.isnan(obj) and math.isnan(bound)


def test_symmetry_rows_are_those_of_the_column_loop():
    inst = lp.Instance(trace=lp.Trace.from_arrays(arrival_s=np.array([0., 0, 0, 1, 1]),
                                                  prompt_tokens=[1, 1, 1, 2, 2],
                                                  output_tokens=[2, 2, 2, 3, 3]),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"),
                       cost=lp.UnitRoundCost(memory_tokens=6))
    m = S.build(inst)
    assert len(m.sym_pairs) == 3
    rows = S._rows(m)
    base = m.problem.n + m.row_round.size
    for c in range(m.col_cost.size):  # own entries first, then one entry per pair
        ent = rows["a_index"][rows["a_start"][c]:rows["a_start"][c + 1]]
        own = m.a_index[m.a_start[c]:m.a_start[c + 1]]
        assert np.array_equal(ent[:own.size], own)
        q = ent[own.size:] - base
        pairs = [k for k, (i, j) in enumerate(m.sym_pairs) if m.col_request[c] in (i, j)]
        assert q.tolist() == pairs
    assert solve("schedule-ip", inst).status == Status.OPTIMAL


def test_unknown_options_raise_value_error():
    inst = overloaded(5)
    with pytest.raises(ValueError, match="unknown option.*bogus.*memory_tokens"):
        solve("schedule-ip", inst, bogus=1)
    with pytest.raises(ValueError, match="unknown option"):
        solve("cost-bound", inst, bogus=1)
    with pytest.raises(ValueError, match="instance must be an lpserve Instance"):
        solve("schedule-area", "small")
