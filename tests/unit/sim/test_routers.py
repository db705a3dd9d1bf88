"""Routers on crafted views and in simulation."""
from __future__ import annotations

import numpy as np

import lpserve as lp
from lpserve.policies.routers import (
    LeastKVLoad,
    LeastOutstanding,
    PowerOfTwo,
    PrefixAffinity,
    RandomRouter,
)
from lpserve.policy import RouterView


def _view(n, outstanding, keys=None, used=None, total=None):
    R = len(outstanding)
    z = np.zeros(n, np.int64)
    state = {"outstanding": np.asarray(outstanding), "waiting": np.zeros(R, np.int64),
             "running": np.asarray(outstanding),
             "used_blocks": np.zeros(R, np.int64) if used is None else np.asarray(used),
             "total_blocks": np.full(R, 100) if total is None else np.asarray(total)}
    return RouterView(now_s=0.0, n_replicas=R, phase="colocated", request=np.arange(n),
                      arrival_s=np.zeros(n), prompt_tokens=z + 32, tenant=z, session_id=z,
                      predicted_lo=None, predicted_hi=None, output_tokens=None,
                      block_keys=keys or tuple(np.zeros(0, np.int64) for _ in range(n)),
                      replica_state=state)


def _reset(r, seed=0):
    r.reset(None, np.random.default_rng(seed))
    return r


def test_least_outstanding_counts_its_own_routing():
    assert _reset(LeastOutstanding()).route(_view(3, [2, 0, 1])).tolist() == [1, 1, 2]


def test_least_kv_load():
    r = _reset(LeastKVLoad())
    assert r.route(_view(1, [0, 0, 0], used=[50, 10, 30])).tolist() == [1]


def test_power_of_two_picks_the_lighter_of_two_and_is_seeded():
    outs = [_reset(PowerOfTwo(), s).route(_view(50, [0, 100, 100, 100])).tolist()
            for s in (1, 1)]
    assert outs[0] == outs[1]
    assert outs[0].count(0) > 20  # replica 0 wins whenever it is sampled
    assert set(_reset(RandomRouter(), 3).route(_view(200, [0] * 4)).tolist()) == {0, 1, 2, 3}


def test_prefix_affinity_follows_prefixes_until_imbalanced():
    r = _reset(PrefixAffinity())
    k = np.array([11, 12, 13], np.int64)
    first = r.route(_view(1, [0, 0, 0], keys=(k,))).tolist()[0]
    # same prefix goes to the same replica even though it is now the busiest
    assert r.route(_view(1, [5, 5, 5], keys=(k,))).tolist() == [first]
    loads = [0, 0, 0]
    loads[first] = 200
    # imbalance beyond 64 and 1.5x: least loaded instead
    assert r.route(_view(1, loads, keys=(k,))).tolist()[0] != first
    # unknown prefix: least loaded
    assert r.route(_view(1, [3, 1, 2], keys=(np.array([99], np.int64),))).tolist() == [1]


def test_prefix_affinity_raises_hit_rate_in_simulation():
    n = 120
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 16, n)
    ids = [[int(g) * 100 + j for j in range(4)] + [10_000 + i] for i, g in enumerate(groups)]
    tr = lp.Trace.from_arrays(arrival_s=np.arange(n) * 0.05, prompt_tokens=[2500] * n,
                              output_tokens=[8] * n, block_ids=ids, block_tokens=512)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=4))
    rr = lp.simulate(inst, "vllm").summary()["prefix_hit_rate"]
    pa = lp.simulate(inst, "vllm+prefix-affinity").summary()["prefix_hit_rate"]
    assert pa > rr + 0.2


def test_a_pool_of_one_replica_does_not_ask_its_router():
    """With one replica there is no choice: the router is not asked (models/simulator.md
    (17)) and the run equals round robin's; with two it is asked at every arrival."""
    from lpserve.policy import Router

    class Counting(Router):
        name = "counting"
        reads_completions = True

        def __init__(self):
            self.calls = 0

        def route(self, view):
            self.calls += 1
            assert view.completions is not None  # read, as a completion reader does
            return np.zeros(len(view), np.int64)

    tr = lp.Trace.from_arrays(arrival_s=np.linspace(0.0, 2.0, 12),
                              prompt_tokens=np.full(12, 200), output_tokens=np.full(12, 20))
    base = lp.make_policy("vllm")
    for replicas, asked in ((1, False), (2, True)):
        inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                        replicas=replicas))
        router = Counting()
        res = lp.simulate(inst, base.with_(router=router, name="counting"), seed=0)
        assert (res.arrays["status"] == "finished").all()
        assert (router.calls > 0) == asked, (replicas, router.calls)
        if replicas == 1:
            assert np.array_equal(res.arrays["finish_s"],
                                  lp.simulate(inst, base, seed=0).arrays["finish_s"])
