"""A run whose replicas the machine cannot hold is refused before they are built, with the
estimate (``lpserve.sim.memory``)."""
from __future__ import annotations

import pytest

import lpserve as lp
from lpserve.cli import main
from lpserve.sim import memory
from lpserve.sim.engine import Simulation
from lpserve.trace import generate as G


def _inst(replicas: int) -> lp.Instance:
    tr = G.synthetic(20, arrivals=G.Poisson(2.0), prompt=G.Uniform(100, 500),
                     output=G.Uniform(10, 50), seed=1)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=replicas))


def test_replica_bytes_grow_with_the_pool():
    sim = Simulation(_inst(2), lp.make_policy("vllm"))
    per = memory.replica_bytes(sim.front[0])
    assert per > 8 * 10 * sim.total_blocks  # at least ten int64 arrays over the pool
    small = Simulation(_inst(2).with_(cluster=lp.Cluster(
        gpu="a100-80gb", llm="llama-2-7b", gpu_memory_fraction=0.3)), lp.make_policy("vllm"))
    assert memory.replica_bytes(small.front[0]) < per


def test_check_refuses_with_the_estimate_and_passes_what_fits():
    sim = Simulation(_inst(1), lp.make_policy("vllm"))
    first = sim.front[0]
    per = memory.replica_bytes(first)
    memory.check_replicas(first, 10, "colocated", available=20 * per)  # fits
    with pytest.raises(MemoryError, match=r"1,000 colocated replicas would hold about .* GiB "
                                          r"\(.* MiB each: a pool of [\d,]+ KV blocks"):
        memory.check_replicas(first, 1000, "colocated", available=20 * per)
    with pytest.raises(MemoryError, match="simulate at most 16 replicas here"):
        memory.check_replicas(first, 1000, "colocated", available=20 * per)


def test_a_mixed_pool_is_sized_by_its_largest_replica():
    """A heterogeneous cluster's compiled replicas hold pools of different sizes: the check
    sizes each as the largest (the first replica here is the smaller A100-40GB one)."""
    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[10], output_tokens=[2])
    cl = lp.Cluster.mixed(llm="llama-3-8b", groups=[("a100-40gb", 1), ("h100-sxm", 1)])
    sim = Simulation(lp.Instance(trace=tr, cluster=cl), lp.make_policy("vllm"))
    small, big = (memory.replica_bytes(r) for r in sim.front)
    assert big > 1.5 * small
    blocks = [r.bm.total for r in sim.front]
    scale = blocks[1] / blocks[0]
    with pytest.raises(MemoryError, match="simulate at most 1 replicas here"):
        memory.check_replicas(sim.front[0], 2, "colocated", available=int(2 * small / 0.5),
                              scale=scale)
    memory.check_replicas(sim.front[0], 2, "colocated", available=int(2 * small / 0.5))


def test_a_pool_is_refused_for_the_replicas_its_requests_can_reach(monkeypatch):
    """Replicas are built when a request first reaches them (lpserve.sim.vacant): the check
    counts at most requests + 1 of them, and refuses those when they do not fit."""
    per = memory.replica_bytes(Simulation(_inst(1), lp.make_policy("vllm")).front[0])
    monkeypatch.setattr(memory, "available_bytes", lambda: 10 * per)
    Simulation(_inst(8), lp.make_policy("vllm"))  # 8 replicas fit
    with pytest.raises(MemoryError, match="21 colocated replicas would hold about"):
        Simulation(_inst(1_000_000), lp.make_policy("vllm"))


def test_ten_thousand_replicas_and_twenty_requests_run(capsys):
    assert main(["simulate", "--head", "20", "--replicas", "10000"]) == 0
    assert "mean" in capsys.readouterr().out
