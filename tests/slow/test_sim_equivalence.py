"""Fast mode == reference mode on many hypothesis instances and on real traces."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

import lpserve as lp
from tests.strategies import RESULT_FIELDS, same_array
from tests.strategies import sim_instances

pytestmark = pytest.mark.slow


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(sim_instances(max_size=30))
def test_fast_equals_reference_many(case):
    inst, policy = case
    fast = lp.simulate(inst, policy, seed=5, check=True)
    ref = lp.simulate(inst, policy, seed=5, reference=True, check=True)
    assert fast.digest() == ref.digest()


@pytest.mark.parametrize("name, params", [
    ("vllm", {}), ("sarathi", {}), ("vllm", {"prefix_caching": False}),
    ("vllm-chunked", {"preemption": "swap"}), ("orca", {}),
    ("vllm+prefix-affinity", {}),
])
def test_fast_equals_reference_on_real_traces(name, params):
    for trace_name, n in (("azure-conv-10min", 600), ("mooncake-conv-5min", 300)):
        tr = lp.bundled_trace(trace_name).head(n).rebased()
        inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                        replicas=2, gpu_memory_fraction=0.2))
        pol = lp.make_policy(name, **params)
        fast = lp.simulate(inst, pol, check=True)
        ref = lp.simulate(inst, pol, reference=True)
        for f in RESULT_FIELDS:
            assert same_array(fast.arrays[f], ref.arrays[f]), (trace_name, f)
