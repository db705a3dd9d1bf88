"""The cost-model LP (``cost-lp``) and the cheap bounds (``srpt-bound``) are below the
simulated total latency of every registered non-speculative policy, on small instances of
the analytic GPU cost model with shared prompt prefixes, tight KV memory (so engines
preempt) and bursts (``proofs/cost-lp-bound.md``).

The strong form checks the proof itself: the simulated schedule, mapped onto the LP's
columns (``cost_lp_embedding``), satisfies every row of the LP.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.evaluate.interval import fitting_subset
from lpserve.opt import solve
from lpserve.opt.cost_lp_build import build_cost_lp
from lpserve.registry import policy_names
from tests.properties.cost_lp_embedding import embed, violations
from tests.strategies import ANALYTIC_SLO, fallback_predictor

#: the default tier runs these; the slow tier runs every registered policy
FAST_POLICIES = ("vllm", "sarathi", "srpt-oracle", "orca", "vllm-compress-swap", "mcsf")


def shared_prefix_instance(seed: int, max_n: int = 10):
    """Bursty arrivals, prompts drawn from a few shared prefixes (block ids), a KV pool of
    a few thousand tokens (Llama-2-7B on one or two A100s at a small memory fraction)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, max_n + 1))
    bt = 16
    n_prefix = int(rng.integers(1, 4))
    prefix_blocks = rng.integers(1, 25, n_prefix)
    n_prefix = n_prefix if rng.random() < 0.7 else 1
    blocks, prompts = [], []
    uid = 10_000
    for _ in range(n):
        p = int(rng.integers(0, n_prefix))
        own = int(rng.integers(0, 12))
        lst = [1000 * (p + 1) + j for j in range(int(prefix_blocks[p]))] + \
            [uid + j for j in range(own)]
        uid += own
        blocks.append(lst)
        prompts.append(len(lst) * bt + int(rng.integers(1, bt)))
    outs = rng.integers(1, 600, n)
    arr = np.sort(rng.uniform(0.0, 0.4, n) * rng.choice([0.1, 1.0]))
    tr = lp.Trace.from_arrays(arrival_s=arr, prompt_tokens=prompts, output_tokens=outs,
                              block_ids=blocks, block_tokens=bt)
    frac = float(rng.choice([0.172, 0.176, 0.18, 0.19]))
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=int(rng.integers(1, 3)),
                    gpu_memory_fraction=frac, block_tokens=bt)
    # the SLO is for the policies whose targets mirror it (slo-aware, the Lyapunov controllers)
    return lp.Instance(trace=tr, cluster=cl, slo=ANALYTIC_SLO)


def shared_prefix_instances():
    """Hypothesis strategy of :func:`shared_prefix_instance`."""
    return st.integers(0, 2**31 - 1).map(shared_prefix_instance)


def _plain(names):
    return [n for n in names if lp.make_policy(n).engine.speculation is None]


def _check(inst, names, dt_scale=1.0):
    """Every policy of ``names`` that serves every request is above both bounds, and its
    schedule satisfies every row of the LP built with ``dt_scale`` (``lpserve gap``
    builds it on a grid four times coarser than the LP's default)."""
    sub, fits = fitting_subset(inst)
    lb = solve("cost-lp", sub, dt_scale=dt_scale)
    sr = solve("srpt-bound", sub)
    assert lb.status.value in ("optimal", "feasible"), lb.message
    checked = 0
    for name in names:
        log: list = []
        res = lp.simulate(sub, name, seed=0, reference=True, iteration_log=log,
                          predictor=fallback_predictor(sub, name))
        fin = res.arrays["status"] == "finished"
        if not fin.all():
            continue  # a run that drops a request is not a schedule of the instance
        total = float(res.arrays["e2e_s"].sum())
        for b in (lb, sr):
            assert b.bound <= total * (1 + 1e-7) + 1e-9, (name, b.formulation, b.bound, total)
        model, x = embed(sub, res, log, build_cost_lp(sub, dt_scale=dt_scale))
        bad = violations(model, x)
        assert not bad, (name, bad)
        checked += 1
    return checked


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_instances(), st.sampled_from([1.0, 4.0]))
def test_cost_lp_below_policies_shared_prefix_tight_kv(inst, dt_scale):
    _check(inst, _plain(FAST_POLICIES), dt_scale)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_instances(), st.sampled_from([1.0, 4.0]))
def test_cost_lp_below_every_registered_policy(inst, dt_scale):
    _check(inst, _plain(policy_names()), dt_scale)
