"""FastServe on its own set-up (OPT-13B on one A100-40GB, ShareGPT lengths within OPT's
2,048-token context, Poisson arrivals; ``benchmarks/seeds/fastserve.py``), over two
seeds: at half of FCFS's saturation throughput skip-join MLFQ's mean JCT is within 5 % of
FCFS's (the paper's "no loss at low load"); at 1.2 times it, the ablation's ordering:
skip-join preempting by proactive swapping on the overlapped link beats recompute (paper
2.7x) and the blocking reactive swap (paper 1.7x), and its link waits stay under 5 % of
latency. What does not reproduce, skip-join below FCFS at high load and proactive below
overlapped reactive swapping, is left to the benchmark's tables: these lengths are
light-tailed, and reactive swapping here is off the critical path too. On heavy-tailed
(alpaca-like) lengths at overload the preemptions shrink the batches more than the order
gains (table 5); the last test checks that mechanism."""
from __future__ import annotations

import pytest

from tests.slow.seed_bench import load

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", [0, 1])
def test_skip_join_at_low_load_and_the_swap_ablation(seed):
    B = load("fastserve")
    tr = B.workload("sharegpt", 400, seed)
    mu = B.saturation_rps(tr, seed=seed)
    low = {p: B.run(tr.with_rate(0.5 * mu), p, seed).summary()["e2e_s"]["mean"]
           for p in ("vllm-v0", "fastserve")}
    assert abs(low["fastserve"] / low["vllm-v0"] - 1.0) < 0.05
    abl = B.ablation(tr.with_rate(1.2 * mu), seed)
    pro = abl["proactive swap"]
    print(f"seed {seed}: load 0.5 {low}; load 1.2 " +
          ", ".join(f"{k} {v['jct_s']:.2f} s" for k, v in abl.items()))
    assert pro["swaps"] > 0
    assert abl["recompute"]["jct_s"] > 1.2 * pro["jct_s"]
    assert abl["reactive swap, serial"]["jct_s"] > pro["jct_s"]
    assert pro["link_share"] < 0.05


def test_at_overload_preemption_shrinks_the_batches():
    """Table 5 (heavy-tailed alpaca-like lengths at 1.2 x FCFS's rate while requests
    wait): skip-join MLFQ's mean JCT is above FCFS's, its preemptions make the same tokens
    take more iterations and more GPU time, and without priority preemption it is no
    worse than FCFS (0.94x on seed 0): the loss is the preemptions', not the order's."""
    B = load("fastserve")
    B.OVERLOAD = {k: B.OVERLOAD[k] for k in ("fcfs", "skip-join", "skip-join, no preemption")}
    r = B.overload(B.workload("alpaca", 3000, 0), 0)["rows"]
    fcfs, skip, calm = r["fcfs"], r["skip-join"], r["skip-join, no preemption"]
    print({k: (round(v["jct_s"], 2), v["iterations"]) for k, v in r.items()})
    assert skip["jct_s"] > 1.2 * fcfs["jct_s"]
    assert skip["iterations"] > 1.2 * fcfs["iterations"] and skip["busy_s"] > fcfs["busy_s"]
    assert calm["jct_s"] < 1.02 * fcfs["jct_s"] and calm["jct_s"] < 0.7 * skip["jct_s"]
