"""Same engine, different decision: ``lp.compare`` runs every registered policy on the
first baseline's engine (as it runs on the cluster), each keeping its own decisions; rows
name their exact engine; ``lpserve list policies`` says why a registered engine differs."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.evaluate import default_policies
from lpserve.evaluate.lineup import resolve_policies
from lpserve.policy import DECISION_FIELDS
from lpserve.registry import engine_note, make_policy, owned_engine_fields, policy_names

H100 = lp.Cluster(gpu="h100-sxm", llm="llama-3.1-8b", replicas=2)


@pytest.fixture(scope="module")
def inst():
    return lp.Instance(trace=lp.bundled_trace("azure-conv-10min").head(60), cluster=H100)


def _engines(inst, policies, **kw):
    return {lab: pol.engine_on(inst.cluster)
            for lab, pol, _ in resolve_policies(inst, policies, **kw)}


def test_schedulers_run_on_the_first_baselines_engine_with_their_own_decisions(inst):
    eng = _engines(inst, ["srpt-oracle", "vllm", "mcsf", "sarathi", "fastserve"])
    vllm = eng["vllm"]
    assert (vllm.max_num_batched_tokens, vllm.max_num_seqs) == (8192, 1024)  # set by the H100
    for lab in ("srpt-oracle", "mcsf", "fastserve"):
        mine = eng[lab].machine_fields()
        theirs = vllm.machine_fields()
        own = set(owned_engine_fields(lab)) - set(DECISION_FIELDS)
        assert {k: v for k, v in mine.items() if k not in own} == \
            {k: v for k, v in theirs.items() if k not in own}, lab
    reg = {n: make_policy(n).engine for n in ("srpt-oracle", "fastserve", "sarathi")}
    assert eng["srpt-oracle"].priority_preemption  # a decision, kept
    assert eng["srpt-oracle"].preemption == "recompute"  # the machine's: vLLM V1 recomputes
    assert eng["fastserve"].proactive_swap and eng["fastserve"].transfers == "overlap"
    assert eng["sarathi"] == reg["sarathi"]  # an engine baseline keeps its engine
    assert make_policy("srpt-oracle").engine == reg["srpt-oracle"]  # registry untouched


def test_shared_engine_can_be_another_policy_or_none(inst):
    own = _engines(inst, ["vllm", "srpt-oracle"], shared_engine=False)
    assert own["srpt-oracle"] == make_policy("srpt-oracle").engine
    on_sarathi = _engines(inst, ["vllm", "srpt-oracle", "sarathi"], shared_engine="sarathi")
    assert on_sarathi["srpt-oracle"].max_num_batched_tokens == 512
    assert on_sarathi["vllm"].max_num_batched_tokens == 8192  # vllm is an engine: kept
    with pytest.raises(ValueError, match="shared_engine='orca' is not a policy"):
        resolve_policies(inst, ["vllm", "las"], shared_engine="orca")
    with pytest.raises(ValueError, match="shared_engine must be True, False or a policy"):
        resolve_policies(inst, ["vllm", "las"], shared_engine=3)


def test_a_policy_object_keeps_the_engine_it_was_given(inst):
    mine = make_policy("srpt-oracle").with_(engine={"max_num_batched_tokens": 1000})
    eng = _engines(inst, {"vllm": "vllm", "mine": mine})
    assert eng["mine"] == mine.engine


def test_rows_name_their_exact_engine_and_preemptions(inst):
    df = lp.compare(inst, ["vllm", "srpt-oracle", "sarathi"], [])
    row = df.set_index("policy")
    assert list(row["engine_from"]) == ["own", "vllm's", "own"]
    assert row.loc["vllm", "engine"].startswith(
        "decode-first, chunked prefill, 8192 tokens/iteration, 1024 seqs, recompute preemption")
    assert row.loc["srpt-oracle", "engine"] == row.loc["vllm", "engine"] + ", preempts by rank"
    assert "512 tokens/iteration" in row.loc["sarathi", "engine"]
    assert row.loc["vllm", "engine"] in row.loc["vllm", "description"]
    assert "preemptions" in df.columns


def test_every_registered_engine_other_than_vllms_says_why():
    vllm = make_policy("vllm").engine.machine_fields()
    for name in policy_names():
        differs = make_policy(name).engine.machine_fields() != vllm
        assert differs == (engine_note(name) is not None), name
    assert owned_engine_fields("sarathi") is None  # an engine keeps its whole engine
    assert set(owned_engine_fields("las")) == set(DECISION_FIELDS)


def test_cli_list_policies_prints_the_reason(capsys):
    from lpserve.cli import main

    assert main(["list", "policies"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("srpt-oracle "))
    assert "Engine not vllm's: preempts by rank" in line
    assert "Engine not vllm's" not in next(x for x in out.splitlines()
                                          if x.startswith("vllm+least-outstanding "))


@pytest.mark.parametrize("trace, cluster", [
    ("azure-conv-10min", lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2)),
    ("mooncake-conv-5min", lp.Cluster(gpu="h100-sxm", llm="llama-3-8b", replicas=4)),
    ("agentic-sessions-small", lp.Cluster(gpu="h100-sxm", llm="llama-3-8b", replicas=4)),
])
def test_no_default_policy_rejects_the_longest_requests_of_a_bundled_trace(trace, cluster):
    tr = lp.bundled_trace(trace)
    longest = np.sort(np.argsort(tr.prompt_tokens + tr.output_tokens)[-25:])
    inst = lp.Instance(trace=tr.take(longest), cluster=cluster)
    df = lp.compare(inst, default_policies(cluster.n_replicas), [], predictor="history",
                    skip_unavailable=True)
    assert df.attrs["warnings"] == []
    assert dict(zip(df["policy"], df["n_rejected"])) == {p: 0 for p in df["policy"]}
