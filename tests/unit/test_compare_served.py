"""lp.compare over the requests every policy served, rejections as columns and warnings,
per-run checkpoints (an interrupted comparison resumes with the same table), incremental
results, robustness with the same options, and the fluid capacity estimate."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import lpserve as lp
from lpserve.evaluate import compare, robustness
from lpserve.evaluate.checkpoint import RunStore
from lpserve.evaluate.specs import REJECTION_WARN_SHARE, RejectionWarning
from lpserve.evaluate.utilization import fluid_capacity

#: a 2,048-token budget makes the non-chunked engine (vLLM V0) reject the longer prompts
SMALL_BUDGET = {"vllm-v0": {"max_num_batched_tokens": 2048}}
VOLATILE = ("wall_s", "from_checkpoint")


@pytest.fixture(scope="module")
def inst():
    trace = lp.bundled_trace().window(0.0, 30.0)
    return lp.Instance(trace=trace, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                       replicas=2),
                       slo=lp.SLO(ttft_s=1.0, tpot_s=0.1))


def _compare(inst, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RejectionWarning)
        return compare(inst, ["vllm-v0", "sarathi"], **kw)


def test_common_requests_by_default_and_served_on_request(inst):
    common = _compare(inst, engine=SMALL_BUDGET)
    served = _compare(inst, engine=SMALL_BUDGET, over="served")
    n = len(inst.trace)
    rejected = int((inst.trace.prompt_tokens > 2048).sum())
    c, s = common.set_index("policy"), served.set_index("policy")
    assert common.attrs["over"] == "common"
    assert c.loc["vllm-v0", "n_rejected"] == rejected > 0
    assert (c["n_compared"] == n - rejected).all()           # the same requests for both
    assert s.loc["sarathi", "n_compared"] == n and s.loc["vllm-v0", "n_compared"] == n - rejected
    assert c.loc["vllm-v0", "rejected_share"] == pytest.approx(rejected / n)
    assert '"prompt_exceeds_token_budget"' in c.loc["vllm-v0", "rejection_reasons"]
    # sarathi's latencies differ with the set they cover; vllm-v0 served the same set both ways
    assert c.loc["sarathi", "e2e_s_mean"] != s.loc["sarathi", "e2e_s_mean"]
    assert c.loc["vllm-v0", "e2e_s_mean"] == pytest.approx(s.loc["vllm-v0", "e2e_s_mean"])
    # one bound for everyone over the common requests, and the ratio is over it
    assert c["bound_value"].nunique() == 1
    assert np.allclose(c["ratio_to_bound"], c["e2e_s_mean"] / c["bound_value"])
    assert (c["ratio_to_bound"] >= 1.0).all()
    fin = {p: len(v["e2e_s"]) for p, v in common.attrs["samples"].policies.items()}
    assert set(fin.values()) == {n - rejected}


def test_rejection_warning_above_one_percent(inst):
    with pytest.warns(RejectionWarning) as rec:
        t = compare(inst, ["vllm-v0", "sarathi"], engine=SMALL_BUDGET)
    assert len(t.attrs["warnings"]) == 1 == len(rec)
    w = t.attrs["warnings"][0]
    assert w.startswith("vllm-v0 rejected") and "max_num_batched_tokens" in w
    assert f"{int(inst.trace.prompt_tokens.max()):,}" in w   # the budget that would serve all
    with warnings.catch_warnings():
        warnings.simplefilter("error", RejectionWarning)      # none when nothing is rejected
        assert compare(inst, ["sarathi"]).attrs["warnings"] == []
    assert REJECTION_WARN_SHARE == 0.01


class _Stop(Exception):
    pass


def test_checkpoint_resumes_with_the_same_table(inst, tmp_path):
    fresh = _compare(inst, seeds=(0, 1))
    calls = []

    def stop_after_three(label, seed):
        calls.append((label, seed))
        if len(calls) == 3:
            raise _Stop

    with pytest.raises(_Stop):
        _compare(inst, seeds=(0, 1), checkpoint=tmp_path, on_run=stop_after_three)
    assert len(RunStore(tmp_path)) == 3
    rows = []
    resumed = _compare(inst, seeds=(0, 1), checkpoint=tmp_path, on_result=rows.append)
    assert [r["from_checkpoint"] for r in rows] == [True, True, True, False]
    cols = [c for c in fresh.columns if c not in VOLATILE]
    assert resumed[cols].equals(fresh[cols])
    again = _compare(inst, seeds=(0, 1), checkpoint=tmp_path)
    assert again.drop(columns="from_checkpoint").equals(
        resumed.drop(columns="from_checkpoint"))
    # another engine is another run: nothing is loaded for it
    rows = []
    _compare(inst, checkpoint=tmp_path, engine={"max_num_seqs": 64}, on_result=rows.append)
    assert not any(r["from_checkpoint"] for r in rows)


def test_incremental_results_and_request_counts(inst):
    rows, routed = [], []
    _compare(inst, on_result=rows.append, on_requests=routed.append)
    assert [r["policy"] for r in rows] == ["vllm-v0", "sarathi"]
    assert {"e2e_s_mean", "n_finished", "n_rejected", "wall_s"} <= set(rows[0])
    assert sum(routed) == 2 * len(inst.trace)


def test_robustness_takes_the_same_options(inst, tmp_path):
    cases = []
    insts = {"x1": inst, "x1.5": inst.with_(trace=inst.trace.scale_rate(1.5))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RejectionWarning)
        summary, runs = robustness(insts, ["vllm-v0", "sarathi"], engine=SMALL_BUDGET,
                                   checkpoint=tmp_path, return_runs=True,
                                   on_case=lambda label, df: cases.append(label))
    assert cases == ["x1", "x1.5"]
    assert len(summary.attrs["warnings"]) == 2
    assert summary.attrs["warnings"][0].startswith("x1: vllm-v0 rejected")
    assert (runs.groupby("instance")["n_compared"].nunique() == 1).all()
    assert len(RunStore(tmp_path)) == 4


def test_fluid_capacity_by_hand(inst):
    cap = fluid_capacity(inst)
    cost = inst.cost_model()
    tr = inst.trace
    ctx = int(round(tr.prompt_tokens.mean() + tr.output_tokens.mean() / 2))
    assert cap.context_tokens == ctx
    B = min(256, cost.kv_capacity_tokens(0.9) // ctx)
    assert cap.decode_batch == B
    tau = cost.batch_time_s(decode_context=[ctx] * B)
    pre = np.array([cost.batch_time_s(prefill_tokens=[int(p)], prefill_cached=[0])
                    for p in tr.prompt_tokens])
    work = pre + tr.output_tokens * tau / B
    assert cap.capacity_rps == pytest.approx(2 / work.mean(), rel=1e-9)
    assert cap.utilization(cap.load_for(0.7)) == pytest.approx(0.7)
    assert cap.utilization(1.0) == pytest.approx(tr.rate_per_s / cap.capacity_rps)
    # twice the replicas, twice the capacity; fewer sequences per batch, less
    two = fluid_capacity(inst.with_(cluster=inst.cluster.with_(replicas=4)))
    assert two.capacity_rps == pytest.approx(2 * cap.capacity_rps)
    assert fluid_capacity(inst, max_num_seqs=4).capacity_rps < cap.capacity_rps
    dis = fluid_capacity(inst.with_(cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                       prefill_replicas=1, decode_replicas=1)))
    assert dis.capacity_rps == pytest.approx(min(1 / pre.mean(),
                                                 1 / (tr.output_tokens * tau / B).mean()))
    with pytest.raises(ValueError, match="max_num_seqs"):
        fluid_capacity(inst, max_num_seqs=0)


def test_result_repr_is_one_line_pointing_to_requests(inst):
    res = lp.simulate(inst, "vllm")
    text = repr(res)
    assert "\n" not in text and len(text) < 300
    assert f"{len(inst.trace):,} requests" in text and "res.requests" in text
    assert "policy='vllm'" in text
