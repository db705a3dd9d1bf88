"""The DPP controller's kernels against their plain-Python twins, and its engine hook."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.kernels import dpp as K
from lpserve.policies.disagg import link_schedule, lyapunov_disagg, pool_sizes
from lpserve.policies.lyapunov import DPPController, TBTRecorder, constants, lyapunov, with_recorder
from lpserve.policy import EngineConfig
from lpserve.registry import make_policy
from lpserve.sim import simulate
from lpserve.trace import generate as G

COST = lp.cost_model(gpu="a100-80gb", llm="mistral-7b")
PARAMS = np.ascontiguousarray(COST.params, np.float64)


def _cp(V=2.0, S=0.05, eps=0.02, theta=0.8, grain=64):
    cp = np.zeros(K.N_CP)
    cp[[K.CP_V, K.CP_S_TBT, K.CP_EPS, K.CP_ETA, K.CP_THETA, K.CP_GRAIN, K.CP_BT]] = \
        [V, S, eps, 512.0, theta, grain, 16]
    return cp


def _random_state(rng):
    st = np.zeros(K.N_ST)
    st[K.ST_ZT] = rng.uniform(0, 50)
    st[K.ST_ZM] = rng.uniform(0, 5)
    return st


@pytest.mark.parametrize("seed", range(6))
def test_decide_matches_twin(seed):
    rng = np.random.default_rng(seed)
    for _ in range(20):
        n_cls = int(rng.integers(1, 4))
        q = rng.integers(0, 5000, n_cls).astype(float)
        w = rng.uniform(0.2, 2.0, n_cls)
        ctx = rng.integers(1, 4000, int(rng.integers(0, 120))).astype(np.int64)
        cp = _cp(V=rng.uniform(0, 20), S=rng.uniform(0.02, 0.2), grain=int(rng.integers(16, 200)))
        st1 = _random_state(rng)
        st2 = st1.copy()
        used, cap = float(rng.integers(0, 9000)), int(rng.integers(0, 2048))
        plan = rng.integers(1, 1500, int(rng.integers(0, 5))).astype(np.int64)
        cached = rng.integers(0, 3000, plan.size).astype(np.int64)
        u1 = K.dpp_decide(PARAMS, cp, st1, q, w, plan, cached, ctx, used, 10000.0, cap)
        u2 = K.dpp_decide_ref(PARAMS, cp, st2, q, w, plan, cached, ctx, used, 10000.0, cap)
        assert u1 == u2
        assert 0 <= u1 <= min(cap, q.sum())
        np.testing.assert_allclose(st1, st2, rtol=1e-12, atol=1e-12)


def test_v_zero_without_pressure_fills_the_budget():
    st = np.zeros(K.N_ST)
    ctx = np.full(50, 1000, np.int64)
    u = K.dpp_decide(PARAMS, _cp(V=0.0, S=10.0), st, np.array([1e5]), np.ones(1),
                     np.array([100000]), np.zeros(1, np.int64), ctx, 0.0, 1e4, 1998)
    assert u == 1998


def test_tbt_pressure_shrinks_the_chunk():
    ctx = np.full(100, 1000, np.int64)
    st = np.zeros(K.N_ST)
    cp = _cp(V=0.0, S=0.05)
    plan, cached = np.array([10000]), np.zeros(1, np.int64)
    free = K.dpp_decide(PARAMS, cp, st, np.array([1e4]), np.ones(1), plan, cached, ctx, 0.0,
                        1e4, 1948)
    st[K.ST_ZT] = 1e6
    tight = K.dpp_decide(PARAMS, cp, st, np.array([1e4]), np.ones(1), plan, cached, ctx, 0.0,
                         1e4, 1948)
    e = np.zeros(0, np.int64)
    assert tight < free
    t = K.iteration_time(PARAMS, np.array([tight]), np.zeros(1, np.int64), ctx) if tight \
        else K.iteration_time(PARAMS, e, e, ctx)
    assert t <= 0.05


def test_observe_and_decode_run_match_twins():
    rng = np.random.default_rng(3)
    for decide in (False, True):
        for _ in range(10):
            m = int(rng.integers(1, 60))
            ctx = rng.integers(10, 3000, m).astype(np.int64)
            held = (ctx + 1 + 15) // 16
            held = held.astype(np.int64)
            first = rng.uniform(0, 0.2, m)
            cp = _cp(V=rng.uniform(0, 5), S=rng.uniform(0.01, 0.05))
            st1 = _random_state(rng)
            st2 = st1.copy()
            args = (first, float(held.sum()), 20000.0, 3000.0, np.array([3000.0]), np.ones(1),
                    np.array([2000, 1000]), np.array([500, 0]), 1000, 0,
                    int(rng.integers(1, 200)), decide, 5.0)
            k1, e1 = K.dpp_decode_run(PARAMS, cp, st1, ctx, held, *args)
            k2, e2 = K.dpp_decode_run_ref(PARAMS, cp, st2, ctx, held, *args)
            assert k1 == k2 and e1 == pytest.approx(e2, rel=1e-12)
            np.testing.assert_allclose(st1, st2, rtol=1e-10, atol=1e-12)


def test_slotted_matches_twin():
    rng = np.random.default_rng(1)
    a = (rng.random(300) < 0.3) * 1024.0
    n = rng.choice([8, 64], 300).astype(np.int64)
    st1, q1 = K.dpp_slotted(PARAMS, _cp(V=3.0), a, n, 1000, 2048, 1e6)
    st2, q2 = K.dpp_slotted_ref(PARAMS, _cp(V=3.0), a, n, 1000, 2048, 1e6)
    np.testing.assert_allclose(st1, st2, rtol=1e-10)
    np.testing.assert_allclose(q1, q2)


def _instance(n=150, rate=9.0, seed=2, replicas=1):
    tr = G.synthetic(n, arrivals=G.Poisson(rate_per_s=rate),
                     prompt=G.LogNormal(mean=900, cv=1.0, max_tokens=5000),
                     output=G.LogNormal(mean=120, cv=1.0, max_tokens=800), seed=seed)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="mistral-7b",
                                                    replicas=replicas),
                       slo=lp.SLO(ttft_s=2.0, tpot_s=0.1))


@pytest.mark.parametrize("V", [0.0, 1.0, 20.0])
def test_fast_equals_reference_with_the_controller(V):
    inst = _instance()
    pol = lyapunov(V=V, tbt_slo_s=0.06)
    fast = simulate(inst, pol, seed=0)
    rep_fast = pol.engine.budget_controller.report()
    ref = simulate(inst, pol, seed=0, reference=True)
    assert fast.digest() == ref.digest()
    assert pol.engine.budget_controller.report() == rep_fast
    assert fast.summary()["n_finished"] == len(inst.trace)


@pytest.mark.parametrize("recorder", [False, True])
def test_a_controller_written_in_python_is_asked_in_pauses_of_the_compiled_replicas(
        recorder):
    """A budget controller without a compiled twin (a subclass of DPP or of the TBT
    recorder: the same decisions in Python) is asked in pauses (its budget, each
    iteration, each decode run's limit and length), with its views: the run stays compiled and equals the reference mode and the twin's run, and
    the controller's report is the twin's."""
    inst = _instance()

    def make(in_python):
        pol = with_recorder(make_policy("sarathi"), 0.05) if recorder else \
            lyapunov(V=1.0, tbt_slo_s=0.06)
        if in_python:
            c = pol.engine.budget_controller
            c.__class__ = type("InPython", (type(c),), {})
        return pol

    py = make(True)
    fast = simulate(inst, py, seed=0, check=True)
    rep_fast = py.engine.budget_controller.report()
    assert fast.stats["engine"] == "compiled+python-controller"
    ref = simulate(inst, make(True), seed=0, reference=True)
    twin_pol = make(False)
    twin = simulate(inst, twin_pol, seed=0)
    assert twin.stats["engine"] == "compiled"
    assert fast.digest() == ref.digest() == twin.digest()
    assert rep_fast == twin_pol.engine.budget_controller.report()


def test_recorder_changes_nothing_and_counts_every_gap():
    inst = _instance(replicas=2)
    for name in ("sarathi", "vllm"):
        plain = simulate(inst, make_policy(name, prefix_caching=False), seed=0)
        pol = with_recorder(make_policy(name, prefix_caching=False), 0.05)
        rec = simulate(inst, pol, seed=0)
        for col in ("finish_s", "first_token_s", "preemptions"):
            assert np.array_equal(plain.arrays[col], rec.arrays[col], equal_nan=True)
        gaps = pol.engine.budget_controller.report()["tbt_samples"]
        done = rec.arrays["status"] == "finished"
        assert gaps == float((inst.trace.output_tokens[done] - 1).sum())


def test_controller_meets_the_percentile_target():
    inst = _instance(n=250, rate=12.0)
    base = with_recorder(make_policy("sarathi", max_num_batched_tokens=2048), 0.05)
    simulate(inst, base, seed=0)
    pol = lyapunov(V=1.0, tbt_slo_s=0.05, eps=0.01)
    simulate(inst, pol, seed=0)
    rep = pol.engine.budget_controller.report()
    assert base.engine.budget_controller.report()["tbt_violation_fraction"] > 0.05
    assert rep["iteration_violation_fraction"] <= 0.012
    assert rep["tbt_violation_fraction"] <= 0.02


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="V"):
        DPPController(V=-1.0)
    with pytest.raises(ValueError, match="eps"):
        DPPController(eps=1.5)
    with pytest.raises(ValueError, match="tbt_slo_s"):
        TBTRecorder(0.0)
    with pytest.raises(ValueError, match="budget_controller"):
        EngineConfig(budget_controller=object())
    with pytest.raises(RuntimeError, match="before any run"):
        DPPController().report()


def test_constants_formula():
    c = constants(COST, budget_tokens=1024, max_decodes=64, max_arrival_tokens=2048,
                  eta_tokens=512, eps=0.01, theta=0.9, mean_prompt_tokens=300,
                  mean_output_tokens=100)
    assert c["B"] == pytest.approx((2048 ** 2 + 1024 ** 2) / (2 * 512 ** 2)
                                   + 0.5 * (64 * 0.99) ** 2 + 0.5 * 0.81)
    assert c["C"] == pytest.approx(1024 ** 2 / (4 * 512 ** 2))
    assert c["p_max"] > 0 and c["capacity_rps"] == pytest.approx(
        1024 / (c["t_b_s"] * 400))


def test_pool_sizes_cover_the_load():
    out = pool_sizes(COST, rate_rps=15.0, mean_prompt_tokens=1500, mean_output_tokens=250,
                     tpot_slo_s=0.04, max_utilization=0.8, link_gbps=50.0)
    assert out["status"] == "Optimal"
    assert out["prefill_utilization"] <= 0.8 + 1e-9 and out["decode_utilization"] <= 0.8 + 1e-9
    smaller = pool_sizes(COST, rate_rps=5.0, mean_prompt_tokens=1500, mean_output_tokens=250,
                         tpot_slo_s=0.04, max_utilization=0.8)
    assert smaller["prefill_replicas"] + smaller["decode_replicas"] <= \
        out["prefill_replicas"] + out["decode_replicas"]


def test_link_orders_on_an_edf_feasible_set():
    # one long transfer with a loose deadline ready first, then short urgent ones
    ready = np.array([0.0, 0.001, 0.002, 0.003])
    size = np.array([1e9, 1e7, 1e7, 1e7])  # bytes; 0.08 s and 0.0008 s at 100 Gb/s
    deadline = np.array([1.0, 0.01, 0.012, 0.014])
    fcfs = link_schedule(ready, size, deadline, 100.0, "fcfs")
    llf = link_schedule(ready, size, deadline, 100.0, "llf")
    rmlq = link_schedule(ready, size, deadline, 100.0, "rmlq")
    assert fcfs["late"].sum() == 3
    # non-preemptive: the long transfer started at 0 before the others were ready
    assert llf["late"].sum() == 3 and rmlq["late"].sum() == 3
    ready2 = np.array([0.0, 0.0, 0.0, 0.0])
    llf2 = link_schedule(ready2, size, deadline, 100.0, "llf")
    fcfs2 = link_schedule(ready2, size, deadline, 100.0, "fcfs")
    assert llf2["late"].sum() == 0 and fcfs2["late"].sum() == 3
    with pytest.raises(ValueError, match="order"):
        link_schedule(ready, size, deadline, 100.0, "lifo")


def test_disagg_policy_runs_on_pools():
    tr = _instance(n=60, rate=4.0).trace
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="mistral-7b",
                                                    prefill_replicas=1, decode_replicas=1),
                       slo=lp.SLO(ttft_s=2.0, tpot_s=0.1))
    res = simulate(inst, lyapunov_disagg(), seed=0)
    assert res.summary()["n_finished"] == 60
    assert set(res.arrays["decode_replica"].tolist()) == {0}


def test_kv_pressure_holds_prefill_back():
    ctx = np.full(20, 500, np.int64)
    plan, cached = np.array([4000]), np.zeros(1, np.int64)
    st = np.zeros(K.N_ST)
    cp = _cp(V=0.0, S=10.0)
    free = K.dpp_decide(PARAMS, cp, st, np.array([4000.0]), np.ones(1), plan, cached, ctx,
                        9000.0, 10000.0, 2028)
    st[K.ST_ZM] = 1e5
    held = K.dpp_decide(PARAMS, cp, st, np.array([4000.0]), np.ones(1), plan, cached, ctx,
                        9000.0, 10000.0, 2028)
    assert free == 2028 and held < free
    # Z_KV grows while occupancy stays above theta, eq. (6)
    st2 = np.zeros(K.N_ST)
    for _ in range(10):
        K.dpp_observe(cp, st2, 0.01, 20, 9500.0, 10000.0, 0.0, np.zeros(0))
    assert st2[K.ST_ZM] == pytest.approx(10 * (0.95 - 0.8))


def test_two_classes_rank_by_weighted_backlog_and_match_reference():
    rng = np.random.default_rng(5)
    n = 120
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 12, n)),
                              prompt_tokens=rng.integers(50, 3000, n),
                              output_tokens=rng.integers(5, 200, n),
                              tenant=rng.integers(0, 2, n))
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="mistral-7b"),
                       slo=lp.SLO(ttft_s=2.0, tpot_s=0.1))
    pol = lyapunov(V=1.0, tbt_slo_s=0.06, class_weights=(1.0, 4.0))
    fast = simulate(inst, pol, seed=0)
    ref = simulate(inst, pol, seed=0, reference=True)
    assert fast.digest() == ref.digest() and fast.summary()["n_finished"] == n
    # the heavier class waits less on average
    q = fast.arrays["queue_s"]
    assert np.nanmean(q[tr.tenant == 1]) <= np.nanmean(q[tr.tenant == 0])


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_invariants_under_memory_pressure(preemption):
    tr = _instance(n=120, rate=20.0, seed=4).trace
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="mistral-7b",
                                                    gpu_memory_fraction=0.2),
                       slo=lp.SLO(ttft_s=2.0, tpot_s=0.1))
    pol = lyapunov(V=1.0, tbt_slo_s=0.08, theta=0.7).with_(engine={"preemption": preemption})
    fast = simulate(inst, pol, seed=0, check=True)
    ref = simulate(inst, pol, seed=0, reference=True)
    assert fast.digest() == ref.digest()
    assert fast.summary()["preemptions"] > 0
    assert pol.engine.budget_controller.report()["mean_z_kv"] > 0


def test_observing_equal_gaps_at_once_is_observing_them_one_by_one():
    """A decode run's later iterations are observed with one histogram add
    (``dpp_observe_equal``): the state is bit for bit the one ``dpp_observe`` leaves with
    the same gap given once per request, on both sides of the TBT target."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        m = int(rng.integers(1, 300))
        cp = _cp(V=rng.uniform(0, 5), S=rng.uniform(0.01, 0.05))
        gap = float(rng.choice([rng.uniform(0.001, 0.2), 0.0]))
        st1 = _random_state(rng)
        st2 = st1.copy()
        args = (gap, m, float(rng.integers(0, 5000)), 20000.0, float(rng.integers(0, 4000)))
        K.dpp_observe(cp, st1, *args, np.full(m, gap))
        K.dpp_observe_equal(cp, st2, *args, gap)
        assert np.array_equal(st1, st2)
