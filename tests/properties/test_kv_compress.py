"""Compress-and-swap preemption (models/kv-compression-swap.md): on random small traces
with tight host memory, host memory is never exceeded, no request is lost (each finishes
or is reported with a reason), a swapped-in request comes back with its whole context,
and the fast path equals the reference mode; the cost-based decider's choice is never
slower than recompute and always fits (proofs/kv-compress-decider.md)."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.cost.preemption import compressed_host_blocks
from lpserve.policies.kvcompress import CostBasedDecider
from lpserve.policy import PreemptionView
from tests.strategies import preempting_instance

ENGINES = ["vllm-v0", "vllm-chunked", "fastserve", "las", "srpt-oracle", "mlfq"]


@st.composite
def tight_host_cases(draw):
    n = draw(st.integers(2, 16))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    # bursts of long-running requests on a small KV pool: preemptions are frequent
    span_s = draw(st.sampled_from([0.3, 2.0]))
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, span_s, n)),
                              prompt_tokens=rng.integers(16, 700, n),
                              output_tokens=rng.integers(1, 150, n))
    # 0.01 GB holds one 16-token block of llama-2-7b (8.4 MB); 0.2 GB about 23
    host_gb = draw(st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.2, 0.2, 64.0]))
    frac = draw(st.sampled_from([0.16, 0.171, 0.171]))  # 31 or 144 KV blocks
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(
        gpu="a100-80gb", llm="llama-2-7b", gpu_memory_fraction=frac,
        host_memory_gb=host_gb, replicas=draw(st.integers(1, 2))))
    name = draw(st.sampled_from(ENGINES))
    kw = dict(preemption=draw(st.sampled_from(["compress-swap", "swap"])),
              compression_ratio=draw(st.sampled_from([1.5, 2.0, 4.0, 8.0])),
              compression_accuracy_cost=draw(st.sampled_from([0.0, 1e-3])),
              max_num_seqs=draw(st.integers(2, 16)))
    if draw(st.booleans()):
        kw["preemption_decider"] = CostBasedDecider(
            swap_budget_s=draw(st.sampled_from([0.0, 0.05, math.inf])),
            max_quality_loss=draw(st.sampled_from([0.0, 0.5, math.inf])))
    return inst, name, kw


@settings(max_examples=80, deadline=None)
@given(tight_host_cases())
def test_compress_swap_never_exceeds_host_memory_and_never_loses_a_request(case):
    inst, name, kw = case
    # check=True raises InvariantError if host_free < 0, if host blocks of swapped
    # requests do not add up, if a swapped request's GPU blocks do not cover its context,
    # or if a request ends swapped out without a reason
    fast = lp.simulate(inst, lp.make_policy(name, **kw), seed=1, check=True)
    ref = lp.simulate(inst, lp.make_policy(name, **kw), seed=1, reference=True, check=True)
    assert fast.digest() == ref.digest()
    a = fast.arrays
    st_ = a["status"]
    assert np.all((st_ == "finished") | (st_ == "rejected")), set(a["reason"])
    assert np.all(a["reason"][st_ == "rejected"] != "")
    fin = st_ == "finished"
    assert np.all(a["generated_tokens"][fin] == a["output_tokens"][fin])
    s = fast.stats
    assert 0 <= s["compressed_swaps"] <= s["swaps"]
    if kw["preemption"] == "swap" and "preemption_decider" not in kw:
        assert s["compressed_swaps"] == 0
    assert s["compression_quality_loss"] == kw["compression_accuracy_cost"] * \
        s["compressed_tokens"]
    assert 0.0 <= s["swap_wait_s"] <= s["busy_s"] + 1e-9


def test_compressed_swaps_happen_where_full_swaps_do_not_fit():
    """Host memory for a few compressed victims but not one full one: compress-swap
    swaps, swap falls back to recompute; both lose nothing."""
    inst = preempting_instance(0, host_memory_gb=0.2)
    out = {}
    for mode in ("swap", "compress-swap"):
        r = lp.simulate(inst, lp.make_policy("fastserve", preemption=mode), check=True)
        assert np.all(r.arrays["status"] == "finished")
        out[mode] = r.stats
    assert out["compress-swap"]["compressed_swaps"] > 0
    assert out["compress-swap"]["compressed_swaps"] == out["compress-swap"]["swaps"]
    assert out["swap"]["compressed_swaps"] == 0


@st.composite
def victim_views(draw):
    held = draw(st.integers(0, 400))
    ratio = draw(st.floats(1.01, 16.0))
    cost = draw(st.floats(0.0, 0.01))
    ctx = draw(st.integers(0, held * 16))
    # host room drawn on purpose at the boundaries: one block short of, exactly, or one
    # block over the full or the compressed size, as well as anywhere
    comp = compressed_host_blocks(held, ratio)
    free = draw(st.one_of(st.integers(0, 500),
                          st.integers(-2, 2).map(lambda d: max(held + d, 0)),
                          st.integers(-2, 2).map(lambda d: max(comp + d, 0))))
    return PreemptionView(
        now_s=0.0, replica=0, request=0, context_tokens=ctx, held_blocks=held,
        block_tokens=16, host_free_blocks=free, compression_ratio=ratio,
        compression_accuracy_cost=cost, recompute_s=draw(st.floats(0.0, 2.0)),
        swap_s=draw(st.floats(0.0, 2.0)), compress_swap_s=draw(st.floats(0.0, 2.0)),
        swap_host_blocks=held, compress_host_blocks=compressed_host_blocks(held, ratio))


def test_decider_at_the_host_memory_boundary():
    """A victim of 100 blocks whose swap is fast: with 100 free host blocks it is swapped,
    with 99 it is not (compressed, 25 blocks at ratio 4, or recomputed with 24 free)."""
    def view(free: int) -> PreemptionView:
        return PreemptionView(
            now_s=0.0, replica=0, request=0, context_tokens=1600, held_blocks=100,
            block_tokens=16, host_free_blocks=free, compression_ratio=4.0,
            compression_accuracy_cost=0.0, recompute_s=1.0, swap_s=0.1, compress_swap_s=0.2,
            swap_host_blocks=100, compress_host_blocks=compressed_host_blocks(100, 4.0))
    d = CostBasedDecider()
    assert compressed_host_blocks(100, 4.0) == 25
    assert [d.decide(view(f)) for f in (100, 99, 25, 24)] == \
        ["swap", "compress-swap", "compress-swap", "recompute"]


@settings(max_examples=60, deadline=None)
@given(held=st.integers(1, 400), ratio=st.floats(1.01, 16.0), short=st.sampled_from(["full",
       "compressed"]), rec=st.floats(0.5, 2.0), frac=st.floats(0.0, 0.9))
def test_decider_never_needs_a_host_block_more_than_is_free(held, ratio, short, rec, frac):
    """Host room one block short of the full (or the compressed) size, both swaps faster
    than recomputing: the victim must not get the option it has no room for."""
    comp = compressed_host_blocks(held, ratio)
    free = held - 1 if short == "full" else comp - 1
    v = PreemptionView(
        now_s=0.0, replica=0, request=0, context_tokens=held * 16, held_blocks=held,
        block_tokens=16, host_free_blocks=max(free, 0), compression_ratio=ratio,
        compression_accuracy_cost=0.0, recompute_s=rec, swap_s=frac * rec,
        compress_swap_s=frac * rec, swap_host_blocks=held, compress_host_blocks=comp)
    c = CostBasedDecider().decide(v)
    host = {"recompute": 0, "swap": held, "compress-swap": comp}[c]
    assert host <= v.host_free_blocks, (c, held, comp, v.host_free_blocks)
    assert c != "swap"


@settings(max_examples=300, deadline=None)
@given(victim_views(), st.sampled_from([0.0, 0.1, math.inf]),
       st.sampled_from([0.0, 1.0, math.inf]))
def test_decider_choice_is_safe_and_no_slower(v, budget, max_loss):
    d = CostBasedDecider(swap_budget_s=budget, max_quality_loss=max_loss)
    c = d.decide(v)
    time_s = {"recompute": v.recompute_s, "swap": v.swap_s,
              "compress-swap": v.compress_swap_s}[c]
    host = {"recompute": 0, "swap": v.swap_host_blocks,
            "compress-swap": v.compress_host_blocks}[c]
    assert time_s <= v.recompute_s
    assert host <= v.host_free_blocks
    if c == "swap":
        assert v.swap_s <= budget
    if c == "compress-swap":
        assert v.quality_loss <= max_loss
    # the rule prefers a lossless swap whenever it is allowed and beats recompute
    swap_ok = v.swap_host_blocks <= v.host_free_blocks and v.swap_s <= budget
    if swap_ok and v.swap_s < v.recompute_s:
        assert c == "swap"
    comp_ok = v.compress_host_blocks <= v.host_free_blocks and v.quality_loss <= max_loss
    if c == "recompute":  # nothing allowed was faster
        assert not (swap_ok and v.swap_s < v.recompute_s)
        assert not (comp_ok and v.compress_swap_s < v.recompute_s)
