"""Every registered formulation honours the contract build -> solve -> certify -> export:
solve returns a Solution with a status, the instance digest and a bound <= objective;
certify's residuals are ~0; export refuses unsolved and foreign solutions."""
from __future__ import annotations

import math

import numpy as np
import pytest

import lpserve as lp
from lpserve.instance import load_instance
from lpserve.opt import FORMULATIONS, Status, formulation, solve
from lpserve.opt.solution import Solution, SolutionError


def _instances():
    toy, _ = load_instance("toy")
    rng = np.random.default_rng(0)
    n = 30
    o = rng.integers(1, 200, n)
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 10, n)),
                              prompt_tokens=rng.integers(8, 1500, n), output_tokens=o,
                              predicted_lo=np.maximum(o // 2, 1), predicted_hi=2 * o)
    gpu = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                   replicas=2))
    return {"toy": toy, "analytic": gpu}


NEEDS_MEMORY = {"schedule-ip", "schedule-lp", "schedule-area"}


@pytest.mark.parametrize("name", sorted(FORMULATIONS))
def test_contract(name):
    f = formulation(name)
    assert f.name == name
    for label, inst in _instances().items():
        opts = {"memory_tokens": 12_000} if name in NEEDS_MEMORY and label == "analytic" else {}
        if name in NEEDS_MEMORY and label == "analytic":
            # seconds are rounded up to rounds; the round model still applies
            opts["round_s"] = 1.0
        if name == "schedule-exact" and len(inst.trace) > 7:
            continue  # enumerates tiny instances only (tested in test_cost_lp.py)
        sol = solve(name, inst, time_limit_s=2, **opts)
        assert isinstance(sol, Solution) and sol.formulation == name
        if name in ("routing-fluid", "routing-locality") and label == "toy":
            # 4 requests at once on 8 tokens of KV: Little's law cannot hold
            assert sol.status == Status.INFEASIBLE and "KV tokens" in sol.message
            continue
        if sol.status == Status.LIMIT:
            assert math.isnan(sol.objective)
            continue
        if name.startswith("schedule-") and name not in NEEDS_MEMORY and label == "toy":
            # 8 tokens of KV hold no 16-token block: the simulator cannot run the toy
            assert sol.status == Status.ERROR and "no room for KV blocks" in sol.message
            continue
        assert sol.status in (Status.OPTIMAL, Status.FEASIBLE), (label, sol.message)
        assert sol.digest == inst.digest() and sol.wall_s >= 0
        if math.isfinite(sol.bound) and math.isfinite(sol.objective):
            assert sol.bound <= sol.objective + 1e-6 * max(1.0, abs(sol.objective))
        res = f.certify(f.build(inst, **opts), sol)
        assert all(abs(v) < 1e-6 for v in res.values()), (label, res)
        summary = sol.summary()
        assert {"status", "objective", "bound", "gap", "wall_s"} <= set(summary)
        if f.export is None:
            continue
        unsolved = Solution(name, Status.LIMIT, digest=inst.digest())
        with pytest.raises(SolutionError):
            f.export(unsolved, inst)
        other = inst.with_(slo=lp.SLO(ttft_s=123.0))
        with pytest.raises(SolutionError):
            f.export(sol, other)
        if not f.is_bound:
            role = f.export(sol, inst)
            assert hasattr(role, "reset")
