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


@pytest.mark.skipif(memory.available_bytes() is None,
                    reason="the machine does not tell its available memory (/proc/meminfo)")
def test_a_million_replicas_are_refused_up_front(capsys):
    assert main(["simulate", "--head", "20", "--replicas", "1000000"]) == 2
    err = capsys.readouterr().err
    assert "1,000,000 colocated replicas would hold about" in err and "GiB" in err
