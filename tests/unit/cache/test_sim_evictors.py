"""Every online evictor inside the simulator's prefix cache: runs with the block and
timing invariants checked, evicts, and serves prefix hits."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies.evictors_kv import EVICTORS, make_evictor
from lpserve.trace import generate as g
from tests.strategies import python_copy


def _instance(kv_fraction: float = 0.18) -> lp.Instance:
    tr = g.sessions(40, session_arrivals=g.Poisson(2.0), turns=g.Uniform(2, 5),
                    first_prompt=g.Uniform(200, 1500), turn_prompt=g.Uniform(20, 200),
                    output=g.Uniform(10, 120), think_time_s=5.0, block_tokens=16, seed=3)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    gpu_memory_fraction=kv_fraction))


@pytest.mark.parametrize("name", sorted(k[3:] for k in EVICTORS))
def test_evictor_runs_in_simulator(name):
    inst = _instance()
    res = lp.simulate(inst, lp.make_policy("vllm", evictor=name), seed=1, check=True)
    assert np.all(res.arrays["status"] == "finished")
    assert res.summary()["prefix_hit_rate"] > 0.05


def test_leaf_evictor_only_frees_leaves_when_it_can():
    """radix-lru: every block it gives up has no evictable cached child left behind."""
    seen = []
    base = make_evictor("radix-lru")
    ev = python_copy(base)  # written in Python (no twin): asked in pauses, with its views
    inner = ev.evict

    def spy(view, need):
        out = inner(view, need)
        gone = set(out.tolist())
        kids = np.bincount(view.parent[view.parent >= 0], minlength=len(view))
        for j in out.tolist():
            pinned = view.children[j] - kids[j]
            ch = np.flatnonzero(view.parent == j)
            if pinned == 0:
                assert set(ch.tolist()) <= gone, (j, ch)
        seen.append(len(out))
        return out

    ev.evict = spy
    twin = lp.simulate(_instance(), lp.make_policy("vllm", evictor=base), seed=1)
    res = lp.simulate(_instance(), lp.make_policy("vllm", evictor=ev), seed=1, check=True)
    assert res.stats["engine"] == "compiled+python-evictor" and sum(seen) > 0
    assert res.digest() == twin.digest()
