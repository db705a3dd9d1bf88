"""Priority preemption and the time-sliced schedulers in the simulator: the fast path and
the reference mode (which consults the scheduler every iteration) give identical results,
the block and timing invariants hold, and every request finishes or is rejected with a
reason (nothing starves or livelocks)."""
from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import lpserve as lp

PREEMPTIVE = ["srpt-oracle", "las", "rr-sched", "mlfq", "fastserve", "fastserve-adaptive",
              "slo-aware", "plas", "atlas", "plas-mlfq", "mcsf", "a-min"]


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(PREEMPTIVE),
       st.sampled_from(["swap", "recompute", "compress-swap"]),
       st.sampled_from(["prefill-first", "decode-first", "mixed"]))
# found by search: a waiting request that outranks a running one preempts once free KV
# drops below its need (1979), or once a prefix-cache eviction raised its need (4853);
# a priority preemption changes the candidates mid-run (3145)
@example(1979, "slo-aware", "recompute", "prefill-first")
@example(4853, "atlas", "recompute", "decode-first")
@example(3145, "plas-mlfq", "recompute", "prefill-first")
def test_fast_equals_reference_with_priority_preemption(seed, name, preemption, batching):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 16))
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 2.0, n)),
                              prompt_tokens=rng.integers(16, 600, n),
                              output_tokens=rng.integers(1, 40, n),
                              program_id=rng.integers(0, 4, n))
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    gpu_memory_fraction=0.16,
                                                    replicas=int(rng.integers(1, 3))),
                       slo=lp.SLO(ttft_s=2.0, tpot_s=0.2))  # slo-aware's targets
    kw = dict(preemption=preemption, batching=batching, max_num_seqs=int(rng.integers(1, 9)))
    if batching == "decode-first":
        kw["chunked_prefill"] = True
    # the trace has no predictions: the prediction-reading schedulers run their fallback
    # (planned lengths default_tokens) on purpose
    pred = "none" if lp.make_policy(name).reads_predictions else None
    fast = lp.simulate(inst, lp.make_policy(name, **kw), seed=1, check=True, predictor=pred)
    ref = lp.simulate(inst, lp.make_policy(name, **kw), seed=1, reference=True, check=True,
                      predictor=pred)
    assert fast.digest() == ref.digest()
    st_ = fast.arrays["status"]
    assert np.all((st_ == "finished") | (st_ == "rejected")), set(fast.arrays["reason"])
