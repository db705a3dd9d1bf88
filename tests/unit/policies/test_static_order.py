"""StaticOrder / StaticRoute: the compiled replica loop orders by the key array exactly as
the reference mode (rank = keys[request]) does."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies.baselines import engine_policy
from lpserve.policies.static_order import StaticOrder, StaticRoute, order_keys
from lpserve.policy import PolicyError
from lpserve.sim.twins import RANK_EXTERNAL, rank_spec


def _inst(n=40, seed=0, R=2):
    rng = np.random.default_rng(seed)
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 3, n)),
                              prompt_tokens=rng.integers(20, 2500, n),
                              output_tokens=rng.integers(1, 300, n))
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=R, gpu_memory_fraction=0.2))


@pytest.mark.parametrize("engine,extra", [("sarathi", {"max_num_batched_tokens": 96}),
                                          ("vllm", {}), ("orca", {}),
                                          ("vllm", {"max_num_seqs": 4})])
def test_compiled_static_order_equals_reference(engine, extra):
    inst = _inst()
    rng = np.random.default_rng(1)
    keys = rng.permutation(len(inst.trace)).astype(float)
    pol = engine_policy(engine, prefix_caching=False, **extra).with_(
        scheduler=StaticOrder(keys))
    assert rank_spec(pol.scheduler)[0] != RANK_EXTERNAL
    fast = lp.simulate(inst, pol)
    ref = lp.simulate(inst, pol, reference=True)
    for col in ("first_token_s", "finish_s", "preemptions", "replica", "status"):
        a, b = fast.arrays[col], ref.arrays[col]
        assert np.array_equal(a, b) if a.dtype == object else np.allclose(a, b, equal_nan=True)


def test_static_order_by_arrival_is_fcfs():
    inst = _inst(seed=2)
    base = engine_policy("sarathi", prefix_caching=False)
    a = lp.simulate(inst, base)
    b = lp.simulate(inst, base.with_(scheduler=StaticOrder(inst.trace.arrival_s)))
    assert np.allclose(a.arrays["finish_s"], b.arrays["finish_s"])


def test_keys_must_match_the_trace():
    inst = _inst(n=10)
    pol = engine_policy("sarathi", prefix_caching=False).with_(scheduler=StaticOrder([1.0, 2.0]))
    with pytest.raises(PolicyError, match="2 keys, the trace has 10"):
        lp.simulate(inst, pol)
    with pytest.raises(ValueError, match="not finite"):
        StaticOrder([1.0, np.inf])
    with pytest.raises(ValueError, match="permutation"):
        order_keys([0, 0, 1])
    assert order_keys([2, 0, 1]).tolist() == [1.0, 2.0, 0.0]


def test_static_route_sends_each_request_where_told():
    inst = _inst(n=12)
    where = np.arange(12) % 2
    pol = engine_policy("sarathi", prefix_caching=False).with_(router=StaticRoute(where))
    res = lp.simulate(inst, pol)
    assert np.array_equal(res.arrays["replica"], where)
    bad = engine_policy("sarathi", prefix_caching=False).with_(router=StaticRoute([5] * 12))
    with pytest.raises(PolicyError, match="replica 5"):
        lp.simulate(inst, bad)
