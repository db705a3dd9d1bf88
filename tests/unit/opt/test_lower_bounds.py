"""Cost-model bound: its assumptions on the cost model, prefix reuse, infeasibility."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt import Status, solve
from lpserve.opt.exact import KVProblem, kv_optimal
from lpserve.opt.lower_bounds import area_bound, order_statistic_bound, reusable_prefix_tokens


@pytest.fixture(scope="module")
def cost():
    return lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)


def test_assumption_a1_adding_work_never_shortens_an_iteration(cost):
    """proofs/cost-bound.md (A1): monotone in batch contents."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        dc = rng.integers(1, 4000, int(rng.integers(0, 40))).tolist()
        pt = rng.integers(1, 2048, int(rng.integers(0, 3))).tolist()
        t = cost.batch_time_s(prefill_tokens=pt, decode_context=dc)
        t_more = cost.batch_time_s(prefill_tokens=pt, decode_context=dc + [int(rng.integers(1, 4000))])
        assert t_more >= t - 1e-12
        if pt:
            assert cost.batch_time_s(prefill_tokens=pt[:-1], decode_context=dc) <= t + 1e-12


def test_assumption_a2_a3_monotone_in_context_and_prompt(cost):
    c = np.arange(0, 8192, 37)
    t = cost.batch_times_s([{"decode_context": [int(x)]} for x in c])
    assert np.all(np.diff(t) >= -1e-12)
    p = np.arange(1, 8192, 41)
    tp = cost.batch_times_s([{"prefill_tokens": [int(x)]} for x in p])
    assert np.all(np.diff(tp) >= -1e-12)


def test_assumption_a4_chunks_cost_at_least_the_best_rate(cost):
    """proofs/cost-bound.md (A4): any chunking of a prefill costs >= max(t1, r x tokens).
    (Chunking can beat the whole prefill in this cost model, so the bound does not use it.)"""
    from lpserve.opt.lower_bounds import prefill_lower_bound_s

    rng = np.random.default_rng(1)
    for _ in range(40):
        s = int(rng.integers(2, 8000))
        cached = int(rng.integers(0, s))
        cuts = np.sort(rng.choice(np.arange(1, s - cached), size=min(3, s - cached - 1),
                                  replace=False)) if s - cached > 1 else np.zeros(0, int)
        bounds = np.concatenate([[0], cuts, [s - cached]])
        total = sum(cost.batch_time_s(prefill_tokens=[int(b - a)],
                                      prefill_cached=[int(cached + a)])
                    for a, b in zip(bounds[:-1], bounds[1:]) if b > a)
        assert total >= prefill_lower_bound_s(cost, [s - cached])[0] - 1e-12


def test_order_statistic_bound_simple():
    # two requests at 0, each alone 1 s, area 10 token-s, capacity 10 tokens:
    # first completion >= 1, second >= 2 (20 token-s / 10 tokens)
    c = order_statistic_bound(np.zeros(2), np.ones(2), np.full(2, 10.0), 10.0)
    assert c.tolist() == [1.0, 2.0]


def test_area_bound_below_dp():
    rng = np.random.default_rng(3)
    for _ in range(10):
        n, M = 5, int(rng.integers(5, 12))
        s = rng.integers(0, 3, n)
        o = np.array([rng.integers(1, M - x + 1) for x in s])
        p = KVProblem.from_arrays(rng.integers(0, 4, n), s, o, M)
        assert area_bound(p) <= kv_optimal(p)[0]


def test_reusable_prefix_tokens():
    tr = lp.Trace.from_arrays(arrival_s=[0, 1, 2, 3], prompt_tokens=[32, 48, 32, 16],
                              output_tokens=[1, 1, 1, 1], block_tokens=16,
                              block_ids=[[1, 2], [1, 2, 3], [1, 9], [1]])
    # request 1 reuses blocks 1,2; request 2 reuses 1; request 3 reuses 1 but must compute 1 token
    assert reusable_prefix_tokens(tr).tolist() == [0, 32, 16, 15]


def test_cost_bound_on_analytic_model_and_infeasible(cost):
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 0.0, 0.5], prompt_tokens=[100, 2000, 50],
                              output_tokens=[20, 5, 300])
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    sol = solve("cost-bound", inst)
    assert sol.status == Status.OPTIMAL and sol.objective == sol.bound
    iso = [cost.batch_time_s(prefill_tokens=[s]) + cost.decode_run_s([s], o - 1)
           for s, o in zip([100, 2000, 50], [20, 5, 300])]
    # each term lower-bounds the isolated time, and is not far below it
    assert sol.objective <= sum(iso) + 1e-9
    assert sol.objective >= 0.7 * sum(iso)
    big = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[10], output_tokens=[10**7])
    bad = solve("cost-bound", inst.with_(trace=big))
    assert bad.status == Status.INFEASIBLE and "request 0" in bad.message
