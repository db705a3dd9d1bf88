"""Fast mode == reference mode on many hypothesis instances and on real traces."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

import lpserve as lp
from tests.strategies import fast_and_reference, sim_instances

pytestmark = pytest.mark.slow


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(sim_instances(max_size=30))
def test_fast_equals_reference_many(case):
    inst, policy = case
    fast_and_reference(inst, policy, seed=5)


@pytest.mark.parametrize("name, params", [
    ("vllm", {}), ("vllm-v0", {}), ("sarathi", {}), ("vllm-v0", {"prefix_caching": False}),
    ("vllm-chunked", {"preemption": "swap"}), ("orca", {}),
    ("vllm+prefix-affinity", {}),
])
def test_fast_equals_reference_on_real_traces(name, params):
    for trace_name, n in (("azure-conv-10min", 600), ("mooncake-conv-5min", 300)):
        tr = lp.bundled_trace(trace_name).head(n).rebased()
        inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                        replicas=2, gpu_memory_fraction=0.2))
        pol = lp.make_policy(name, **params)
        fast_and_reference(inst, pol, label=trace_name)
