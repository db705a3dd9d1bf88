"""Throughput optimality (Li-Dai-Peng) and capacity under SLO of the DPP controller.

* knife edge: at 0.95 of the token-budget service rate ``b / t_b`` the DPP controller
  and Sarathi (same budget) keep bounded queues; at 1.05 they grow; vLLM-style
  prefill-first batching loses stability below it, at its own fluid capacity
  (``prefill_first_capacity_rps``), as the theory says;
* Sarathi-Serve's result: capacity under a P99 TBT SLO of ``sarathi`` (budget 512) vs
  ``vllm``, Mistral-7B on one A100 (paper: about 2.6x);
* one V, no per-workload tuning: the DPP controller matches or beats the best fixed
  Sarathi budget in capacity on every workload here (within the bisection's
  resolution). Measured exception: goodput at fixed rates on bursty Azure code traffic
  under TTFT 2 s / TPOT 50 ms (Llama-3-8B, H100), where it reaches 0.85-1.10 of the best
  fixed budget, and 1.00 on the same requests with Poisson arrivals
  (``benchmarks/seeds/sarathi.py``).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies.lyapunov import constants, lyapunov, prefill_first_capacity_rps
from lpserve.registry import make_policy
from lpserve.sim import simulate
from lpserve.trace import generate as G

pytestmark = pytest.mark.slow

COST = lp.cost_model(gpu="a100-80gb", llm="mistral-7b")
P, D, BUDGET, N = 300, 100, 512, 4000


def _queue_growth(rate_rps: float, policy: lp.Policy) -> tuple[float, float]:
    tr = G.synthetic(N, arrivals=G.Poisson(rate_per_s=rate_rps), prompt=G.Constant(P),
                     output=G.Constant(D), seed=3)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="mistral-7b",
                                                    replicas=1),
                       slo=lp.SLO(ttft_s=2.0, tpot_s=0.1))
    q = simulate(inst, policy, seed=0).arrays["queue_s"]
    return float(np.nanmean(q[: N // 3])), float(np.nanmean(q[2 * N // 3:]))


def _bounded(first: float, last: float) -> bool:
    return last < 2.0 * first + 0.5


def _growing(first: float, last: float) -> bool:
    return last > 3.0 * first and last > 3.0


def test_knife_edge():
    cap = constants(COST, budget_tokens=BUDGET, mean_prompt_tokens=P,
                    mean_output_tokens=D)["capacity_rps"]
    cap_vllm = prefill_first_capacity_rps(COST, budget_tokens=BUDGET, prompt_tokens=P,
                                          output_tokens=D, max_num_seqs=256)
    print(f"\nLi-Dai-Peng capacity {cap:.2f} req/s; prefill-first fluid capacity "
          f"{cap_vllm:.2f} req/s ({cap_vllm / cap:.3f} of it)")
    assert cap_vllm < 0.95 * cap
    work_conserving = {
        "lyapunov": lambda: lyapunov(V=1.0, tbt_slo_s=10.0, max_num_batched_tokens=BUDGET),
        "sarathi": lambda: make_policy("sarathi", max_num_batched_tokens=BUDGET),
    }
    for name, make in work_conserving.items():
        lo = _queue_growth(0.95 * cap, make())
        hi = _queue_growth(1.05 * cap, make())
        print(f"{name}: mean queue first/last third at 0.95: {lo}, at 1.05: {hi}")
        assert _bounded(*lo), name
        assert _growing(*hi), name
    vllm = lambda: make_policy("vllm-v0", max_num_batched_tokens=BUDGET)
    under = _queue_growth(0.9 * cap_vllm, vllm())
    over = _queue_growth(0.95 * cap, vllm())
    print(f"vllm: at 0.9 of its fluid capacity {under}, at 0.95 of Li-Dai-Peng {over}")
    assert _bounded(*under)
    assert _growing(*over)


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "lyapunov_capacity.py"
    spec = importlib.util.spec_from_file_location("lyapunov_capacity", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def table(bench):
    return bench.capacity_table(n_requests=400, rel_tol=0.05, seed=0)


def test_sarathi_capacity_over_vllm(table):
    row = table["azure-conv"]
    ratio = row["sarathi-512"] / row["vllm-v0"]
    print(f"\ncapacity sarathi-512 / vllm-v0 on azure-conv: {ratio:.2f} (paper: ~2.6)")
    assert 1.8 <= ratio <= 4.5
    gen = table["generated"]
    assert gen["sarathi-512"] > 1.8 * gen["vllm-v0"]


def test_dpp_matches_best_fixed_budget(table):
    resolution = 1.05  # relative width of the bisection's final bracket
    for w, row in table.items():
        best = max(v for k, v in row.items() if k.startswith("sarathi"))
        print(f"{w}: lyapunov {row['lyapunov']:.3f} req/s, best fixed budget {best:.3f}")
        assert row["lyapunov"] * resolution >= best, w
