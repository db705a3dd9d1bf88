"""Replicas built when a request first reaches them (``lpserve.sim.vacant``): nothing
changes but the memory a run holds."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.sim import engine as E
from lpserve.sim.engine import Simulation
from lpserve.sim.vacant import Vacant
from lpserve.trace import generate as G


def _inst(replicas: int, n: int = 30, **cluster) -> lp.Instance:
    tr = G.synthetic(n, arrivals=G.Poisson(20.0), prompt=G.Uniform(100, 900),
                     output=G.Uniform(5, 60), seed=4)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=replicas, **cluster))


def _eager(monkeypatch, inst, policy, **kw):
    with monkeypatch.context() as m:
        m.setattr(E, "lazy_ok", lambda *a: False)
        return lp.simulate(inst, policy, **kw)


@pytest.mark.parametrize("policy,reference,cluster", [
    ("vllm", False, {}), ("vllm", True, {}), ("sarathi", False, {}),
    ("vllm+dynamo-kv", False, {}), ("vllm", False, dict(prefill_replicas=3,
                                                         decode_replicas=4, replicas=1)),
])
def test_lazy_and_eager_pools_give_the_same_run(monkeypatch, policy, reference, cluster):
    kw = dict(cluster) or dict(replicas=40)
    inst = _inst(**kw)
    lazy = lp.simulate(inst, policy, reference=reference, check=True)
    eager = _eager(monkeypatch, inst, policy, reference=reference, check=True)
    assert lazy.digest() == eager.digest()
    a, b = dict(lazy.stats), dict(eager.stats)
    a.pop("wall_s"), b.pop("wall_s")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]), k  # NaN == NaN


def test_only_reached_replicas_are_built():
    sim = Simulation(_inst(10_000, n=20), lp.make_policy("vllm"))
    assert sum(isinstance(r, Vacant) for r in sim.front) == 9_999
    sim.run()
    built = [r for r in sim.front if not getattr(r, "vacant", False)]
    assert 1 <= len(built) <= 21
    reached = set(sim.state.replica.tolist())
    assert reached <= {r.index for r in built}


def test_a_vacant_replica_answers_as_a_fresh_one_and_builds_when_asked():
    sim = Simulation(_inst(3), lp.make_policy("vllm"))
    first, v = sim.front[0], sim.front[2]
    assert isinstance(v, Vacant) and v.key == ("colocated", 2)
    for k in ("now", "outstanding", "n_waiting", "n_running", "n_iters", "wm_blocks", "bt"):
        assert getattr(v, k) == getattr(first, k), k
    assert v.bm.total == first.bm.total and v.bm.used == 0 and not v.running
    assert v.cached_prefix_tokens(0) == 0 and v.step(1.0) is False
    assert isinstance(sim.front[2], Vacant)
    params = v.params  # anything else builds the replica in its slot
    assert not isinstance(sim.front[2], Vacant) and sim.front[2].index == 2
    assert np.array_equal(params, sim.front[2].params) and v.index == 2
