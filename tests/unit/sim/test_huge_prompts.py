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
