"""The policy contract: roles, lifting, Meta, Claim, views, registry."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import lpserve as lp
from lpserve.policy import (
    FCFS,
    LRU,
    Claim,
    EngineConfig,
    EvictorView,
    Meta,
    Policy,
    RoundRobin,
    RouterView,
    as_evictor,
    as_router,
    as_scheduler,
)
from lpserve.registry import POLICIES, make_policy, policy_names


def _router_view(n=3, replicas=4, state=None):
    z = np.zeros(n, np.int64)
    return RouterView(now_s=1.0, n_replicas=replicas, phase="colocated", request=np.arange(n),
                      arrival_s=np.zeros(n), prompt_tokens=z + 5, tenant=z, session_id=z,
                      predicted_lo=None, predicted_hi=None, output_tokens=None,
                      block_keys=tuple(np.zeros(0, np.int64) for _ in range(n)),
                      replica_state=state or {k: np.arange(replicas) for k in
                                              RouterView._REPLICA_FIELDS})


def test_defaults_are_round_robin_fcfs_lru():
    p = Policy()
    assert isinstance(p.router, RoundRobin) and isinstance(p.scheduler, FCFS)
    assert isinstance(p.evictor, LRU)
    assert p.meta.online and not p.meta.clairvoyant


def test_round_robin_cycles():
    r = RoundRobin()
    r.reset(None, np.random.default_rng(0))
    assert r.route(_router_view(3)).tolist() == [0, 1, 2]
    assert r.route(_router_view(3)).tolist() == [3, 0, 1]


def test_views_are_read_only():
    v = _router_view()
    with pytest.raises(ValueError):
        v.prompt_tokens[0] = 1
    with pytest.raises(ValueError):
        v.outstanding[0] = 1


def test_view_fields_read_only_and_named_when_missing():
    """Every replica and load field a router reads is read-only (converted on first read),
    the caller's own arrays stay writable, and a replica state that lacks a field is
    refused naming it."""
    own = {k: np.arange(4) for k in RouterView._REPLICA_FIELDS}
    load = {"prefill_tokens": np.arange(4), "cached_blocks": np.arange(4.0)}
    v = RouterView(now_s=0.0, n_replicas=4, phase="colocated", request=np.arange(1),
                   arrival_s=np.zeros(1), prompt_tokens=np.ones(1, np.int64),
                   tenant=np.zeros(1, np.int64), session_id=np.zeros(1, np.int64),
                   predicted_lo=None, predicted_hi=None, output_tokens=None, block_keys=(),
                   replica_state=own, load_state=load)
    for name in (*RouterView._REPLICA_FIELDS, "max_prompt_tokens", "prefill_tokens",
                 "cached_blocks"):
        arr = getattr(v, name)
        assert arr.dtype == np.int64 and not arr.flags.writeable, name
        with pytest.raises(ValueError):
            arr[0] = 9
    assert v.max_prompt_tokens.tolist() == [-1, 15, 31, 47]    # blocks x 16 - 1
    assert all(a.flags.writeable for a in own.values())
    assert load["prefill_tokens"].flags.writeable
    partial = {k: np.zeros(4, np.int64) for k in RouterView._REPLICA_FIELDS[1:]}
    with pytest.raises(ValueError, match="outstanding"):
        _router_view(replicas=4, state=partial).running


def test_replica_state_is_computed_only_on_access():
    calls = []

    def state():
        calls.append(1)
        return {k: np.zeros(2, np.int64) for k in RouterView._REPLICA_FIELDS}

    v = _router_view(replicas=2, state=state)
    RoundRobin().route(v)
    assert calls == []
    assert v.outstanding.tolist() == [0, 0] and v.used_blocks.tolist() == [0, 0]
    assert calls == [1]


def _shortest_prompt(view):
    return view.prompt_tokens.astype(float)


def test_plain_function_lifts_into_a_role_and_pickles():
    p = Policy(scheduler=_shortest_prompt, name="spf")
    assert p.scheduler.name == "_shortest_prompt"
    q = pickle.loads(pickle.dumps(p))
    tr = lp.Trace.from_arrays(arrival_s=[0, 0, 0], prompt_tokens=[300, 10, 100],
                              output_tokens=[2, 2, 2])
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"),
                       cost=lp.UnitRoundCost(memory_tokens=10_000))
    a = lp.simulate(inst, q.with_(engine={"max_num_seqs": 1})).arrays
    assert np.argsort(a["first_scheduled_s"]).tolist() == [1, 2, 0]
    assert isinstance(as_router(lambda v: np.zeros(len(v), int), name="zero"), lp.policy.Router)
    assert as_evictor(lambda v, k: np.arange(k), name="first").evict(
        EvictorView(0.0, 0, *(np.arange(5),) * 5), 2).tolist() == [0, 1]
    assert as_scheduler(FCFS()) is not None


def test_lru_evicts_oldest_then_deepest():
    v = EvictorView(now_s=5.0, replica=0, block=np.arange(5),
                    last_access_s=np.array([3.0, 1.0, 1.0, 2.0, 1.0]),
                    hits=np.zeros(5, np.int64), depth=np.array([0, 0, 2, 0, 1]),
                    created_s=np.zeros(5))
    assert LRU().evict(v, 3).tolist() == [2, 4, 1]
    assert LRU().evict(v, 5).tolist() == [2, 4, 1, 3, 0]


def test_meta_and_claims_validate():
    with pytest.raises(ValueError, match="proofs/"):
        Claim("2-competitive", proof="docs/x.md")
    with pytest.raises(ValueError, match="unknown engine"):
        Meta(engines=("sglang",))
    c = Claim("O(1)-competitive", proof="proofs/mcsf-memory-safety.md", test="tests/properties/x.py::t")
    assert Meta(claims=(c,)).claims[0].proof == "proofs/mcsf-memory-safety.md"


def test_clairvoyance_propagates_from_roles():
    class Oracle(FCFS):
        name = "oracle"
        meta = Meta(clairvoyant=True)
        rank_key = None

        def rank(self, view):
            return view.output_tokens.astype(float)

    p = Policy(scheduler=Oracle())
    assert p.meta.clairvoyant
    tr = lp.Trace.from_arrays(arrival_s=[0, 0], prompt_tokens=[5, 5], output_tokens=[9, 3])
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"),
                       cost=lp.UnitRoundCost(memory_tokens=1000))
    a = lp.simulate(inst, p.with_(engine={"max_num_seqs": 1})).arrays
    assert a["first_scheduled_s"][1] < a["first_scheduled_s"][0]


def test_engine_config_validates():
    with pytest.raises(ValueError, match="batching"):
        EngineConfig(batching="eager")
    with pytest.raises(ValueError, match="chunked_prefill"):
        EngineConfig(batching="prefill-first", chunked_prefill=True)
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)


def test_registry_names_and_unknown_name_lists_them():
    assert {"vllm", "vllm-chunked", "sarathi", "orca", "static"} <= set(policy_names())
    assert set(POLICIES) == set(policy_names())
    with pytest.raises(KeyError, match="registered: .*sarathi"):
        make_policy("nope")
    with pytest.raises(ValueError, match="unknown parameter"):
        make_policy("vllm", max_batch=3)
    p = make_policy("sarathi", max_num_batched_tokens=256, router="least-outstanding")
    assert p.engine.max_num_batched_tokens == 256 and p.engine.chunked_prefill
    assert lp.make_policy("orca").engine.reserve_tokens == 4096
