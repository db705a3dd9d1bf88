"""The seed papers' workloads (``lpserve.trace.papers``, ``lpserve.trace.programs``), their
metrics (``lpserve.objectives``) and Autellix's load balancer."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve import objectives as obj
from lpserve.policies.routers import ProgramAffinity
from lpserve.policy import RouterView
from lpserve.trace import papers
from lpserve.trace import programs as P


@pytest.mark.parametrize("make, kind", [(P.sharegpt_programs, "sharegpt"),
                                        (P.react_programs, "bfcl"),
                                        (P.lats_programs, "lats")])
def test_program_workloads_match_the_papers_statistics(make, kind):
    want = P.AUTELLIX_STATS[kind]
    n = 8 if kind == "lats" else 400
    st = [P.program_stats(make(n, 1.0, seed=s)) for s in range(3)]
    calls = np.mean([s["calls_per_program"] for s in st])
    assert calls == pytest.approx(want["calls"], rel=0.12)
    assert max(s["max_calls"] for s in st) <= want["max_calls"]
    assert np.mean([s["prefill"] for s in st]) == pytest.approx(want["prefill"], rel=0.15)
    assert np.mean([s["decode"] for s in st]) == pytest.approx(want["decode"], rel=0.12)


def test_programs_are_chains_or_trees_sharing_their_context():
    tr = P.react_programs(20, 1.0, seed=3)
    par, pid = tr.parent, tr.program_id
    kids = np.flatnonzero(par >= 0)
    assert np.all(pid[par[kids]] == pid[kids])  # a call's parent is in its program
    assert np.all(tr.prompt_tokens[kids] > tr.prompt_tokens[par[kids]])  # context grows
    off, flat = tr.block_offsets, tr.block_flat
    for i in kids[:20].tolist():  # the parent's full prompt blocks lead the child's prompt
        mine, theirs = flat[off[i]:off[i + 1]], flat[off[par[i]]:off[par[i] + 1]]
        full = int(tr.prompt_tokens[par[i]]) // tr.block_tokens
        assert np.array_equal(mine[:full], theirs[:full])
    lats = P.lats_programs(2, 1.0, seed=0)
    width = np.bincount(lats.parent[lats.parent >= 0])
    assert set(width[width > 0].tolist()) <= {5, 4, 3, 2, 1} and width.max() == 5
    assert P.program_stats(P.mixed_programs(6, 1.0, seed=0))["programs"] == 6
    with pytest.raises(lp.TraceError, match="rate_per_s"):
        P.sharegpt_programs(3, 0.0)


def test_sharegpt_and_alpaca_like_lengths():
    s = papers.length_stats(papers.sharegpt_like(20000, 1.0, seed=0, max_prompt_tokens=10**6,
                                                 max_output_tokens=10**6))
    assert s["output_mean"] == pytest.approx(305.4, rel=0.05)
    assert s["output_cv"] == pytest.approx(0.96, rel=0.1)
    a = papers.length_stats(papers.alpaca_like(20000, 1.0, seed=0))
    assert a["prompt_mean"] == pytest.approx(19.31, rel=0.05)
    assert a["output_mean"] == pytest.approx(58.45, rel=0.05)
    mix = papers.jitserve_mix(300, 2.0, seed=1)
    comp = mix.program_id >= 0
    assert set(np.unique(mix.tenant)) == {0, 1, 2}
    assert np.all(mix.tenant[comp] == 2) and np.all(np.bincount(mix.program_id[comp]) == 3)
    with pytest.raises(ValueError, match="shares"):
        papers.jitserve_mix(10, 1.0, shares=(0.5, 0.5, 0.5))


def test_program_token_latency_uses_the_critical_path():
    # program 0: a chain 0 -> 1; program 1: a root 2 with parallel children 3 and 4
    arrival = np.array([0.0, 0.0, 1.0, 1.0, 1.0])
    finish = np.array([2.0, 5.0, 2.0, 4.0, 3.0])
    out = np.array([10, 10, 4, 6, 2])
    lat = obj.program_token_latency_s(arrival_s=arrival, finish_s=finish, output_tokens=out,
                                      program_id=np.array([0, 0, 1, 1, 1]),
                                      parent=np.array([-1, 0, -1, 2, 2]))
    assert lat.tolist() == [5.0 / 20, 3.0 / 10]  # critical path 4 + 6, not 4 + 6 + 2
    lat = obj.program_token_latency_s(arrival_s=arrival, finish_s=np.r_[finish[:4], np.nan],
                                      output_tokens=out, program_id=None, parent=None)
    assert lat[:4].tolist() == [0.2, 0.5, 0.25, 0.5] and np.isnan(lat[4])


def test_service_goodput_counts_a_compound_request_only_when_all_calls_meet():
    meets = np.array([True, False, True, True, True])
    out = np.array([100, 10, 20, 30, 40])
    pid = np.array([-1, 0, 0, 1, 1])
    assert obj.service_goodput(meets=meets, output_tokens=out, program_id=pid,
                               span_s=10.0) == pytest.approx((100 + 30 + 40) / 10.0)
    assert obj.service_goodput(meets=meets, output_tokens=out, program_id=None,
                               span_s=10.0) == pytest.approx(190 / 10.0)


def test_kv_token_seconds_and_normalized_latency():
    # admitted at 0, first token at 1, finished at 3: 100 prompt + 3 output tokens
    ts = obj.kv_token_seconds(np.array([0.0]), np.array([1.0]), np.array([3.0]),
                              np.array([100]), np.array([3]))
    assert ts == pytest.approx(100 / 2 + (100 + 1.0) * 2)
    assert obj.normalized_latency_s(np.array([3.0, np.nan]), np.array([3, 5])) == 1.0


def _view(prompts, pids, outstanding):
    n = len(prompts)
    return RouterView(now_s=0.0, n_replicas=len(outstanding), phase="colocated",
                      request=np.arange(n), arrival_s=np.zeros(n),
                      prompt_tokens=np.asarray(prompts), tenant=np.full(n, -1),
                      session_id=np.full(n, -1), predicted_lo=None, predicted_hi=None,
                      output_tokens=None, block_keys=(), program_id=np.asarray(pids),
                      replica_state={"outstanding": np.asarray(outstanding),
                                     "waiting": np.zeros(len(outstanding)),
                                     "running": np.zeros(len(outstanding)),
                                     "used_blocks": np.zeros(len(outstanding)),
                                     "total_blocks": np.ones(len(outstanding))})


def test_autellix_balancer_short_to_least_used_long_to_the_programs_engine():
    lb = ProgramAffinity(long_tokens=2048)
    lb.reset(None, np.random.default_rng(0))
    # the short call joins engine 1 (least used); the long one then finds 1 and 2 tied
    assert lb.route(_view([100, 5000], [7, 7], [3, 1, 2])).tolist() == [1, 1]
    # program 7's long calls stay on engine 1 wherever the load is; short ones (and calls
    # outside programs) go to the least used
    assert lb.route(_view([6000, 50, 3000], [7, 7, -1], [0, 9, 9])).tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match="long_tokens"):
        ProgramAffinity(0)


def test_autellix_policies_run_with_program_ids_in_the_router_view():
    tr = P.react_programs(6, 2.0, seed=0)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-3.1-8b",
                                                    replicas=2))
    res = lp.simulate(inst, "autellix", check=True)
    assert np.all(res.arrays["status"] == "finished")
    long_calls = tr.prompt_tokens > 2048
    for p in np.unique(tr.program_id[long_calls]):
        m = long_calls & (tr.program_id == p)
        assert np.unique(res.arrays["replica"][m]).size == 1


def test_empirical_joint_resamples_observed_pairs_and_refuses_bad_input():
    from lpserve.trace import TraceError
    from lpserve.trace import generate as G

    joint = G.EmpiricalJoint(np.array([10, 2000]), np.array([500, 3]))
    tr = G.synthetic(200, arrivals=G.Poisson(1.0), lengths=joint, seed=0)
    pairs = set(zip(tr.prompt_tokens.tolist(), tr.output_tokens.tolist()))
    assert pairs == {(10, 500), (2000, 3)}  # pairs kept together, never mixed
    with pytest.raises(TraceError, match="equal length"):
        G.EmpiricalJoint(np.array([1, 2]), np.array([1]))
    with pytest.raises(TraceError, match=">= 1"):
        G.EmpiricalJoint(np.array([0, 2]), np.array([1, 1]))
