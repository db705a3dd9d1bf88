"""MC-SF in the KV round model (proofs/mcsf-memory-safety.md, proofs/sched-kv-lower-bound.md):
the registered ``mcsf-oracle`` policy in the simulator never runs out of KV memory and is
never below the exact optimum; the reference MC-SF starts exactly the largest fitting
prefix of the shortest-first order each round; an adversary drives any deterministic
online algorithm's ratio up like sqrt(n).

lpserve does not claim Jaillet et al.'s constant competitive ratio under their conditions
(arrivals at 0, equal prompts, M >= 2 max(s + o)): see proofs/mcsf-memory-safety.md,
"Not claimed"."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.opt.exact import KVProblem, kv_optimal
from lpserve.opt.mcsf_ref import mcsf_latency, mcsf_schedule


def _instance(a, s, o, M):
    tr = lp.Trace.from_arrays(arrival_s=np.asarray(a, float), prompt_tokens=s, output_tokens=o)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                       cost=lp.UnitRoundCost(memory_tokens=M))


small = st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 2), min_size=n, max_size=n),
    st.lists(st.integers(1, 3), min_size=n, max_size=n),
    st.lists(st.integers(1, 4), min_size=n, max_size=n),
    st.integers(8, 14)))


@settings(max_examples=40, deadline=None)
@given(small)
def test_mcsf_policy_never_preempts_and_is_not_below_opt(case):
    a, s, o, M = case
    order = np.argsort(a, kind="stable")
    a, s, o = (np.asarray(x)[order] for x in (a, s, o))
    if max(x + y for x, y in zip(s, o)) + 1 > M:
        return
    res = lp.simulate(_instance(a, s, o, M), lp.make_policy("mcsf-oracle"), seed=0, check=True)
    arr = res.arrays
    assert (arr["status"] == "finished").all()
    assert arr["preemptions"].sum() == 0          # KV never ran short
    tel = float(np.sum(arr["finish_s"] - arr["arrival_s"]))
    opt, _ = kv_optimal(KVProblem.from_arrays(a, s, o, M))
    assert tel >= opt - 1e-9


def _fits_every_round(committed, t: int, M: int) -> bool:
    """Memory of ``committed`` (s, start, length) in every round after ``t`` (not only at
    completions: an independent check of models/schedule-ip.md (10))."""
    end = max((k + o for _, k, o in committed), default=t)
    return all(sum(s + r - k for s, k, o in committed if k < r <= k + o) <= M
               for r in range(t + 1, end + 1))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_reference_mcsf_starts_the_largest_fitting_prefix_of_shortest_first(seed):
    """MC-SF's definition (Jaillet et al., arXiv 2502.07115, Algorithm MC-SF): in each
    round the requests started are the longest prefix of the waiting ones sorted by
    (predicted length, arrival, index) that keeps the memory within M in every future
    round, and the next one in that order would not fit. It is at least OPT."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 8))
    M = int(rng.integers(10, 30))
    s = rng.integers(1, 4, n)
    o = np.array([rng.integers(1, M - x) for x in s])
    a = np.sort(rng.integers(0, 4, n))
    p = KVProblem.from_arrays(a, s, o, M)
    start = mcsf_schedule(p)
    for t in range(int(start.max()) + 1):
        waiting = sorted((i for i in range(n) if a[i] <= t and start[i] >= t),
                         key=lambda i: (o[i], a[i], i))
        if not waiting:
            continue
        running = [(s[i], start[i], o[i]) for i in range(n) if start[i] < t < start[i] + o[i]]
        chosen = [i for i in waiting if start[i] == t]
        assert chosen == waiting[:len(chosen)], (t, chosen, waiting)
        committed = running + [(s[i], t, o[i]) for i in chosen]
        assert _fits_every_round(committed, t, M)
        if len(chosen) < len(waiting):
            nxt = waiting[len(chosen)]
            assert not _fits_every_round(committed + [(s[nxt], t, o[nxt])], t, M)
    if n <= 5:
        opt, _ = kv_optimal(p)
        assert mcsf_latency(p) >= opt - 1e-9


def adversary(n: int, algorithm) -> float:
    """ALG / (feasible hold-back schedule) on the construction of sched-kv-lower-bound.md."""
    ell = math.isqrt(n - 1) + 1 if n > 1 else 1
    M = n * (ell + 1)
    long_only = KVProblem.from_arrays([0], [M - ell], [ell], M)
    t0 = int(algorithm(long_only)[0])
    a = [0] + [t0 + 1] * n
    s = [M - ell] + [ell] * n
    o = [ell] + [1] * n
    p = KVProblem.from_arrays(a, s, o, M)
    k = algorithm(p)
    alg = float(np.sum(k + p.output_tokens - p.arrival_round))
    hold = np.array([t0 + 2] + [t0 + 1] * n)             # short ones first, then L
    feasible = float(np.sum(hold + p.output_tokens - p.arrival_round))
    assert lp.opt.exact.check_schedule(p, hold) == []
    return alg / feasible


def test_lower_bound_adversary_ratio_grows_with_n():
    algs = {"mcsf": lambda p: mcsf_schedule(p),
            "fcfs-memory-check": lambda p: mcsf_schedule(p, priority=p.arrival_round)}
    for name, alg in algs.items():
        ratios = [adversary(n, alg) for n in (4, 16, 64, 256)]
        assert all(b > a for a, b in zip(ratios, ratios[1:])), (name, ratios)
        assert ratios[-1] >= 0.4 * math.sqrt(256), (name, ratios)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_mcsf_policy_in_simulator_reproduces_reference_mcsf(seed):
    # with mixed batching and one token per block the simulator is the round model
    rng = np.random.default_rng(seed)
    n, M = int(rng.integers(1, 9)), int(rng.integers(10, 30))
    s = rng.integers(1, 4, n)
    o = np.array([rng.integers(1, M - x) for x in s])
    a = np.sort(rng.integers(0, 6, n))
    p = KVProblem.from_arrays(a, s, o, M)
    res = lp.simulate(_instance(a, s, o, M), lp.make_policy("mcsf-oracle"), seed=0)
    tel = float(np.sum(res.arrays["finish_s"] - res.arrays["arrival_s"]))
    assert tel == mcsf_latency(p)
