"""The engine-independent adapter core (lpserve.adapters._order): no engine installed."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lpserve.adapters import _order as O
from lpserve.policy import FCFS, PolicyError, RoundRobin, RouterView, Scheduler
from lpserve.registry import policy_names

P = "tests.unit.adapters.policies"


def recs(prompts, running=None, arrivals=None):
    running = running or [False] * len(prompts)
    arrivals = arrivals or [0.1 * i for i in range(len(prompts))]
    return [O.RequestRecord(request=i, arrival_s=a, prompt_tokens=p, running=r)
            for i, (p, r, a) in enumerate(zip(prompts, running, arrivals))]


# ------------------------------------------------------------------ records and views
def test_build_view_is_read_only_and_not_clairvoyant():
    rs = [O.RequestRecord(request=7, arrival_s=1.5, prompt_tokens=30, generated_tokens=4,
                          computed_tokens=34, cached_tokens=16, running=True, preemptions=2,
                          first_scheduled_s=1.6),
          O.RequestRecord(request=3, arrival_s=2.0, prompt_tokens=10)]
    v = O.build_view(rs, now_s=3.0, replica=1, free_blocks=5, total_blocks=9, block_tokens=16)
    assert len(v) == 2 and v.now_s == 3.0 and v.replica == 1
    assert v.request.tolist() == [7, 3] and v.request.dtype == np.int64
    assert v.prompt_tokens.tolist() == [30, 10] and v.cached_tokens.tolist() == [16, 0]
    assert v.running.tolist() == [True, False] and v.preemptions.tolist() == [2, 0]
    assert v.first_scheduled_s[0] == 1.6 and math.isnan(v.first_scheduled_s[1])
    assert v.output_tokens is None and v.predicted_lo is None
    assert (v.free_blocks, v.total_blocks, v.block_tokens) == (5, 9, 16)
    with pytest.raises(ValueError):
        v.prompt_tokens[0] = 1


@pytest.mark.parametrize("field,value", [("prompt_tokens", -1), ("generated_tokens", 1.5),
                                         ("computed_tokens", True)])
def test_record_rejects_bad_counts_naming_field(field, value):
    kw = dict(request=4, arrival_s=0.0, prompt_tokens=3)
    kw[field] = value
    with pytest.raises(O.AdapterError, match=rf"RequestRecord\.{field}.*request 4"):
        O.RequestRecord(**kw)


def test_record_json_round_trip_keeps_nan():
    r = O.RequestRecord(request=1, arrival_s=0.5, prompt_tokens=8, first_scheduled_s=math.nan)
    back = O.RequestRecord.from_json(json.loads(json.dumps(r.to_json())))
    assert back.prompt_tokens == 8 and math.isnan(back.first_scheduled_s)
    with pytest.raises(O.AdapterError, match="unknown field"):
        O.RequestRecord.from_json({**r.to_json(), "output_tokens": 9})


# ------------------------------------------------------------------ ordering
def test_order_is_stable_argsort():
    ranks = np.array([3.0, 1.0, 3.0, 1.0, np.inf, 0.0])
    assert O.order_by_rank(ranks).tolist() == [5, 1, 3, 0, 2, 4]


def test_rank_order_splits_waiting_running_held():
    from tests.unit.adapters.policies import hold_above

    rs = recs([50, 5, 500, 20, 7, 900], running=[True, False, False, True, False, False])
    d = O.rank_order(hold_above(100), rs, "hold", now_s=1.0)
    assert d.waiting.tolist() == [1, 4]
    assert d.running.tolist() == [3, 0]          # worst-ranked running last (the victim)
    assert d.held.tolist() == [2, 5]
    assert np.isinf(d.ranks[[2, 5]]).all()


def test_fcfs_keeps_engine_order():
    rs = recs([9, 1, 5])
    d = O.rank_order(FCFS(), rs, "fcfs", now_s=0.0)
    assert d.waiting.tolist() == [0, 1, 2]


# ------------------------------------------------------------------ faults
def test_policy_exception_is_wrapped_with_policy_name():
    from tests.unit.adapters.policies import exploding

    with pytest.raises(PolicyError, match=r"'my-policy'.*RuntimeError.*division by zero") as ei:
        O.rank_order(exploding, recs([1, 2]), "my-policy", now_s=0.0)
    assert isinstance(ei.value.__cause__, RuntimeError)


@pytest.mark.parametrize("ranks,match", [
    ([0.0], r"shape \(1,\), expected \(2,\)"),
    ([0.0, math.nan], "NaN for request 1"),
    ([0.0, -math.inf], "-inf for request 1"),
    (["a", "b"], "non-numeric"),
])
def test_bad_ranks_are_policy_errors(ranks, match):
    class Bad(Scheduler):
        name = "bad"

        def rank(self, view):
            return np.array(ranks)

    with pytest.raises(PolicyError, match=rf"'bad-name'.*{match}"):
        O.rank_order(Bad(), recs([1, 2]), "bad-name", now_s=0.0)


# ------------------------------------------------------------------ policy resolution
def test_registered_name_gives_its_scheduler():
    assert isinstance(O.resolve_scheduler("vllm"), FCFS)
    assert isinstance(O.resolve_router("vllm"), RoundRobin)


def test_unknown_name_lists_registered_policies():
    with pytest.raises(O.AdapterError) as ei:
        O.resolve_scheduler("sjf-nope")
    msg = str(ei.value)
    assert "'sjf-nope'" in msg
    for name in policy_names():
        assert name in msg


def test_module_attr_specs():
    from tests.unit.adapters import policies

    assert O.resolve_scheduler(f"{P}:shortest_prompt_first") is policies.shortest_prompt_first
    s = O.resolve_scheduler(f"{P}:hold_above", {"max_prompt_tokens": 10})
    assert s.name == "hold-above-10"
    assert O.resolve_scheduler(f"{P}:longest_prompt_first").name == "longest-prompt-first"


@pytest.mark.parametrize("spec,params,match", [
    (f"{P}:nothing_here", None, "has no attribute 'nothing_here'"),
    ("no_such_module_xyz:f", None, "cannot import module 'no_such_module_xyz'"),
    (f"{P}:shortest_prompt_first", {"x": 1}, "takes no lpserve_params"),
    (f"{P}:hold_above", {"max_prompt_tokens": -3}, "factory rejected"),
    (f"{P}:needs_output", None, "clairvoyant"),
    ("vllm", {"max_num_seqs": -1}, "bad lpserve_params"),
    ("", None, "must be a policy name"),
])
def test_bad_specs(spec, params, match):
    with pytest.raises(O.AdapterError, match=match):
        O.resolve_scheduler(spec, params)


def test_policy_spec_config_beats_env_and_parses_json():
    env = {O.ENV_POLICY: "vllm", O.ENV_PARAMS: '{"max_num_seqs": 4}'}
    assert O.policy_spec({}, env) == ("vllm", {"max_num_seqs": 4})
    cfg = {"lpserve_policy": "sarathi", "lpserve_params": {"max_num_seqs": 8}}
    assert O.policy_spec(cfg, env) == ("sarathi", {"max_num_seqs": 8})
    assert O.policy_spec({"lpserve_policy": "orca", "lpserve_params": '{"a": 1}'}, {}) == \
        ("orca", {"a": 1})


@pytest.mark.parametrize("cfg,env,match", [
    ({}, {}, "no lpserve policy configured.*LPSERVE_POLICY.*registered policies: .*vllm"),
    ({}, {O.ENV_POLICY: "vllm", O.ENV_PARAMS: "{bad"}, r"\$LPSERVE_POLICY_PARAMS must be a JSON"),
    ({}, {O.ENV_POLICY: "vllm", O.ENV_PARAMS: "[1]"}, "must be a JSON object"),
    ({"lpserve_params": {}}, {}, "no 'lpserve_policy'"),
])
def test_policy_spec_errors(cfg, env, match):
    with pytest.raises(O.AdapterError, match=match):
        O.policy_spec(cfg, env)


# ------------------------------------------------------------------ routes
def _router_view(n, replicas=3):
    return RouterView(now_s=0.0, n_replicas=replicas, phase="colocated",
                      request=np.arange(n), arrival_s=np.zeros(n), prompt_tokens=np.ones(n),
                      tenant=-np.ones(n), session_id=-np.ones(n), predicted_lo=None,
                      predicted_hi=None, output_tokens=None, block_keys=(),
                      replica_state={k: np.zeros(replicas) for k in RouterView._REPLICA_FIELDS})


def test_checked_routes():
    r = RoundRobin()
    assert O.checked_routes(r, _router_view(4), "rr").tolist() == [0, 1, 2, 0]

    class Out(RoundRobin):
        def route(self, view):
            return np.full(len(view), 3)

    with pytest.raises(PolicyError, match=r"'out'.*replica 3 outside \[0, 3\)"):
        O.checked_routes(Out(), _router_view(2), "out")

    class Boom(RoundRobin):
        def route(self, view):
            raise KeyError("replica table")

    with pytest.raises(PolicyError, match=r"'boom'.*route\(\) raised KeyError"):
        O.checked_routes(Boom(), _router_view(2), "boom")


# ------------------------------------------------------------------ recording
def test_recorder_round_trip(tmp_path):
    from tests.unit.adapters.policies import hold_above

    path = tmp_path / "views.jsonl"
    rec = O.ViewRecorder(path, engine="unit", policy=f"{P}:hold_above",
                         params={"max_prompt_tokens": 100})
    rs = recs([50, 500, 5])
    kw = dict(now_s=2.0, free_blocks=3, total_blocks=10, block_tokens=16)
    d = O.rank_order(hold_above(100), rs, "h", **kw)
    rec.record(rs, kw, d, applied={"waiting": [2, 0]})
    O.ViewRecorder(None, engine="unit", policy="x", params={}).record(rs, kw, d)  # no-op
    (row,) = O.load_recorded(path)
    assert row["engine"] == "unit" and row["params"] == {"max_prompt_tokens": 100}
    assert row["records"] == rs and row["view"] == kw
    assert row["ranks"][1] == math.inf and row["waiting_order"] == [2, 0]
    assert row["held"] == [1] and row["applied"] == {"waiting": [2, 0]}
