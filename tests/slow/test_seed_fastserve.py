"""FastServe on its own set-up (OPT-13B on one A100-40GB, ShareGPT lengths within OPT's
2,048-token context, Poisson arrivals; ``benchmarks/seeds/fastserve.py``), over two
seeds: at half of FCFS's saturation throughput skip-join MLFQ's mean JCT is within 5 % of
FCFS's (the paper's "no loss at low load"); at 1.2 times it, skip-join preempting by swap
beats skip-join preempting by recompute (the ablation's last step). What does not
reproduce, skip-join below FCFS at high load, is left to the benchmark's table: here its
swaps are priced serially and the lengths are light-tailed."""
from __future__ import annotations

import pytest

from tests.slow.seed_bench import load

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", [0, 1])
def test_skip_join_at_low_load_and_swap_over_recompute(seed):
    B = load("fastserve")
    tr = B.workload("sharegpt", 400, seed)
    mu = B.saturation_rps(tr, seed=seed)
    low = {p: B.run(tr.with_rate(0.5 * mu), p, seed).summary()["e2e_s"]["mean"]
           for p in ("vllm-v0", "fastserve")}
    assert abs(low["fastserve"] / low["vllm-v0"] - 1.0) < 0.05
    high = tr.with_rate(1.2 * mu)
    swap = B.run_policy(high, B.lp.make_policy("fastserve", **B.ENGINE), seed)
    recompute = B.run_policy(high, B.lp.make_policy("fastserve", preemption="recompute",
                                                    **B.ENGINE), seed)
    js, jr = swap.summary()["e2e_s"]["mean"], recompute.summary()["e2e_s"]["mean"]
    print(f"seed {seed}: load 0.5 {low}; load 1.2 swap {js:.2f} s, recompute {jr:.2f} s")
    assert jr > 1.2 * js
