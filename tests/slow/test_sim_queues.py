"""Queueing-theory oracles: M/D/1 and M/M/1 mean waits (the Pollaczek-Khinchine mean-value
formula E[W] = lambda E[S^2] / (2 (1 - rho)); Kleinrock, Queueing Systems I, 1975, the
M/G/1 queue) and Little's law (Little, Operations Research 9(3), 1961)."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp

pytestmark = pytest.mark.slow


def _single_slot(n: int, rate_per_s: float, output: np.ndarray, seed: int):
    """One slot, unit-time rounds: a request's service is its output length in rounds."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    tr = lp.Trace.from_arrays(arrival_s=arrival, prompt_tokens=np.ones(n, np.int64),
                              output_tokens=output)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                       cost=lp.UnitRoundCost(memory_tokens=10 ** 7))
    pol = lp.make_policy("vllm-v0", max_num_seqs=1, prefix_caching=False, watermark=0.0)
    res = lp.simulate(inst, pol)
    assert res.summary()["n_finished"] == n
    return res


def test_md1_mean_wait_matches_pollaczek_khinchine():
    d, rho, n = 10, 0.6, 200_000
    lam = rho / d
    res = _single_slot(n, lam, np.full(n, d, np.int64), seed=1)
    w = res.arrays["queue_s"][n // 20:].mean()  # drop the warm-up
    closed = rho * d / (2.0 * (1.0 - rho))
    assert w == pytest.approx(closed, rel=0.03)
    # service really is D rounds: TTFT = wait + 1 round, E2E = wait + D
    assert np.allclose(res.arrays["e2e_s"] - res.arrays["queue_s"], d)


def test_mm1_mean_wait_matches_closed_form():
    m, rho, n = 100.0, 0.5, 300_000
    rng = np.random.default_rng(7)
    out = rng.geometric(1.0 / m, n).astype(np.int64)  # memoryless rounds ~ exponential
    res = _single_slot(n, rho / m, out, seed=2)
    w = res.arrays["queue_s"][n // 20:].mean()
    closed = rho * m / (1.0 - rho)  # M/M/1: W_q = rho / (mu - lambda)
    assert w == pytest.approx(closed, rel=0.03)


def test_littles_law_on_a_long_run():
    rng = np.random.default_rng(42)  # Vidur's workload: Poisson, U[512, 2048] tokens, 3:1
    n = 20_000
    total = rng.integers(512, 2049, n)
    decode = np.ceil(total / 4.0).astype(np.int64)
    tr = lp.Trace.from_arrays(arrival_s=np.cumsum(rng.exponential(1 / 2.5, n)),
                              prompt_tokens=total - decode, output_tokens=decode)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    a = lp.simulate(inst, lp.make_policy("vllm-v0", prefix_caching=False)).arrays
    arr, fin = a["arrival_s"], a["finish_s"]
    assert np.isfinite(fin).all()
    t0, t1 = arr[0], arr[-1]
    # time-average number in system over [t0, t1], integrated exactly from the intervals
    overlap = np.clip(np.minimum(fin, t1) - np.maximum(arr, t0), 0.0, None)
    L = overlap.sum() / (t1 - t0)
    lam = (len(arr) - 1) / (t1 - t0)
    W = (fin - arr).mean()
    assert L == pytest.approx(lam * W, rel=0.02)
