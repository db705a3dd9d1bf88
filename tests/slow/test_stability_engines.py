"""Li, Dai and Peng (arXiv 2504.07347; proofs/stability-capacity.md): work-conserving
engines keep bounded queues below the predicted capacity and every engine's queue grows
above it; vanilla vLLM (prefill-first, decodes paused while prompts prefill) and
FasterTransformer-style static batching are not maximally stable: their queues grow at
0.8 of it. Checked for every registered engine on the abstract round model (each
iteration one time unit) and on the A100 / Llama-2-7B cost model.

Rule: a queue *grows* when the least-squares slope of the number of requests in the
system over the second half of the arrival window is at least 5 % of the arrival rate
(:func:`lpserve.evaluate.stability.queue_growth`); at load ``rho > 1`` it is about
``1 - 1/rho`` (0.2 at 1.25), for a stable queue about 0.
"""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.evaluate.stability import predict_capacity, queue_growth
from lpserve.policies.baselines import ENGINE_DEFAULTS

pytestmark = pytest.mark.slow

GROWS = 0.05
WORK_CONSERVING = {"vllm", "vllm-chunked", "sarathi", "orca"}   # orca: decodes + whole prefills
# not maximally stable; on the A100 cost model vLLM's small prefills are cheap enough
# that this workload does not expose it, so only the round model asserts it for vLLM
UNSTABLE_BELOW = {"round": {"vllm-v0", "static"}, "a100": {"static"}}


def _instance(model: str, seed: int, n: int, rate: float) -> lp.Instance:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1.0 / rate, n))
    if model == "round":
        tr = lp.Trace.from_arrays(arrival_s=arr, prompt_tokens=rng.integers(16, 64, n),
                                  output_tokens=rng.integers(16, 128, n))
        return lp.Instance(trace=tr, cost=lp.UnitRoundCost(memory_tokens=16384),
                           cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                              block_tokens=1))
    tr = lp.Trace.from_arrays(arrival_s=arr, prompt_tokens=rng.integers(100, 600, n),
                              output_tokens=rng.integers(100, 600, n))
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))


@pytest.mark.parametrize("model", ["round", "a100"])
@pytest.mark.parametrize("engine", sorted(ENGINE_DEFAULTS))
def test_growth_above_and_stability_below_the_predicted_capacity(engine, model):
    def pol():
        return lp.make_policy(engine, prefix_caching=False)

    pred = predict_capacity(_instance(model, 99, 4000, 1.0), pol())
    n = 3000 if model == "round" else 2000
    for seed in (1, 2):
        above = queue_growth(lp.simulate(_instance(model, seed, n, 1.25 * pred["rate_rps"]),
                                         pol()))
        assert above["relative"] >= GROWS, (engine, model, seed, above)
        below = queue_growth(lp.simulate(_instance(model, seed, n, 0.8 * pred["rate_rps"]),
                                         pol()))
        if engine in WORK_CONSERVING:
            assert below["relative"] < GROWS, (engine, model, seed, below)
        elif engine in UNSTABLE_BELOW[model]:
            assert below["relative"] >= GROWS, (engine, model, seed, below)
