"""Routing formulations: integrality of the assignment LP, fluid duals, exported routers."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt import Status, solve
from lpserve.opt import routing_lp as RL
from lpserve.opt.solution import Solution, SolutionError
from lpserve.policy import RouterView


def _inst(n=60, R=3, seed=0, predicted=True):
    rng = np.random.default_rng(seed)
    o = rng.integers(5, 400, n)
    kw = dict(predicted_lo=np.maximum(o // 2, 1), predicted_hi=o * 2) if predicted else {}
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 30, n)),
                              prompt_tokens=rng.integers(10, 3000, n), output_tokens=o,
                              tenant=rng.integers(0, 3, n), **kw)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=R))


def _min_cost_flow(C, cap):
    import networkx as nx

    n, R = C.shape
    g = nx.DiGraph()
    g.add_node("s", demand=-n)
    g.add_node("t", demand=n)
    scale = 10**6
    for i in range(n):
        g.add_edge("s", ("r", i), capacity=1, weight=0)
        for j in range(R):
            g.add_edge(("r", i), ("m", j), capacity=1, weight=int(round(C[i, j] * scale)))
    for j in range(R):
        g.add_edge(("m", j), "t", capacity=int(cap[j]), weight=0)
    flow = nx.min_cost_flow(g)
    return sum(C[i, j] for i in range(n) for j in range(R) if flow[("r", i)][("m", j)])


def test_assignment_lp_is_integral_and_equals_min_cost_flow():
    rng = np.random.default_rng(1)
    for trial in range(5):
        n, R = 25, 4
        C = rng.uniform(0, 10, (n, R))
        cap = rng.integers(3, 10, R)
        cap[0] += max(0, n - cap.sum())
        inst = _inst(n, R)
        m = RL.build_assignment(inst, cost_s=C, capacity=cap)
        sol = RL.solve_assignment(m)
        res = RL.certify_assignment(m, sol)
        assert sol.status == Status.OPTIMAL
        assert res["integrality"] < 1e-9 and res["capacity"] == 0 and abs(res["rounding_loss_s"]) < 1e-9
        assert sol.objective == pytest.approx(_min_cost_flow(C, cap), abs=1e-4)


def test_assignment_cvxpy_agrees_and_infeasible_capacity():
    inst = _inst(40, 3)
    m = RL.build_assignment(inst)
    a, b = RL.solve_assignment(m), RL.solve_assignment(m, solver="cvxpy")
    assert a.objective == pytest.approx(b.objective, rel=1e-7)
    assert a.dual["capacity"].shape == (3,)
    bad = RL.solve_assignment(RL.build_assignment(inst, capacity=[5, 5, 5]))
    assert bad.status == Status.INFEASIBLE and "capacity sums to 15 < 40" in bad.message


def test_assignment_costs_prefer_faster_replica():
    inst = _inst(30, 2)
    # one engine profile for both, so the difference is the hardware's: the default profiles
    # differ (A100 kernels-only, H100 with vLLM's fitted per-layer overheads)
    fast = lp.cost_model(gpu="h100-sxm", llm="llama-2-7b", tp=1, engine="kernels")
    slow = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1, engine="kernels")
    m = RL.build_assignment(inst, replica_costs=[slow, fast])
    assert np.all(m.cost_s[:, 1] < m.cost_s[:, 0])
    assert m.capacity[1] >= m.capacity[0]


def _near_capacity_scale(inst, frac=0.97, **kw):
    """rate_scale at ``frac`` of the largest feasible one (bisection on LP feasibility)."""
    lo, hi = 1e-3, 1e4
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        ok = RL.solve_fluid(RL.build_fluid(inst, rate_scale=mid, **kw)).status == Status.OPTIMAL
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo * frac


def test_fluid_lp_duals_and_complementary_slackness():
    inst = _inst(300, 4, seed=2)
    a100 = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)
    # the Splitwise-era H100 profile: about 1.4x the A100's speed on this workload, so at
    # 60 % of capacity the fast replicas fill first and their rows bind with a price
    h100 = lp.cost_model(gpu="h100-sxm", llm="llama-2-7b", tp=1, calibration="splitwise-h100")
    kw = {"replica_costs": [a100, a100, h100, h100]}
    m = RL.build_fluid(inst, rate_scale=_near_capacity_scale(inst, 0.6, **kw), **kw)
    sol = RL.solve_fluid(m)
    assert sol.status == Status.OPTIMAL
    assert set(sol.dual) == {"demand", "prefill", "decode", "gpu", "kv", "cache_rate",
                             "cache_residency"}
    res = RL.certify_fluid(m, sol)
    assert res["demand"] < 1e-7 and res["capacity"] < 1e-7
    a = sol.primal["rate_per_s"]
    slack_dec = m.utilization * m.decode_tokens_per_s - m.output_tokens @ a
    assert np.all(sol.dual["decode"] * slack_dec <= 1e-6 * m.decode_tokens_per_s)
    # strong duality: b'y equals the objective
    b_dual = (m.rate_per_s @ sol.dual["demand"]
              - m.utilization * (m.prefill_tokens_per_s @ sol.dual["prefill"]
                                 + m.decode_tokens_per_s @ sol.dual["decode"]
                                 + sol.dual["gpu"].sum())
              - m.kv_tokens @ sol.dual["kv"])
    # the z <= 1 bounds add -sum(reduced costs of z) >= ... : weak duality from rows only
    # holds with equality when no z sits at its upper bound with a positive price
    assert b_dual <= sol.objective + 1e-6 * abs(sol.objective)
    assert max(sol.dual[k].max() for k in ("prefill", "decode", "gpu", "kv")) > 0


def test_fluid_infeasible_and_convex_form():
    inst = _inst(200, 2, seed=3)
    bad = RL.solve_fluid(RL.build_fluid(inst, rate_scale=1e4))
    assert bad.status == Status.INFEASIBLE and "tokens/s" in bad.message
    m = RL.build_fluid(inst, rate_scale=_near_capacity_scale(inst, 0.8))
    lp_sol, cvx = RL.solve_fluid(m), RL.solve_fluid_convex(m)
    assert cvx.status == Status.OPTIMAL
    assert cvx.objective >= lp_sol.objective - 1e-6   # congestion term is >= 0
    assert np.all(cvx.primal["gpu_utilization"] <= m.utilization + 1e-6)


def _view(inst, idx, outstanding):
    t = inst.trace
    R = outstanding.size
    return RouterView(now_s=0.0, n_replicas=R, phase="colocated", request=idx,
                      arrival_s=t.arrival_s[idx], prompt_tokens=t.prompt_tokens[idx],
                      tenant=t.tenant[idx], session_id=np.full(idx.size, -1),
                      predicted_lo=t.predicted_lo[idx], predicted_hi=t.predicted_hi[idx],
                      output_tokens=None, block_keys=(),
                      replica_state={"outstanding": outstanding, "waiting": outstanding,
                                     "running": outstanding * 0, "used_blocks": outstanding * 0,
                                     "total_blocks": outstanding * 0 + 100})


def test_exported_routers():
    inst = _inst(400, 3, seed=4)
    sol = solve("routing-fluid", inst, rate_scale=_near_capacity_scale(inst, 0.9))
    split = RL.export_fluid(sol, inst, kind="split")
    split.reset(inst.cluster, np.random.default_rng(0))
    idx = np.arange(400)
    counts = np.zeros(3)
    for _ in range(5):
        r = split.route(_view(inst, idx, np.zeros(3, np.int64)))
        counts += np.bincount(r, minlength=3)
    target = sol.primal["rate_per_s"].sum(axis=0)
    assert np.allclose(counts / counts.sum(), target / target.sum(), atol=0.05)
    index = RL.export_fluid(sol, inst)
    r = index.route(_view(inst, idx[:1], np.array([50, 0, 50])))
    assert r.tolist() == [1]
    many = index.route(_view(inst, idx[:30], np.zeros(3, np.int64)))
    assert len(set(many.tolist())) > 1          # routed-now requests count as queue
    asg = solve("routing-assignment", inst)
    router = RL.export_assignment(asg, inst)
    assert np.array_equal(router.route(_view(inst, idx[:10], np.zeros(3, np.int64))),
                          asg.primal["replica"][:10])


def test_split_router_one_request_path_draws_as_the_batch_path():
    """The one-request fast path (scalar bisection, one uniform draw) routes every request
    exactly as the batch path does from the same random stream."""
    inst = _inst(300, 3, seed=6)
    sol = solve("routing-fluid", inst, rate_scale=_near_capacity_scale(inst, 0.9))
    one, batch = (RL.export_fluid(sol, inst, kind="split") for _ in range(2))
    one.reset(inst.cluster, np.random.default_rng(11))
    batch.reset(inst.cluster, np.random.default_rng(11))
    idx = np.arange(300)
    singles = [int(one.route(_view(inst, idx[i:i + 1], np.zeros(3, np.int64)))[0])
               for i in idx]
    assert singles == batch.route(_view(inst, idx, np.zeros(3, np.int64))).tolist()
    assert len(set(singles)) == 3


def test_export_refuses_unsolved_and_foreign():
    inst = _inst(20, 2)
    with pytest.raises(SolutionError, match="status infeasible"):
        RL.export_fluid(Solution("routing-fluid", Status.INFEASIBLE), inst)
    sol = solve("routing-assignment", inst)
    with pytest.raises(SolutionError, match="solved for instance"):
        RL.export_assignment(sol, _inst(20, 2, seed=9))
