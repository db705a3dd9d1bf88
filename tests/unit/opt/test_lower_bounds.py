"""Cost-model bound: its assumptions on the cost model, prefix reuse, infeasibility."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt import Status, solve
from lpserve.opt.exact import KVProblem, kv_optimal
from lpserve.opt.lower_bounds import (
    area_bound,
    order_statistic_bound,
    prefix_sharing,
    reusable_prefix_tokens,
)


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
    """proofs/cost-bound.md (A2): prefill time non-decreasing in its new tokens and in its
    cached context; (A3) one decode non-decreasing in its context."""
    c = np.arange(0, 8192, 37)
    t = cost.batch_times_s([{"decode_context": [int(x)]} for x in c])
    assert np.all(np.diff(t) >= -1e-12)
    p = np.arange(1, 8192, 41)
    tp = cost.batch_times_s([{"prefill_tokens": [int(x)]} for x in p])
    assert np.all(np.diff(tp) >= -1e-12)
    for n in (1, 17, 512, 3000):
        k = np.arange(0, 12000, 97)
        tk = cost.batch_times_s([{"prefill_tokens": [n], "prefill_cached": [int(x)]} for x in k])
        assert np.all(np.diff(tk) >= -1e-12), n


@pytest.mark.parametrize("llm,tp", [("llama-2-7b", 1), ("llama-2-70b", 4)])
def test_assumption_a5_recompute_chunk_is_at_least_a_decode(llm, tp):
    """proofs/cost-bound.md (A5): the chunk that ends a recompute and produces token j + 1
    (n new tokens on k cached, n + k = c + 1) takes at least one decode at context c."""
    cost = lp.cost_model(gpu="a100-80gb", llm=llm, tp=tp)
    rng = np.random.default_rng(2)
    c = rng.integers(1, 16000, 400)
    n = np.array([rng.integers(1, min(x + 1, 9000) + 1) for x in c])
    chunk = cost.batch_times_s([{"prefill_tokens": [int(a)], "prefill_cached": [int(x + 1 - a)]}
                                for a, x in zip(n, c)])
    dec = cost.batch_times_s([{"decode_context": [int(x)]} for x in c])
    assert np.all(chunk >= dec - 1e-12)


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
    # the k first completions used at least the k smallest areas: 1, 1 + 10, 1 + 10 + 100
    c = order_statistic_bound(np.zeros(3), np.ones(3), np.array([100.0, 1.0, 10.0]), 10.0)
    assert np.allclose(c, [1.0, 1.1, 11.1])


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


def test_prefix_sharing_counts_other_requests_either_way():
    """proofs/cost-bound.md (S2), (S3): a block is shareable when another request (earlier or
    later) carries its content key; each holder of a block m requests carry is charged 1/m
    of it. Trace blocks of 16 tokens, KV blocks of 8."""
    tr = lp.Trace.from_arrays(arrival_s=[0, 1, 2, 3], prompt_tokens=[32, 40, 20, 16],
                              output_tokens=[1, 1, 1, 1], block_tokens=16,
                              block_ids=[[1, 2], [1, 2, 3], [1, 9], [7]])
    cached, discount = prefix_sharing(tr, 8)
    # request 0: KV blocks 0-3 (trace blocks 1, 2), all shared with request 1; blocks 0-1
    # also with request 2 -> capped at prompt - 1. Request 2: 20 tokens, 2 full KV blocks
    # inside trace block 1 (shared by three). Request 3 shares nothing.
    assert cached.tolist() == [31, 32, 16, 0]
    assert discount[0] == pytest.approx(2 * 8 * (1 - 1 / 3) + 2 * 8 * (1 - 1 / 2))
    assert discount[1] == pytest.approx(discount[0])
    assert discount[2] == pytest.approx(2 * 8 * (1 - 1 / 3))
    assert discount[3] == 0.0
    # a KV block is keyed by the trace block of its last token: 32-token KV blocks over
    # 16-token trace blocks need both trace blocks equal
    cached32, _ = prefix_sharing(tr, 32)
    assert cached32.tolist() == [31, 32, 0, 0]
    # a KV block is shared only where the other prompt also has it full
    short = lp.Trace.from_arrays(arrival_s=[0, 1], prompt_tokens=[32, 20], output_tokens=[1, 1],
                                 block_tokens=16, block_ids=[[1, 2], [1, 2]])
    assert prefix_sharing(short, 16)[0].tolist() == [16, 16]
    none = lp.Trace.from_arrays(arrival_s=[0, 1], prompt_tokens=[32, 32], output_tokens=[1, 1])
    c0, d0 = prefix_sharing(none, 16)
    assert c0.tolist() == [0, 0] and d0.tolist() == [0.0, 0.0]


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
