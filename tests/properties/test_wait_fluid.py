"""WAIT and Nested WAIT against the fluid optimum (proofs/wait-fluid.md): WAIT with
fluid thresholds never exceeds KV memory, produces exactly the tokens its cohorts allow,
and its throughput over the fluid optimum rises toward 1 as arrival rates and memory
scale together; Nested WAIT does the same against the unknown-length optimum without an
eviction; the fluid LP is the fractional knapsack it should be."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.opt.fluid import fluid_optimum, fluid_unknown_lengths, wait_thresholds
from lpserve.opt.wait_ref import nested_wait_caps, nested_wait_round, wait_round

L = np.array([8, 16])
O = np.array([4, 12])


def _saturated(k: int, H: int):
    """Arrivals at every integer time (2k and k per type): memory 300k binds."""
    lam = np.array([2, 1]) * k
    arr = np.repeat(np.arange(H, dtype=float), lam.sum())
    typ = np.tile(np.repeat([0, 1], lam), H)
    tr = lp.Trace.from_arrays(arrival_s=arr, prompt_tokens=L[typ], output_tokens=O[typ])
    inst = lp.Instance(trace=tr, cost=lp.UnitRoundCost(memory_tokens=300 * k),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=1),
                       horizon_s=float(H))
    return inst, lam


def test_wait_approaches_the_fluid_optimum():
    H, ratios = 120, []
    for k in (1, 4, 16):
        inst, lam = _saturated(k, H)
        fl = fluid_optimum(L, O, lam, 300 * k)
        th = wait_thresholds(L, O, fl["x"])
        res = lp.simulate(inst, lp.make_policy("wait", thresholds=th, max_num_seqs=4096),
                          seed=0)
        a = res.arrays
        assert a["preemptions"].sum() == 0                       # memory never ran out
        tokens = int(a["generated_tokens"].sum())
        # cohorts of n_j start every iteration; one started at t yields min(o_j, H - t)
        exact = sum(th[(int(L[j]), int(O[j]))] * sum(min(int(O[j]), H - t) for t in range(H))
                    for j in range(2))
        assert tokens == exact
        ref = wait_round(inst.trace.arrival_s.astype(int), inst.trace.prompt_tokens,
                         inst.trace.output_tokens, th, 300 * k, H)
        assert ref["tokens"] == tokens and ref["overflow"] == 0
        ratios.append(tokens / (fl["tokens_per_iteration"] * H))
    assert ratios[0] < ratios[1] < ratios[2] <= 1.0, ratios
    assert ratios[2] > 0.9, ratios


def test_nested_wait_approaches_the_unknown_length_fluid_optimum():
    l, o, p = np.array([8, 8, 8]), np.array([4, 12, 30]), np.array([0.4, 0.4, 0.2])
    g = l * o + o * (o - 1) // 2
    H, ratios = 300, []
    for k in (4, 16, 64):
        M = 500 * k
        rate = 1.5 * M / float(p @ g)                 # overloaded: a queue always waits
        fl = fluid_unknown_lengths(l, o, p * rate, M)
        caps = nested_wait_caps(l, o, p, M, horizon=H)
        rng = np.random.default_rng(k)
        arr = np.repeat(np.arange(H), rng.poisson(rate, H))
        typ = rng.choice(3, arr.size, p=p)
        r = nested_wait_round(arr, l[typ], o[typ], caps["bounds"], caps["caps"], M, H)
        assert r["evictions"] == 0 and r["peak_memory"] <= M
        ratios.append(r["tokens"] / (fl["tokens_per_iteration"] * H))
    assert ratios[0] < ratios[1] < ratios[2] <= 1.0, ratios
    assert ratios[2] > 0.75, ratios


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50), st.floats(0.0, 5.0)),
                min_size=1, max_size=5), st.integers(50, 5000))
def test_fluid_lp_is_the_fractional_knapsack(types, M):
    s, o, lam = (np.array(x) for x in zip(*types))
    fl = fluid_optimum(s, o, lam, M)
    g = s * o + o * (o - 1) // 2
    room, best = float(M), 0.0
    for j in sorted(range(len(s)), key=lambda j: -o[j] / g[j]):   # densest first
        take = min(lam[j], room / g[j])
        best += take * o[j]
        room -= take * g[j]
    assert abs(fl["tokens_per_iteration"] - best) <= 1e-6 * max(1.0, best)
    assert fl["memory_tokens_used"] <= M + 1e-6
    th = wait_thresholds(s, o, fl["x"])
    assert sum(n * gj for n, gj in zip(th.values(), g)) <= M or len(th) < len(s)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000))
def test_wait_never_preempts_under_poisson_arrivals(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    lam = rng.uniform(0.5, 3.0, 2) * k
    M = 300 * k
    fl = fluid_optimum(L, O, lam, M)
    th = wait_thresholds(L, O, fl["x"])
    n = 400
    typ = rng.choice(2, n, p=lam / lam.sum())
    tr = lp.Trace.from_arrays(arrival_s=np.cumsum(rng.exponential(1 / lam.sum(), n)),
                              prompt_tokens=L[typ], output_tokens=O[typ])
    inst = lp.Instance(trace=tr, cost=lp.UnitRoundCost(memory_tokens=M),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=1),
                       horizon_s=float(tr.arrival_s[-1]))
    res = lp.simulate(inst, lp.make_policy("wait", thresholds=th), seed=0)
    assert res.arrays["preemptions"].sum() == 0
