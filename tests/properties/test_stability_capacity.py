"""The stability condition of Nie, Si and Zhou (arXiv 2605.04595) as a capacity predictor
(proofs/stability-capacity.md): on the abstract round model, where its assumptions hold
(a work-conserving chunked-prefill engine, KV memory the binding resource, every
iteration one time unit), the capacity search agrees with ``M / (t_bar E[g])`` within the
paper's stated 10 %."""
from __future__ import annotations

import numpy as np

import lpserve as lp
from lpserve.evaluate.capacity import capacity
from lpserve.evaluate.stability import predict_capacity

M = 4096


def _poisson(seed: int, n: int, rate: float, ttft_s: float) -> lp.Instance:
    rng = np.random.default_rng(seed)
    tr = lp.Trace.from_arrays(arrival_s=np.cumsum(rng.exponential(1 / rate, n)),
                              prompt_tokens=rng.integers(16, 64, n),
                              output_tokens=rng.integers(16, 128, n))
    return lp.Instance(trace=tr, cost=lp.UnitRoundCost(memory_tokens=M),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=1),
                       slo=lp.SLO(ttft_s=ttft_s, tpot_s=1e6))


def test_capacity_search_agrees_with_the_memory_stability_condition():
    pol = lp.make_policy("vllm-chunked", watermark=0.0, prefix_caching=False)
    pred = predict_capacity(_poisson(99, 4000, 1.0, 1.0), pol)
    assert pred["binding"] == "memory" and pred["batch_time_s"] == 1.0
    n = 1200
    window = n / pred["rate_rps"]
    # TTFT objective 5 % of the arrival window: an unstable load rho fails once its
    # backlog delay (1 - 1/rho) * window passes it, i.e. for rho > 1.053 (rule in the
    # proof file); stable loads keep their delay far below
    insts = [_poisson(s, n, pred["rate_rps"], 0.05 * window) for s in range(2)]
    res = capacity(insts, pol, rel_tol=0.02, drain_s=0.5 * window)
    assert abs(res.rate_rps / pred["rate_rps"] - 1.0) <= 0.10, (res.rate_rps, pred)
