"""``vllm`` is vLLM V1 with its hardware-dependent batch defaults, ``vllm-v0`` the V0
scheduler; policy parameters that mirror the instance (GPU, SLO) come from it at run
start (``Policy.bind``) unless the user set them; summaries say when a policy rejects
more than 1 % of a trace."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies.lyapunov import DPPController, lyapunov
from lpserve.policy import FCFS, HardwareDefaults, Policy, vllm_v1_batch_defaults

H100 = lp.Cluster(gpu="h100-sxm", llm="llama-3.1-8b")
A100 = lp.Cluster(gpu="a100-80gb", llm="llama-3.1-8b")


def test_vllm_is_v1_with_chunked_prefill_and_v0_keeps_prefill_first():
    v1 = lp.make_policy("vllm").engine
    assert (v1.batching, v1.chunked_prefill, v1.max_num_batched_tokens, v1.max_num_seqs,
            v1.watermark, v1.preemption, v1.prefix_caching) == \
        ("decode-first", True, 2048, 256, 0.0, "recompute", True)
    v0 = lp.make_policy("vllm-v0").engine
    assert (v0.batching, v0.chunked_prefill, v0.max_num_batched_tokens, v0.watermark) == \
        ("prefill-first", False, 4096, 0.01)


@pytest.mark.parametrize("gpu, tokens, seqs", [
    ("a100-80gb", 2048, 256), ("a100-40gb", 2048, 256), ("l4", 2048, 256),
    ("h100-sxm", 8192, 1024), ("h200", 8192, 1024), ("mi300x", 8192, 1024),
    ("b200", 8192, 1024)])
def test_v1_batch_defaults_follow_vllm_engine_args(gpu, tokens, seqs):
    assert vllm_v1_batch_defaults(gpu) == {"max_num_batched_tokens": tokens,
                                           "max_num_seqs": seqs}
    eng = lp.make_policy("vllm").bind(lp.Cluster(gpu=gpu, llm="llama-3.1-8b"),
                                      lp.SLO()).engine
    assert (eng.max_num_batched_tokens, eng.max_num_seqs) == (tokens, seqs)


def test_user_settings_win_over_hardware_defaults():
    pol = lp.make_policy("vllm", max_num_batched_tokens=4096)
    eng = pol.bind(H100, lp.SLO()).engine
    assert (eng.max_num_batched_tokens, eng.max_num_seqs) == (4096, 1024)
    later = lp.make_policy("vllm").with_(engine={"max_num_seqs": 64})
    eng = later.bind(H100, lp.SLO()).engine
    assert (eng.max_num_batched_tokens, eng.max_num_seqs) == (8192, 64)
    fixed = lp.make_policy("vllm", max_num_batched_tokens=2048, max_num_seqs=256)
    assert fixed.hardware_defaults is None and fixed.bind(H100, lp.SLO()) is fixed
    with pytest.raises(ValueError, match="profile"):
        HardwareDefaults("vllm-v9", frozenset({"max_num_seqs"}))


def test_simulation_runs_the_bound_engine():
    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[6000], output_tokens=[2])
    res = lp.simulate(lp.Instance(trace=tr, cluster=H100), "vllm")
    cost = lp.cost_model(gpu="h100-sxm", llm="llama-3.1-8b")
    # one 8192-token budget: the whole prompt in the first iteration, then one decode
    assert res.stats["iterations"] == 2
    # (the client sees it the profile's front-end latency later: models/simulator.md (33))
    assert res.arrays["first_token_s"][0] == pytest.approx(
        cost.batch_time_s([6000], [0], []) + cost.frontend_latency_s)
    # 2048 tokens on the A100: three chunks, then one decode
    assert lp.simulate(lp.Instance(trace=tr, cluster=A100), "vllm").stats["iterations"] == 4


def _long_prompts(n_long: int, n: int = 100) -> lp.Instance:
    prompt = np.full(n, 100)
    prompt[:n_long] = 5000
    tr = lp.Trace.from_arrays(arrival_s=np.arange(n) * 0.5, prompt_tokens=prompt,
                              output_tokens=np.full(n, 4))
    return lp.Instance(trace=tr, cluster=A100)


def test_summary_warns_loudly_above_one_percent_rejected():
    s = lp.simulate(_long_prompts(1), "vllm-v0").summary()
    assert s["n_rejected"] == 1 and s["rejected_share"] == 0.01 and s["warnings"] == []
    s = lp.simulate(_long_prompts(2), "vllm-v0").summary()
    assert s["n_rejected"] == 2 and len(s["warnings"]) == 1
    w = s["warnings"][0]
    assert "REJECTED 2 of 100" in w and "prompt_exceeds_token_budget 2" in w and "vllm-v0" in w
    s = lp.simulate(_long_prompts(2), "vllm").summary()  # chunked prefill: nothing rejected
    assert s["n_rejected"] == 0 and s["warnings"] == []


class _Recorder(FCFS):
    def __init__(self) -> None:
        self.seen = []

    def bind(self, cluster, slo, tiers=()):
        self.seen.append((cluster.gpu, slo))


def test_every_part_is_bound_before_the_run():
    sched = _Recorder()
    slo = lp.SLO(ttft_s=1.0, tpot_s=0.04)
    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[10], output_tokens=[3])
    lp.simulate(lp.Instance(trace=tr, cluster=A100, slo=slo), Policy(scheduler=sched))
    assert sched.seen == [("a100-80gb", slo)]


def _bursty() -> lp.Trace:
    rng = np.random.default_rng(0)
    n = 60
    return lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 6.0, n)),
                                prompt_tokens=rng.integers(200, 3000, n),
                                output_tokens=rng.integers(20, 200, n))


def test_lyapunov_takes_its_tbt_target_from_the_slo():
    inst = lp.Instance(trace=_bursty(), cluster=A100, slo=lp.SLO(ttft_s=2.0, tpot_s=0.05))
    mirrored = lyapunov()
    a = lp.simulate(inst, mirrored)
    assert mirrored.engine.budget_controller.tbt_slo_s == 0.05
    b = lp.simulate(inst, lyapunov(tbt_slo_s=0.05))
    assert a.arrays["finish_s"].tolist() == b.arrays["finish_s"].tolist()
    c = lp.simulate(inst, lyapunov(tbt_slo_s=0.1))  # the user's target is kept
    assert c.arrays["finish_s"].tolist() != a.arrays["finish_s"].tolist()
    assert DPPController(tbt_slo_s=0.1).tbt_slo_s == 0.1


def test_lyapunov_and_slo_aware_refuse_an_instance_without_slo():
    inst = lp.Instance(trace=_bursty(), cluster=A100)
    with pytest.raises(ValueError, match="no TBT target"):
        lp.simulate(inst, "lyapunov")
    # slo-aware reads predicted output lengths: with a predictor, the refusal is the SLO's
    with pytest.raises(ValueError, match="no SLO target"):
        lp.simulate(inst, "slo-aware", predictor="history")
    lp.simulate(inst, lp.make_policy("slo-aware", ttft_s=2.0, tpot_s=0.2), predictor="history")


def test_slo_aware_mirrors_the_slo():
    inst = lp.Instance(trace=_bursty(), cluster=A100, slo=lp.SLO(ttft_s=2.0, tpot_s=0.2))
    pol = lp.make_policy("slo-aware")
    a = lp.simulate(inst, pol, predictor="history")  # slo-aware reads predicted lengths
    assert (pol.scheduler.ttft_s, pol.scheduler.tpot_s) == (2.0, 0.2)
    b = lp.simulate(inst, lp.make_policy("slo-aware", ttft_s=2.0, tpot_s=0.2),
                    predictor="history")
    assert a.digest() == b.digest()


def test_deadline_slo_counts_in_goodput_and_tiers():
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 0.0], prompt_tokens=[100, 100],
                              output_tokens=[5, 400], tenant=[0, 1])
    inst = lp.Instance(trace=tr, cluster=A100)
    res = lp.simulate(inst, "vllm")
    e2e = res.arrays["e2e_s"]
    deadline = float((e2e[0] + e2e[1]) / 2)  # the short request meets it, the long one not
    res = lp.simulate(inst.with_(slo=lp.SLO(e2e_s=deadline)), "vllm")
    span = res.summary()["makespan_s"]
    assert res.summary()["goodput_rps"] == pytest.approx(1 / span)
    tiers = (lp.Tier("deadline", lp.SLO(e2e_s=deadline), (1,)),)
    res = lp.simulate(inst.with_(tiers=tiers), "vllm")
    assert res.summary()["tiers"]["deadline"]["slo_attainment"] == 0.0
    assert res.summary()["tiers"]["default"]["slo_attainment"] == 1.0
    assert inst.with_(tiers=tiers).request_e2e_s().tolist() == [np.inf, deadline]
    assert inst.digest() == inst.with_(slo=lp.SLO()).digest()
    assert inst.digest() != inst.with_(slo=lp.SLO(e2e_s=5.0)).digest()


def test_slo_aware_takes_per_tenant_targets_from_the_tiers():
    sched = lp.make_policy("slo-aware").scheduler
    tiers = (lp.Tier("stream", lp.SLO(ttft_s=1.0, tpot_s=0.1), (0,)),
             lp.Tier("deadline", lp.SLO(e2e_s=30.0), (1,)))
    sched.bind(A100, lp.SLO(), tiers)
    sched.reset(A100, np.random.default_rng(0))
    assert sched.tenant_targets == {0: (1.0, 0.1, np.inf), 1: (np.inf, np.inf, 30.0)}
    user = lp.make_policy("slo-aware", tpot_s=0.2).scheduler
    user.bind(A100, lp.SLO(), tiers)
    assert user.tenant_targets[0] == (1.0, 0.2, np.inf)  # the user's value wins everywhere
