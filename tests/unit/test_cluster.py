"""Heterogeneous clusters: Cluster.mixed, per-replica cost models, the simulator pricing
each replica by its own model and KV capacity, and the cost-model bound on them."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.cost import cost_models_for
from lpserve.policy import Router


def _mixed(**kw):
    return lp.Cluster.mixed(llm="llama-3-8b", groups=[("h100-sxm", 1), ("a100-40gb", 2, 1),
                                                      lp.ReplicaGroup("a100-80gb", 1, 2)], **kw)


def test_mixed_cluster_layout_and_validation():
    cl = _mixed()
    assert cl.n_replicas == 4 and cl.heterogeneous and cl.n_gpus == 5
    assert cl.replica_types() == [("h100-sxm", 1), ("a100-40gb", 1), ("a100-40gb", 1),
                                  ("a100-80gb", 2)]
    assert (cl.gpu, cl.tp, cl.replicas) == ("h100-sxm", 1, 4)
    assert cl.describe().startswith("1 x h100-sxm tp=1 + 2 x a100-40gb tp=1")
    assert cl.as_dict()["groups"][2] == {"gpu": "a100-80gb", "count": 1, "tp": 2}
    with pytest.raises(ValueError, match="first group's GPU"):
        lp.Cluster(gpu="a100-80gb", llm="llama-3-8b", replicas=4, groups=cl.groups)
    with pytest.raises(ValueError, match="ReplicaGroup.tp"):
        lp.ReplicaGroup("h100-sxm", 1, 3)
    with pytest.raises(ValueError, match="from the groups"):
        lp.Cluster.mixed(llm="llama-3-8b", groups=[("h100-sxm", 1)], replicas=2)
    with pytest.raises(ValueError, match="colocated only"):
        lp.Cluster(gpu="h100-sxm", llm="llama-3-8b", replicas=1, prefill_replicas=1,
                   decode_replicas=1, groups=(lp.ReplicaGroup("h100-sxm", 2),))


def test_homogeneous_cluster_unchanged():
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", tp=2, replicas=3)
    assert not cl.heterogeneous and cl.n_gpus == 6 and "groups" not in cl.as_dict()
    assert cl.replica_types() == [("a100-80gb", 2)] * 3
    # a one-type mixed cluster is not heterogeneous
    assert not lp.Cluster.mixed(llm="llama-2-7b", groups=[("a100-80gb", 3, 2)]).heterogeneous


def test_instance_cost_models_per_replica():
    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[10], output_tokens=[2])
    inst = lp.Instance(trace=tr, cluster=_mixed())
    costs = inst.replica_cost_models()
    assert [c.gpu.key for c in costs] == ["h100-sxm", "a100-40gb", "a100-40gb", "a100-80gb"]
    assert costs[1] is costs[2] and costs[3].tp == 2
    with pytest.raises(ValueError, match="replica_cost_models"):
        inst.cost_model()
    with pytest.raises(ValueError, match="3 cost models for 4 replicas"):
        lp.Instance(trace=tr, cluster=_mixed(), cost=(lp.cost_model(),) * 3)
    with pytest.raises(ValueError, match="cost_models_for"):
        lp.cost.cost_model_for(_mixed())
    assert len(cost_models_for(_mixed())) == 4
    # digests of homogeneous instances do not see the new field
    hom = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    assert hom.digest() != inst.digest() and hom.digest() == lp.Instance(
        trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b")).digest()


class _Table(Router):
    """Routes request i to replica table[i]."""

    name = "table"

    def __init__(self, table):
        self.table = np.asarray(table)

    def route(self, view):
        return self.table[view.request].astype(np.int64)


def test_each_replica_priced_by_its_own_model_and_kv():
    # the same request, alone, on each replica of a mixed cluster: its prefill takes that
    # replica's time, plus its profile's front-end latency (models/simulator.md (33)), and
    # each replica holds its own number of KV blocks
    cl = _mixed()
    n = 4
    tr = lp.Trace.from_arrays(arrival_s=np.arange(n) * 100.0, prompt_tokens=[6000] * n,
                              output_tokens=[1] * n)
    inst = lp.Instance(trace=tr, cluster=cl)
    pol = lp.make_policy("vllm-chunked", router=_Table(np.arange(n)),
                         max_num_batched_tokens=8192)
    res = lp.simulate(inst, pol)
    costs = inst.replica_cost_models()
    want = np.array([c.batch_time_s(prefill_tokens=[6000]) + c.frontend_latency_s
                     for c in costs])
    assert len({c.frontend_latency_s for c in costs}) == 2  # H100's V1 profile has one
    assert np.allclose(res.requests["ttft_s"].to_numpy(), want, rtol=1e-9)
    blocks = [c.kv_capacity_blocks(block_tokens=cl.block_tokens,
                                   gpu_memory_fraction=cl.gpu_memory_fraction) for c in costs]
    assert res.stats["replica_total_blocks"] == blocks and len(set(blocks)) == 3
    # a prompt that fits the H100 but not the A100-40GB is rejected only there
    big = int(blocks[1] * cl.block_tokens * 1.2)
    tr2 = lp.Trace.from_arrays(arrival_s=[0.0, 1.0], prompt_tokens=[big, big],
                               output_tokens=[1, 1])
    res2 = lp.simulate(lp.Instance(trace=tr2, cluster=cl),
                       lp.make_policy("vllm-chunked", router=_Table([0, 1])))
    assert res2.requests["reason"].tolist() == ["", "prompt_exceeds_kv"]


def test_heterogeneous_runs_refuse_what_they_cannot_simulate():
    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[10], output_tokens=[2])
    inst = lp.Instance(trace=tr, cluster=_mixed())
    with pytest.raises(ValueError, match="rebalancer is not simulated on a heterogeneous"):
        lp.simulate(inst, "rebalance-llumnix")
    res = lp.simulate(inst, lp.make_policy("vllm", prefix_caching=False))
    assert res.summary()["n_finished"] == 1


@pytest.mark.parametrize("name", ["vllm", "vllm+least-outstanding", "vllm+dynamo-kv",
                                  "sarathi", "mlfq", "vllm-compress-swap", "fastserve"])
def test_a_mixed_cluster_runs_compiled_replicas_equal_to_the_reference(name):
    """Each compiled replica of a mixed cluster is priced by its own cost model, swap
    prices and KV blocks: the same requests' times as the reference mode, per request
    (fastserve's overlapped host link and proactive swapping included)."""
    rng = np.random.default_rng(5)
    n = 120
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 6, n)),
                              prompt_tokens=rng.integers(100, 3000, n),
                              output_tokens=rng.integers(1, 300, n))
    inst = lp.Instance(trace=tr, cluster=_mixed(gpu_memory_fraction=0.45))
    fast = lp.simulate(inst, name, seed=1, check=True)
    ref = lp.simulate(inst, name, seed=1, reference=True, check=True)
    assert fast.stats["engine"] == "compiled"
    assert fast.digest() == ref.digest()
    assert fast.stats["replica_total_blocks"] == ref.stats["replica_total_blocks"]
    assert len(set(fast.stats["replica_total_blocks"])) == 3


