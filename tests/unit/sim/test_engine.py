"""Engine semantics: rejections, policy faults, horizon, prefix hits, swap, disaggregation."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policy import Policy, PolicyError, as_router, as_scheduler

A100 = dict(gpu="a100-80gb", llm="llama-2-7b")


def _inst(prompt, output, arrival=None, cost=None, horizon_s=None, **cluster):
    n = len(prompt)
    arrival = np.arange(n) * 0.01 if arrival is None else arrival
    tr = lp.Trace.from_arrays(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output)
    return lp.Instance(trace=tr, cluster=lp.Cluster(**{**A100, **cluster}), cost=cost,
                       horizon_s=horizon_s)


def test_prompt_that_cannot_fit_is_rejected_with_reason():
    inst = _inst([50, 5000, 20], [5, 5, 5], cost=lp.UnitRoundCost(memory_tokens=1000),
                 block_tokens=1)
    res = lp.simulate(inst, lp.make_policy("vllm-chunked"))
    a = res.arrays
    assert list(a["status"]) == ["finished", "rejected", "finished"]
    assert a["reason"][1] == "prompt_exceeds_kv"
    assert res.summary()["n_rejected"] == 1


def test_context_that_outgrows_kv_alone_is_dropped_not_hung():
    inst = _inst([90], [50], cost=lp.UnitRoundCost(memory_tokens=100), block_tokens=1)
    res = lp.simulate(inst, lp.make_policy("vllm", watermark=0.0), check=True)
    assert res.arrays["reason"][0] == "context_exceeds_kv"


def test_unit_round_timing_convention():
    # one request: prefill + first token in round 1, then one round per token
    inst = _inst([10], [5], cost=lp.UnitRoundCost(memory_tokens=100), block_tokens=1)
    a = lp.simulate(inst, "vllm").arrays
    assert a["first_token_s"][0] == 1.0 and a["finish_s"][0] == 5.0
    assert a["queue_s"][0] == 0.0 and a["tpot_s"][0] == 1.0


def _bad_shape(view):
    return np.zeros(len(view) + 1)


def _nan_rank(view):
    return np.full(len(view), np.nan)


def _bad_replica(view):
    return np.full(len(view), view.n_replicas)


@pytest.mark.parametrize("policy, needle", [
    (Policy(scheduler=as_scheduler(_bad_shape), name="p1"), "p1"),
    (Policy(scheduler=as_scheduler(_nan_rank), name="p2"), "NaN"),
    (Policy(router=as_router(_bad_replica), name="p3"), "outside"),
])
def test_bad_policy_output_raises_naming_the_policy(policy, needle):
    inst = _inst([10, 10, 10], [3, 3, 3], replicas=2)
    with pytest.raises(PolicyError, match=needle) as exc:
        lp.simulate(inst, policy)
    assert policy.name in str(exc.value)


def test_overload_stops_at_horizon_and_reports_unfinished():
    inst = _inst([500] * 400, [400] * 400, arrival=np.zeros(400), horizon_s=2.0)
    res = lp.simulate(inst, "vllm")
    s = res.summary()
    assert s["n_unfinished"] > 0 and s["n_finished"] + s["n_unfinished"] == 400
    assert set(res.arrays["reason"][res.arrays["status"] != "finished"]) == {"horizon"}


def test_held_back_request_is_reported_not_looped():
    def hold_odd(view):
        return np.where(view.request % 2 == 1, np.inf, view.arrival_s)

    inst = _inst([10] * 4, [3] * 4)
    res = lp.simulate(inst, Policy(scheduler=as_scheduler(hold_odd)))
    assert list(res.arrays["reason"]) == ["", "held_back", "", "held_back"]


def test_prefix_cache_hits_on_shared_prefixes():
    n = 6
    tr = lp.Trace.from_arrays(arrival_s=np.arange(n) * 1.0, prompt_tokens=[1024] * n,
                              output_tokens=[4] * n, block_ids=[[7, 8]] * n, block_tokens=512)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**A100))
    res = lp.simulate(inst, "vllm", check=True)
    cached = res.arrays["cached_prompt_tokens"]
    assert cached[0] == 0 and np.all(cached[1:] == 1023)  # the last token is recomputed
    assert res.summary()["prefix_hit_rate"] > 0.8
    off = lp.simulate(inst, lp.make_policy("vllm", prefix_caching=False))
    assert off.summary()["prefix_hit_rate"] == 0.0
    assert off.arrays["ttft_s"][1:].mean() > res.arrays["ttft_s"][1:].mean()


def test_swap_preemption_is_priced_and_recovers():
    inst = _inst([200] * 6, [300] * 6, arrival=np.zeros(6), gpu_memory_fraction=0.171)
    rec = lp.simulate(inst, lp.make_policy("vllm-v0", preemption="recompute"), check=True)
    swp = lp.simulate(inst, lp.make_policy("vllm-v0", preemption="swap"), check=True)
    assert rec.summary()["preemptions"] > 0
    assert swp.stats["swaps"] > 0
    assert np.all(swp.arrays["status"] == "finished")
    nohost = _inst([200] * 6, [300] * 6, arrival=np.zeros(6), gpu_memory_fraction=0.171,
                   host_memory_gb=0.0)
    assert lp.simulate(nohost, lp.make_policy("vllm-v0", preemption="swap")).stats["swaps"] == 0


def test_disaggregated_ttft_and_transfer():
    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[2000], output_tokens=[10])
    cl = lp.Cluster(**A100, prefill_replicas=1, decode_replicas=1, link_gbps=1.0)
    res = lp.simulate(lp.Instance(trace=tr, cluster=cl), "vllm", check=True)
    a = res.arrays
    cost = lp.cost_model(**A100)
    t_pre = cost.batch_time_s([2000], [0], [])
    assert a["first_token_s"][0] == pytest.approx(t_pre)
    assert a["decode_replica"][0] == 0
    # the decode phase starts after the KV transfer over the 1 GB/s link
    t_xfer = cost.transfer_time_s(2000, 1.0)
    assert a["finish_s"][0] > t_pre + t_xfer


def test_static_batching_waits_for_the_whole_batch():
    inst = _inst([10, 10, 10], [2, 50, 2], arrival=np.array([0.0, 0.0, 0.001]),
                 cost=lp.UnitRoundCost(memory_tokens=10000), block_tokens=1)
    a = lp.simulate(inst, lp.make_policy("static", max_num_seqs=2)).arrays
    assert a["first_scheduled_s"][2] == a["finish_s"][1]  # joins after the batch ends


def test_seeded_determinism_and_digest():
    tr = lp.bundled_trace().head(200)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**A100, replicas=3))
    p = "vllm+power-of-two"
    assert lp.simulate(inst, p, seed=1).digest() == lp.simulate(inst, p, seed=1).digest()
    assert lp.simulate(inst, p, seed=1).digest() != lp.simulate(inst, p, seed=2).digest()
    df = lp.simulate(inst, "vllm").requests
    assert len(df) == 200 and {"ttft_s", "tpot_s", "queue_s", "replica"} <= set(df.columns)


def test_the_reference_mode_logs_every_iteration_and_nothing_else_does():
    """``iteration_log=`` (reference mode only): one entry per iteration, in time order and
    without overlap per replica; each request's chunks compute its uncached prompt once
    (no preemption here) and it decodes once per output token after the first."""
    rng = np.random.default_rng(4)
    n = 30
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 2, n)),
                              prompt_tokens=rng.integers(20, 900, n),
                              output_tokens=rng.integers(1, 60, n))
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=2))
    log: list = []
    res = lp.simulate(inst, "sarathi", seed=0, reference=True, iteration_log=log)
    assert res.digest() == lp.simulate(inst, "sarathi", seed=0).digest()
    assert len(log) == res.stats["iterations"]
    chunked = np.zeros(n, np.int64)
    decodes = np.zeros(n, np.int64)
    for key in {e[0] for e in log}:
        times = np.array([(t0, t1) for k, t0, t1, _, _ in log if k == key])
        assert np.all(times[:, 1] > times[:, 0]) and np.all(times[1:, 0] >= times[:-1, 1])
    for _, _, _, chunks, decs in log:
        for i, c, _, _ in chunks:
            chunked[i] += c
        for i, _, g in decs:
            assert g >= 1
            decodes[i] += 1
    a = res.arrays
    assert (a["preemptions"] == 0).all()
    assert np.array_equal(chunked, a["prompt_tokens"] - a["cached_prompt_tokens"])
    assert np.array_equal(decodes, a["output_tokens"] - 1)
    with pytest.raises(ValueError, match="iteration log is kept in the reference mode"):
        lp.simulate(inst, "sarathi", iteration_log=[])
    with pytest.raises(ValueError, match="without speculative decoding"):
        lp.simulate(inst, "spec-fixed", reference=True, iteration_log=[])
