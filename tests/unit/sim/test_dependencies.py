"""Dependencies between calls (``Trace.parent``): release at the parent's finish."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.trace import generate as G

A100 = dict(gpu="a100-80gb", llm="llama-2-7b")


def _inst(prompt, output, parent, arrival=None, cost=None, horizon_s=None, **cluster):
    n = len(prompt)
    arrival = np.zeros(n) if arrival is None else np.asarray(arrival, float)
    tr = lp.Trace.from_arrays(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output,
                              parent=np.asarray(parent, np.int64),
                              program_id=np.zeros(n, np.int64))
    cost = lp.UnitRoundCost(memory_tokens=1000) if cost is None else cost
    return lp.Instance(trace=tr, cluster=lp.Cluster(**{**A100, "block_tokens": 1, **cluster}),
                       cost=cost, horizon_s=horizon_s)


def test_chain_runs_in_order_and_releases_at_parent_finish():
    inst = _inst([10, 10, 10], [5, 3, 4], [-1, 0, 1], arrival=[0.0, 1e-6, 2e-6])
    res = lp.simulate(inst, "vllm", check=True)
    a = res.arrays
    assert list(a["status"]) == ["finished"] * 3
    assert a["first_scheduled_s"][1] >= a["finish_s"][0]
    assert a["first_scheduled_s"][2] >= a["finish_s"][1]
    assert a["release_s"][0] == a["arrival_s"][0]
    assert a["release_s"][1] == a["finish_s"][0] and a["release_s"][2] == a["finish_s"][1]
    # latencies count from the release: each call alone takes o_i unit rounds
    assert list(a["e2e_s"]) == [5.0, 3.0, 4.0] and list(a["queue_s"]) == [0.0, 0.0, 0.0]
    assert res.summary()["e2e_s"]["mean"] == pytest.approx(4.0)
    ref = lp.simulate(inst, "vllm", reference=True)
    assert ref.digest() == res.digest()


def test_child_arriving_after_its_parent_finished_keeps_its_arrival():
    inst = _inst([10, 10], [2, 2], [-1, 0], arrival=[0.0, 10.0])
    a = lp.simulate(inst, "vllm").arrays
    assert a["release_s"][1] == 10.0 and a["first_scheduled_s"][1] == 10.0


def test_fan_out_children_released_together_on_several_replicas():
    inst = _inst([10, 10, 10, 10], [4, 3, 3, 3], [-1, 0, 0, 0], arrival=[0, 1e-6, 1e-6, 1e-6],
                 replicas=3)
    a = lp.simulate(inst, "vllm", check=True).arrays
    assert list(a["status"]) == ["finished"] * 4
    assert np.all(a["release_s"][1:] == a["finish_s"][0])
    assert len(set(a["replica"][1:].tolist())) > 1
    assert np.all(a["first_scheduled_s"][1:] == a["finish_s"][0])


def test_busy_replica_is_not_advanced_past_a_release():
    # replica 0 runs a long request; the child of a short one on replica 1 must be
    # routed at its parent's finish, while replica 0 is still mid-run
    inst = _inst([10, 10, 10], [50, 2, 2], [-1, -1, 1], arrival=[0.0, 0.0, 1e-6],
                 replicas=2)
    res = lp.simulate(inst, "vllm", check=True)
    a = res.arrays
    assert a["release_s"][2] == a["finish_s"][1] == 2.0
    assert a["finish_s"][2] < a["finish_s"][0]
    assert lp.simulate(inst, "vllm", reference=True).digest() == res.digest()


def test_rejected_parent_leaves_child_unrun():
    inst = _inst([5000, 10, 10], [5, 5, 5], [-1, 0, 1], arrival=[0.0, 1e-6, 2e-6])
    res = lp.simulate(inst, "vllm", check=True)
    a = res.arrays
    assert a["status"][0] == "rejected" and a["reason"][0] == "prompt_exceeds_kv"
    for c in (1, 2):
        assert a["status"][c] == "pending" and a["reason"][c] == "parent_not_finished"
        assert np.isnan(a["release_s"][c]) and np.isnan(a["e2e_s"][c])
    s = res.summary()
    assert s["n_rejected"] == 1 and s["n_unfinished"] == 2 and s["n_finished"] == 0
    assert s["reasons"] == {"parent_not_finished": 2, "prompt_exceeds_kv": 1}


def test_parent_unfinished_at_horizon():
    inst = _inst([10, 10, 10], [20, 2, 5], [-1, -1, 0], arrival=[0.0, 0.0, 1e-6],
                 horizon_s=10.0)
    res = lp.simulate(inst, "vllm", check=True)
    a = res.arrays
    assert a["status"][0] == "running" and a["reason"][0] == "horizon"
    assert a["status"][2] == "pending" and a["reason"][2] == "parent_not_finished"
    assert a["generated_tokens"][2] == 0 and np.isnan(a["release_s"][2])
    assert a["status"][1] == "finished"
    assert res.summary()["reasons"]["parent_not_finished"] == 1


def test_no_parents_release_equals_arrival_and_digest_ignores_it():
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 0.5], prompt_tokens=[10, 10],
                              output_tokens=[3, 3])
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**A100, block_tokens=1),
                       cost=lp.UnitRoundCost(memory_tokens=1000))
    res = lp.simulate(inst, "vllm")
    assert np.array_equal(res.arrays["release_s"], res.arrays["arrival_s"])
    assert "release_s" in res.requests.columns


def _programs(seed, n_programs):
    return G.agentic_programs(n_programs, program_arrivals=G.Poisson(0.5),
                              stages=G.Uniform(1, 4), fanout=G.Uniform(1, 3),
                              prompt=G.Uniform(4, 60), output=G.Uniform(1, 12), seed=seed)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000), n_programs=st.integers(1, 6),
       policy=st.sampled_from(["vllm", "sarathi", "plas", "atlas"]),
       replicas=st.integers(1, 3), memory=st.integers(60, 400),
       horizon=st.sampled_from([None, 15.0]))
def test_fast_equals_reference_on_agentic_traces(seed, n_programs, policy, replicas, memory,
                                                  horizon):
    tr = _programs(seed, n_programs)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**A100, block_tokens=4, replicas=replicas),
                       cost=lp.UnitRoundCost(memory_tokens=memory), horizon_s=horizon)
    fast = lp.simulate(inst, policy, check=True)
    ref = lp.simulate(inst, policy, reference=True)
    assert fast.digest() == ref.digest()
    a = fast.arrays
    par = tr.parent
    for c in np.flatnonzero(par >= 0).tolist():
        p = par[c]
        if a["status"][p] == "finished" and not np.isnan(a["release_s"][c]):
            assert a["release_s"][c] == max(a["arrival_s"][c], a["finish_s"][p])
        if not np.isnan(a["first_scheduled_s"][c]):
            assert a["first_scheduled_s"][c] >= a["finish_s"][p]
        if a["status"][p] != "finished":
            assert a["reason"][c] == "parent_not_finished"


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "plas", "atlas"])
def test_fast_equals_reference_with_the_a100_cost_model(policy):
    tr = G.agentic_programs(8, program_arrivals=G.Poisson(2.0), stages=G.Uniform(1, 5),
                            fanout=G.Uniform(1, 3), prompt=G.LogNormal(300, 1.0),
                            output=G.LogNormal(40, 1.0), seed=3)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**A100, replicas=2))
    fast = lp.simulate(inst, policy)
    assert fast.digest() == lp.simulate(inst, policy, reference=True).digest()
    assert (fast.arrays["status"] == "finished").all()
