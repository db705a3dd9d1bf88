"""Properties of the locality-aware routing LP and of every KV-aware router
(``proofs/routing-locality-index.md``, ``proofs/assignment-integrality.md``):

* identical replicas, nothing cached, zero prices: the LP router in its fluid-price form
  decides exactly as join-the-shortest-queue, and in its default live form exactly as
  join-the-least-work;
* the assignment LP with the locality cost terms (cached prefixes, each replica's own
  speed) and forbidden pairs (KV) stays integral and equals the min-cost flow;
* no router ever picks a replica that cannot hold the request when another can.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.opt import routing_lp as RL
from lpserve.opt.routing_locality import locality_costs
from lpserve.opt.routing_profile import replica_profile
from lpserve.opt.solution import Status
from lpserve.policies.routers import LeastOutstanding
from lpserve.policies.routers_deployed import DynamoKV, LlmdScheduler, SGLangCacheAware
from lpserve.policies.routers_locality import LocalityIndexRouter
from lpserve.policies.routers_preble import Preble
from lpserve.policy import RouterView

PROFILE = replica_profile(lp.cost_model(gpu="a100-80gb", llm="llama-2-7b"), c_max=8192)
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _view(R, prompts, outstanding, pending, running, used, cached=None, maxp=None, keys=(),
          square=None):
    n = len(prompts)
    st_ = {"outstanding": np.asarray(outstanding), "waiting": np.asarray(outstanding),
           "running": np.asarray(running), "used_blocks": np.asarray(used),
           "total_blocks": np.full(R, 100_000)}
    if maxp is not None:
        st_["max_prompt_tokens"] = np.asarray(maxp)
    return RouterView(
        now_s=1.0, n_replicas=R, phase="colocated", request=np.arange(n),
        arrival_s=np.zeros(n), prompt_tokens=np.asarray(prompts), tenant=np.full(n, -1),
        session_id=np.full(n, -1), predicted_lo=None, predicted_hi=None, output_tokens=None,
        block_keys=tuple(np.asarray(k, np.int64) for k in keys) or
        tuple(np.zeros(0, np.int64) for _ in range(n)),
        replica_state=st_, block_tokens=16, key_tokens=64,
        cached_tokens=np.zeros((n, R), np.int64) if cached is None else np.asarray(cached),
        load_state={"prefill_tokens": np.asarray(pending), "cached_blocks": np.zeros(R),
                    "prefill_square_tokens": np.zeros(R, np.int64) if square is None
                    else np.asarray(square)})


@st.composite
def identical_states(draw):
    R = draw(st.integers(2, 8))
    n = draw(st.integers(1, 4))
    ints = lambda lo, hi, k: np.array(draw(st.lists(st.integers(lo, hi), min_size=k,
                                                     max_size=k)), np.int64)
    return (R, ints(1, 8000, n), ints(0, 6, R), ints(0, 60_000, R), ints(0, 40, R),
            ints(0, 5000, R))


@SETTINGS
@given(identical_states())
def test_identical_replicas_no_cache_lp_router_is_jsq(state):
    R, prompts, out, pend, run, used = state
    v = _view(R, prompts, out, pend, run, used)
    jsq = LeastOutstanding().route(v)
    fluid_form = LocalityIndexRouter.from_profiles([PROFILE] * R, backlog="requests",
                                                   prefill="static", decode="reference")
    assert fluid_form.route(v).tolist() == jsq.tolist()


@SETTINGS
@given(identical_states())
def test_identical_replicas_no_cache_live_lp_router_is_least_work(state):
    R, prompts, out, pend, run, used = state
    run, used = np.full(R, run[0]), np.full(R, used[0])   # the same batch everywhere
    # the backlog's attention: a prefix of each pending prefill already done
    square = (pend * pend - (pend // 3) ** 2).astype(np.int64)
    v = _view(R, prompts, out, pend, run, used, square=square)
    live = LocalityIndexRouter.from_profiles([PROFILE] * R)
    # join-the-least-work: the least prefill work still to run, ties to the lowest index,
    # each routed request adding its own prefill work
    work = pend + live.attention_s * square / live.per_token
    want = []
    for P in prompts.tolist():
        c = int(np.argmin(work))
        want.append(c)
        work[c] += P + live.attention_s[c] * P * P / live.per_token[c]
    assert live.route(v).tolist() == want


@pytest.mark.slow
def test_exported_lp_router_ties_jsq_on_identical_replicas():
    # the routing-locality LP of a light homogeneous instance: no row binds, every price
    # is 0, and its exported router (fluid-price form) routes as least-outstanding
    rng = np.random.default_rng(5)
    n = 80
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 60, n)),
                              prompt_tokens=rng.integers(50, 2000, n),
                              output_tokens=rng.integers(5, 200, n))
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=4))
    sol = lp.solve("routing-locality", inst)
    assert sol.solved
    assert all(np.all(sol.dual[k] == 0) for k in ("prefill", "decode", "gpu", "kv"))
    from lpserve.opt.routing_locality import export_locality

    r = export_locality(sol, inst, backlog="requests", prefill="static", decode="reference")
    a = lp.simulate(inst, lp.make_policy("vllm", router=r)).requests["replica"]
    b = lp.simulate(inst, "vllm+least-outstanding").requests["replica"]
    assert a.tolist() == b.tolist()


def _min_cost_flow(C, cap, ok):
    import networkx as nx

    n, R = C.shape
    g = nx.DiGraph()
    g.add_node("s", demand=-n)
    g.add_node("t", demand=n)
    for i in range(n):
        g.add_edge("s", ("r", i), capacity=1, weight=0)
        for j in range(R):
            if ok[i, j]:
                g.add_edge(("r", i), ("m", j), capacity=1, weight=int(round(C[i, j] * 1e6)))
    for j in range(R):
        g.add_edge(("m", j), "t", capacity=int(cap[j]), weight=0)
    flow = nx.min_cost_flow(g)
    return sum(C[i, j] for i in range(n) for j in range(R)
               if ok[i, j] and flow[("r", i)][("m", j)])


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000))
def test_assignment_lp_with_locality_costs_is_integral(seed):
    _integral_with_locality_costs(seed)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000))
def test_assignment_lp_with_locality_costs_is_integral_many(seed):
    _integral_with_locality_costs(seed)


def _integral_with_locality_costs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 30))
    cl = lp.Cluster.mixed(llm="llama-3-8b", groups=[("h100-sxm", 1), ("a100-40gb", 2),
                                                    ("a100-80gb", 1, 2)])
    prompt = rng.integers(100, 250_000, n)
    out = rng.integers(1, 500, n)
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 10, n)), prompt_tokens=prompt,
                              output_tokens=out)
    inst = lp.Instance(trace=tr, cluster=cl)
    cached = (rng.uniform(0, 1, (n, 4)) * prompt[:, None] * (rng.uniform(0, 1, (n, 4)) < 0.5)
              ).astype(np.int64)
    C, ok = locality_costs(inst, cached, backlog_s=rng.uniform(0, 5, 4))
    kv40 = lp.cost_model(gpu="a100-40gb", llm="llama-3-8b").kv_capacity_tokens(0.9)
    assert ok[:, 1].tolist() == (prompt + out <= kv40).tolist()   # (4a) on the 40 GB ones
    fits = ok.any(axis=1)
    C, ok = C[fits], ok[fits]
    cap = rng.integers(1, max(2, fits.sum() // 2 + 2), 4)
    cap[0] += max(0, int(fits.sum()) - int(cap.sum()))
    m = RL.build_assignment(inst.with_(trace=tr.take(np.flatnonzero(fits))), cost_s=C,
                            capacity=cap, allowed=ok)
    sol = RL.solve_assignment(m)
    if sol.status == Status.INFEASIBLE:   # capacity where the requests fit is short
        return
    res = RL.certify_assignment(m, sol)
    assert sol.status == Status.OPTIMAL
    assert res["integrality"] < 1e-9 and res["allowed"] == 0.0 and res["capacity"] == 0
    assert abs(res["rounding_loss_s"]) < 1e-6 * max(1.0, abs(sol.objective))
    assert sol.objective == pytest.approx(_min_cost_flow(C, cap, ok), rel=1e-6, abs=1e-3)


def test_assignment_costs_price_cached_prefixes_and_speed():
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 1.0], prompt_tokens=[20_000, 20_000],
                              output_tokens=[10, 10])
    cl = lp.Cluster.mixed(llm="llama-3-8b", groups=[("h100-sxm", 1), ("a100-40gb", 1)])
    inst = lp.Instance(trace=tr, cluster=cl)
    cached = np.array([[0, 0], [0, 19_968]])
    m = RL.build_assignment(inst, cached_tokens=cached, capacity=[2, 2])
    assert m.cost_s[0, 0] < m.cost_s[0, 1]          # nothing cached: the faster GPU
    assert m.cost_s[1, 1] < m.cost_s[1, 0]          # cached on the slower one: there
    sol = RL.solve_assignment(m)
    assert sol.primal["replica"].tolist() == [0, 1]


def _routers(R):
    out = [DynamoKV(), LlmdScheduler(), SGLangCacheAware(), Preble(),
           LocalityIndexRouter.from_profiles([PROFILE] * R)]
    for r in out:
        r.reset(lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=R),
                np.random.default_rng(0))
    return out


@SETTINGS
@given(st.integers(0, 10**6))
def test_routers_never_pick_a_replica_that_cannot_hold_the_request(seed):
    rng = np.random.default_rng(seed)
    R = int(rng.integers(2, 7))
    routers = _routers(R)
    for _ in range(4):
        n = int(rng.integers(1, 4))
        prompts = rng.integers(1, 9000, n)
        maxp = rng.integers(500, 9000, R)
        maxp[rng.integers(R)] = 9000                      # someone can hold every prompt
        keys = [rng.integers(0, 5, int(rng.integers(1, 6))) for _ in range(n)]
        cached = (rng.uniform(0, 1, (n, R)) * prompts[:, None]).astype(np.int64)
        v = _view(R, prompts, rng.integers(0, 80, R), rng.integers(0, 90_000, R),
                  rng.integers(0, 40, R), rng.integers(0, 4000, R), cached=cached,
                  maxp=maxp, keys=keys)
        for r in routers:
            got = r.route(v)
            assert np.all(prompts <= maxp[got]), (r.name, prompts, maxp, got)


@pytest.mark.slow
def test_no_router_sends_a_prompt_where_the_engine_rejects_it():
    # a mixed cluster whose 40 GB replicas cannot hold the long prompts: in the simulator
    # no request is rejected for KV while an H100 could hold it
    rng = np.random.default_rng(2)
    n = 60
    cl = lp.Cluster.mixed(llm="llama-3-8b", groups=[("h100-sxm", 1), ("a100-40gb", 2)])
    blocks = lp.cost_model(gpu="a100-40gb", llm="llama-3-8b").kv_capacity_blocks(16, 0.9)
    prompt = np.where(rng.uniform(size=n) < 0.1, int(blocks * 16 * 1.3),
                      rng.integers(100, 4000, n))
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 600, n)), prompt_tokens=prompt,
                              output_tokens=rng.integers(1, 30, n))
    inst = lp.Instance(trace=tr, cluster=cl)
    from lpserve.opt.routing_locality import export_locality

    lp_router = export_locality(lp.solve("routing-locality", inst), inst, chunk_tokens=8192)
    for router in ("dynamo-kv", "llm-d", "sglang-cache-aware", "preble", lp_router):
        pol = lp.make_policy("vllm-chunked", router=router, max_num_batched_tokens=8192)
        df = lp.simulate(inst, pol).requests
        assert not (df["reason"] == "prompt_exceeds_kv").any(), router
        assert (df.loc[prompt > blocks * 16, "replica"] == 0).all(), router
