"""A prompt longer than any replica's KV pool is rejected as ``prompt_exceeds_kv`` in fast
and reference mode alike, with no allocation proportional to its length (the compiled
replica had sized its slot buffers from the longest prompt of the trace: 23.9 GiB for
10^8 tokens)."""
from __future__ import annotations

import pytest

import lpserve as lp


@pytest.mark.parametrize("prompt", [10**8, 10**12, 2**53 - 1])
@pytest.mark.parametrize("reference", [False, True])
def test_huge_prompt_is_rejected_without_allocating_for_it(prompt, reference):
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 0.1], prompt_tokens=[prompt, 100],
                              output_tokens=[5, 5])
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    res = lp.simulate(inst, "vllm", reference=reference)
    assert list(res.arrays["status"]) == ["rejected", "finished"]
    assert res.arrays["reason"][0] == "prompt_exceeds_kv"


ROUTED = """
import lpserve as lp
tr = lp.Trace.from_arrays(arrival_s=[0.0, 0.1, 0.2], prompt_tokens=[300, 5000, 200],
                          output_tokens=[5, 5, 5])
cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", gpu_memory_fraction=0.17, replicas=2)
inst = lp.Instance(trace=tr, cluster=cl)
for name in ("vllm+prefix-affinity", "vllm+dynamo-kv", "vllm+sglang-cache-aware"):
    res = lp.simulate(inst, name)
    assert list(res.arrays["reason"]) == ["", "prompt_exceeds_kv", ""], name
"""


def test_routers_look_up_a_prompt_longer_than_the_pool():
    """Routers that read the replicas' cached prefixes key an arriving prompt before the
    replica rejects it; a prompt longer than the pool (2,144 tokens here) must stay inside
    the compiled key buffer."""
    exec(ROUTED, {})


@pytest.mark.slow
def test_routers_look_up_a_prompt_longer_than_the_pool_bounds_checked(tmp_path):
    """The same with numba's bounds checks on (its own kernel cache): an out-of-bounds
    write in the key buffer, silent and heap-corrupting otherwise, is an IndexError."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", ROUTED], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
