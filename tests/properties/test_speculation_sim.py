"""Speculative decoding in the simulator on hypothesis instances: fast == reference,
invariants (check=True), tokens never past the output, seeded reproducibility."""
from __future__ import annotations

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.policies.speculation import (
    AcceptanceUCBSpeculation,
    FixedSpeculation,
    NeverSpeculate,
    OracleSpeculation,
    UCBSpeculation,
)
from tests.strategies import SIM_ENGINES, fast_and_reference, sim_traces


@st.composite
def spec_instances(draw):
    """(Instance, Policy) pairs: analytic costs, tight memory, any engine, any decider."""
    tr = draw(sim_traces(max_size=20))
    tenants = draw(st.sampled_from([None, (0, 1), (0, 1, 2)]))
    kw = {}
    if tenants is not None:
        kw["tenant"] = draw(st.lists(st.sampled_from(tenants), min_size=len(tr),
                                     max_size=len(tr)))
    if tr.has_blocks:
        kw.update(block_ids=tr.block_lists(), block_tokens=tr.block_tokens)
    tr = lp.Trace.from_arrays(arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                              output_tokens=tr.output_tokens * draw(st.sampled_from([1, 6])),
                              name="spec-hyp", **kw)
    frac = draw(st.sampled_from([0.1675, 0.169, 0.171, 0.9]))
    disagg = draw(st.booleans())
    layout = (dict(replicas=1, prefill_replicas=draw(st.integers(1, 2)),
                   decode_replicas=draw(st.integers(1, 2)))
              if disagg else dict(replicas=draw(st.integers(1, 2))))
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=16,
                    gpu_memory_fraction=frac,
                    host_memory_gb=draw(st.sampled_from([0.0, 0.01, 64.0])), **layout)
    rate = st.floats(0.0, 0.98)
    if tenants is None:
        acceptance = draw(rate)
    else:
        acceptance = {t: draw(rate) for t in tenants}
    draft = "llama-68m" if frac < 0.5 or draw(st.booleans()) else ("llama-68m",
                                                                     "tinyllama-1.1b")
    max_k = draw(st.integers(1, 5))
    kind = draw(st.sampled_from(["never", "fixed", "ucb", "acceptance-ucb", "oracle"]))
    if kind == "never":
        dec = NeverSpeculate(draft, acceptance)
    elif kind == "fixed":
        dec = FixedSpeculation(draw(st.integers(0, max_k)), draft, acceptance, max_k=max_k)
    elif kind == "ucb":
        dec = UCBSpeculation(draft, acceptance, max_k=max_k)
    elif kind == "acceptance-ucb":
        dec = AcceptanceUCBSpeculation(draft, acceptance, max_k=max_k)
    else:
        dec = OracleSpeculation(draft, acceptance, max_k=max_k)
    engine = draw(st.sampled_from(SIM_ENGINES))
    params: dict = {"router": draw(st.sampled_from(["round-robin", "least-outstanding"]))}
    if engine in ("vllm", "vllm-v0", "vllm-chunked", "sarathi"):
        params["preemption"] = draw(st.sampled_from(["recompute", "swap"]))
        params["max_num_seqs"] = draw(st.integers(1, 8))
        params["max_num_batched_tokens"] = draw(st.sampled_from([64, 256, 4096]))
        params["prefix_caching"] = draw(st.booleans())
    else:
        params["max_num_seqs"] = draw(st.integers(1, 6))
        params["reserve_tokens"] = draw(st.sampled_from([512, 1024]))
        params["max_model_len"] = params["reserve_tokens"]
    policy = lp.make_policy(engine, speculation=dec, **params)
    inst = lp.Instance(trace=tr, cluster=cl, horizon_s=draw(st.sampled_from([None, 2.0])))
    return inst, policy


@settings(max_examples=60, deadline=None)
@given(spec_instances())
def test_speculation_fast_equals_reference_and_invariants_hold(case):
    inst, policy = case
    fast, ref = fast_and_reference(inst, policy, seed=5)
    counters = ("steps", "speculative_steps", "draft_tokens", "accepted_tokens",
                "emitted_tokens", "sequence_steps")
    for k in counters:
        assert fast.stats["speculation"][k] == ref.stats["speculation"][k], k
    again = lp.simulate(inst, policy, seed=5)
    assert again.digest() == fast.digest()  # same seed, same run
    a = fast.arrays
    st_ = a["status"]
    assert np.all((st_ == "finished") | (a["reason"] != ""))
    assert np.all(a["generated_tokens"] <= a["output_tokens"])
    fin = st_ == "finished"
    assert np.all(a["generated_tokens"][fin] == a["output_tokens"][fin])
    assert np.all(a["finish_s"][fin] >= a["first_token_s"][fin])
    c = fast.stats["speculation"]
    # every sequence-step emits 1..k+1 tokens: at least one each, at most max_k + 1 each
    assert c["sequence_steps"] <= c["emitted_tokens"]
    assert c["emitted_tokens"] <= c["sequence_steps"] * (policy.engine.speculation.max_k + 1)
    assert c["accepted_tokens"] <= c["draft_tokens"]
    event(f"speculative steps > 0: {c['speculative_steps'] > 0}")
    event(f"preemptions > 0: {int(a['preemptions'].sum()) > 0}")
