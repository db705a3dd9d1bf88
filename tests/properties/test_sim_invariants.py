"""Simulator invariants on hypothesis instances: fast == reference, blocks, time, fates."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.policy import Meta, Rebalancer
from tests.strategies import fast_and_reference, sim_instances


@settings(max_examples=200, deadline=None)
@given(sim_instances())
def test_fast_equals_reference_and_invariants_hold(case):
    inst, policy = case
    fast, _ = fast_and_reference(inst, policy, seed=3)
    a = fast.arrays
    st = a["status"]
    # every request finishes or is reported with a reason
    assert np.all((st == "finished") | (a["reason"] != ""))
    if inst.horizon_s is None:
        assert np.all((st == "finished") | (st == "rejected")), set(a["reason"])
    # nobody runs before arrival; time never goes backwards within a request
    ran = np.isfinite(a["first_scheduled_s"])
    assert np.all(a["first_scheduled_s"][ran] >= a["arrival_s"][ran])
    tok = np.isfinite(a["first_token_s"])
    assert np.all(a["first_token_s"][tok] > a["first_scheduled_s"][tok] - 1e-12)
    fin = st == "finished"
    assert np.all(a["finish_s"][fin] >= a["first_token_s"][fin])
    assert np.all(a["generated_tokens"][fin] == a["output_tokens"][fin])
    assert np.all(a["generated_tokens"] <= a["output_tokens"])
    s = fast.summary()
    assert s["n_finished"] + s["n_rejected"] + s["n_unfinished"] == s["n_requests"]
    util = fast.stats["kv_utilization"]
    assert math.isnan(util) or 0.0 <= util <= 1.0 + 1e-9


class _RandomMover(Rebalancer):
    """Moves each decoding request with probability 1/3 to a random replica with room
    (stresses live migration: copies in flight, reservations, moves of moved requests)."""

    name = "random-mover"
    meta = Meta(stochastic=True)

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.rng = None

    def reset(self, cluster, rng) -> None:
        self.rng = rng

    def migrate(self, view):
        free, seats, out = view.free_blocks.copy(), view.seats.copy(), []
        for k in range(len(view)):
            d = int(self.rng.integers(0, view.n_replicas))
            if (self.rng.random() < 1 / 3 and d != view.replica[k]
                    and view.blocks[k] <= free[d] and seats[d] >= 1):
                out.append((int(view.request[k]), d))
                free[d] -= view.blocks[k]
                seats[d] -= 1
        return np.array(out, np.int64).reshape(-1, 2)


@settings(max_examples=50, deadline=None)
@given(sim_instances(), st.sampled_from([0.05, 0.3, 2.0]),
       st.sampled_from(["random", "llumnix", "lp"]))
def test_fast_equals_reference_with_live_migration(case, period_s, kind):
    from lpserve.opt.rebalance import AssignmentRebalancer
    from lpserve.policies.rebalancers import LlumnixFreeness

    inst, policy = case
    rb = {"random": lambda: _RandomMover(period_s),
          "llumnix": lambda: LlumnixFreeness(period_s, threshold_blocks=0.0,
                                             source_below_blocks=1e9),
          "lp": lambda: AssignmentRebalancer(period_s)}[kind]()
    policy = policy.with_(rebalancer=rb)
    fast, ref = fast_and_reference(inst, policy, seed=3)
    assert np.array_equal(fast.arrays["migrations"], ref.arrays["migrations"])
    a = fast.arrays
    st_ = a["status"]
    assert np.all((st_ == "finished") | (a["reason"] != ""))
    if inst.horizon_s is None:
        assert np.all((st_ == "finished") | (st_ == "rejected")), set(a["reason"])
    fin = st_ == "finished"
    assert np.all(a["generated_tokens"][fin] == a["output_tokens"][fin])
    assert np.all(a["finish_s"][fin] >= a["first_token_s"][fin])
    assert fast.stats["migrations"] == int(a["migrations"].sum())


def test_two_partial_prefills_fill_the_memory():
    """Named example (``models/simulator.md`` (34)): two prompts of 143 and 127 tokens in
    chunked prefill together fill a 200-token KV memory, so neither can take its next chunk
    and nothing decodes; the worst-ranked one is preempted (swapped out) and both finish,
    on both engines. Before rule (34) both were left running for ever ('stalled')."""
    import lpserve as lp
    from lpserve.cost.table import UnitRoundCost

    prompts = [1] * 20
    outputs = [1] * 20
    prompts[8], prompts[10], prompts[11] = 71, 143, 127
    outputs[8], outputs[12] = 7, 24
    trace = lp.Trace.from_arrays(arrival_s=np.arange(20, dtype=float),
                                 prompt_tokens=prompts, output_tokens=outputs)
    inst = lp.Instance(trace=trace, cost=UnitRoundCost(200), cluster=lp.Cluster(
        gpu="a100-80gb", llm="llama-2-7b", block_tokens=1, host_memory_gb=1e-6))
    policy = lp.make_policy("vllm", max_num_seqs=2, max_num_batched_tokens=64,
                            preemption="swap", prefix_caching=False)
    fast, _ = fast_and_reference(inst, policy, seed=0)
    a = fast.arrays
    assert (a["status"] == "finished").all(), sorted(set(a["reason"]))
    assert fast.summary(flat=True)["preemptions"] == 2 and fast.stats["swaps"] == 2
    assert a["finish_s"][10] == 19.0 and a["finish_s"][11] == 21.0


@st.composite
def _shared_prefix_instances(draw):
    """Requests that share one of three prompt prefixes, on 1-2 replicas whose KV pool
    holds a few prompts: prefixes are evicted from the GPU and come back."""
    import lpserve as lp
    from lpserve.cost import UnitRoundCost

    n = draw(st.integers(2, 16))
    bt = 16
    groups = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    shared = draw(st.lists(st.integers(1, 8), min_size=3, max_size=3))  # blocks per prefix
    tails = draw(st.lists(st.integers(1, 80), min_size=n, max_size=n))
    prompt = [shared[g] * bt + t for g, t in zip(groups, tails)]
    ids, nxt = [], 1000
    for g, p in zip(groups, prompt):
        own = -(-p // bt) - shared[g]
        ids.append([100 * g + j for j in range(shared[g])] + list(range(nxt, nxt + own)))
        nxt += own
    gaps = draw(st.lists(st.sampled_from([0.0, 0.01, 0.5, 5.0]), min_size=n, max_size=n))
    tr = lp.Trace.from_arrays(
        arrival_s=np.cumsum(gaps), prompt_tokens=prompt,
        output_tokens=draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)),
        block_ids=ids, block_tokens=bt, name="shared-prefix-hyp")
    if draw(st.booleans()):
        cost, fraction = UnitRoundCost(memory_tokens=draw(st.integers(250, 900))), 0.9
    else:
        cost, fraction = None, draw(st.sampled_from([0.171, 0.175]))
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=bt,
                    gpu_memory_fraction=fraction, replicas=draw(st.integers(1, 2)))
    return lp.Instance(trace=tr, cluster=cl, cost=cost)


@settings(max_examples=80, deadline=None)
@given(_shared_prefix_instances(), st.sampled_from([0.01, 0.1, 4.0]),
       st.sampled_from(["vllm", "vllm-chunked", "sarathi"]),
       st.sampled_from([64, 256, 4096]), st.sampled_from(["least-outstanding",
                                                          "prefix-affinity"]))
def test_cpu_kv_offload_fast_equals_reference(inst, gib, engine, budget, router):
    """With a host tier (models/simulator.md (35)) of 1 to 512 blocks, decode runs stop at
    every load's end: the fast and the reference run agree and the invariants hold; every
    block loaded from the tier is counted once, as a prompt token not computed."""
    from lpserve.registry import make_policy

    policy = make_policy(engine, router=router, kv_offload_gib=gib,
                         max_num_batched_tokens=budget, max_num_seqs=4)
    fast, _ = fast_and_reference(inst, policy, seed=5)
    off = fast.stats["offload"]
    assert off["hit_tokens"] <= int(fast.arrays["cached_prompt_tokens"].sum())
    assert off["loaded_blocks"] * inst.cluster.block_tokens >= off["hit_tokens"]
    assert off["stored_blocks"] - off["dropped_blocks"] <= off["tier_blocks"]