@pytest.mark.parametrize("case", ["offload", "history"])
def test_a_mixed_cluster_prices_offload_and_predicts_per_replica(case):
    """The CPU offload's loads are priced by each replica's own cost model, and with the
    History predictor a mixed cluster takes its arrivals one at a time (the one-call path
    prices every replica with one model): both equal the reference mode per request."""
    rng = np.random.default_rng(7)
    n = 150
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 8, n)),
                              prompt_tokens=rng.integers(100, 3000, n),
                              output_tokens=rng.integers(1, 300, n),
                              session_id=rng.integers(0, 12, n))
    inst = lp.Instance(trace=tr, cluster=_mixed(gpu_memory_fraction=0.45))
    if case == "offload":
        pol, kw = lp.make_policy("vllm", kv_offload_gib=16.0), {}
    else:
        pol, kw = "sjf-predicted", {"predictor": "history"}
    fast = lp.simulate(inst, pol, seed=1, **kw)
    ref = lp.simulate(inst, pol, seed=1, reference=True, **kw)
    assert fast.stats["engine"] == "compiled"
    assert fast.digest() == ref.digest()
    if case == "offload":
        assert fast.stats["offload"] == ref.stats["offload"]


def test_cost_bound_on_a_mixed_cluster_is_below_the_simulation():
    rng = np.random.default_rng(3)
    n = 40
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 5, n)),
                              prompt_tokens=rng.integers(100, 3000, n),
                              output_tokens=rng.integers(1, 60, n))
    inst = lp.Instance(trace=tr, cluster=_mixed())
    table = lp.compare(inst, ["vllm+least-outstanding", "vllm+dynamo-kv"])
    assert (table["ratio_to_bound"] >= 1.0 - 1e-9).all()
