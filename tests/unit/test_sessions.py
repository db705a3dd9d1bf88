"""kv-cache-tester sessions: reader, composer, split, and Trace.wait_kind."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

import lpserve as lp
from lpserve.opt import load_instance
from lpserve.opt.cache_flow import block_accesses
from lpserve.trace import WAIT_TOOL, WAIT_USER, Trace, TraceError
from lpserve.trace.loaders import bundled_sessions, detect_format, read_sessions
from lpserve.trace.sessions import compose, split


@pytest.fixture(scope="module")
def sess():
    return bundled_sessions()


def test_bundled_slice_reads_as_documented(sess):
    assert (sess.n_sessions, sess.n_requests, sess.n_blocks) == (43, 361, 255467)
    assert np.bincount(sess.wait_kind + 1).tolist() == [33, 289, 39]
    assert sess.block_tokens == 64 and sess.side.sum() == 73
    # sub-agents of trace_0277 are flattened onto its clock, as agents 1..4
    s = sess.names.index("trace_0277")
    lo, hi = sess.offsets[s], sess.offsets[s + 1]
    assert sess.agent[lo:hi].max() == 4 and np.all(np.diff(sess.t_s[lo:hi]) >= 0)
    assert sess.t_s[lo] == 0.0


def test_block_ids_are_unique_per_session_and_chains_hold(sess):
    owner = {}
    for s in range(sess.n_sessions):
        ids = sess.block_flat[sess.block_offsets[sess.offsets[s]]:
                              sess.block_offsets[sess.offsets[s + 1]]]
        for b in np.unique(ids).tolist():
            assert owner.setdefault(b, s) == s
    # every request's prefix chain is valid (cache_flow validates hash chains)
    block_accesses(compose(sess, rate_per_s=0.01, seed=0))


def test_prev_links_point_back_within_the_session(sess):
    idx = np.arange(sess.n_requests)
    p = sess.prev
    assert np.all(p < idx)
    has = p >= 0
    assert np.array_equal(sess.session[p[has]], sess.session[has])
    firsts = sess.offsets[:-1]
    assert np.all(p[firsts] == -1)


def test_load_trace_detects_and_composes(tmp_path, sess):
    path = tmp_path / "s.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(_session("a", [_req(0.0, "tool_use"), _req(5.0, "end_turn")])) + "\n")
    assert detect_format(path) == "kv-cache-tester"
    t = lp.load_trace(path)
    assert t.n == 2 and t.wait_kind.tolist() == [WAIT_TOOL, WAIT_USER]
    b = lp.bundled_trace("agentic-sessions-small")
    assert b.n == 361 and b.arrival_s[0] == 0.0
    r1 = lp.load_trace(path, rate_per_s=0.5, seed=3)
    assert r1.digest() == lp.load_trace(path, rate_per_s=0.5, seed=3).digest()


def test_compose_modes(sess):
    a = compose(sess, rate_per_s=1 / 60, seed=1)
    assert a.digest() == compose(sess, rate_per_s=1 / 60, seed=1).digest()
    assert a.digest() != compose(sess, rate_per_s=1 / 60, seed=2).digest()
    assert a.n == sess.n_requests and np.all(np.diff(a.arrival_s) >= 0)
    # session ids are the sessions' indices; each session keeps its own gaps
    for s in (0, 17):
        m = a.session_id == s
        lo, hi = sess.offsets[s], sess.offsets[s + 1]
        assert np.allclose(np.diff(a.arrival_s[m]), np.diff(sess.t_s[lo:hi]))
    # a closed population never has more than `concurrent` sessions open at once
    c = compose(sess, concurrent=3, seed=0)
    first = np.array([c.arrival_s[c.session_id == s].min() for s in range(sess.n_sessions)])
    last = np.array([c.arrival_s[c.session_id == s].max() for s in range(sess.n_sessions)])
    for t in np.unique(first):
        assert np.sum((first <= t) & (last > t)) <= 3
    st = np.arange(sess.n_sessions) * 10.0
    g = compose(sess, start_s=st)
    assert g.arrival_s[g.session_id == 5].min() == 50.0
    h = compose(sess, rate_per_s=0.1, seed=0, horizon_s=600.0, dependencies=True)
    assert h.arrival_s.max() < 600.0 and h.report.n_dropped == sess.n_requests - h.n
    par = h.parent[h.parent >= 0]
    assert np.all(h.session_id[par] == h.session_id[h.parent >= 0])


def test_compose_rejects_bad_arguments(sess):
    with pytest.raises(TraceError, match="at most one"):
        compose(sess, rate_per_s=1.0, concurrent=2)
    with pytest.raises(TraceError, match="rate_per_s"):
        compose(sess, rate_per_s=-1.0)
    with pytest.raises(TraceError, match="concurrent"):
        compose(sess, concurrent=0)
    with pytest.raises(TraceError, match="start_s"):
        compose(sess, start_s=[0.0])
    with pytest.raises(TraceError, match="distinct"):
        sess.take([1, 1])


def test_split_is_a_seeded_partition(sess):
    a, b = split(sess, 0.5, seed=4)
    assert a.n_sessions + b.n_sessions == sess.n_sessions
    assert not set(a.names) & set(b.names)
    assert split(sess, 0.5, seed=4)[1].names == b.names
    assert split(sess, 0.5, seed=5)[1].names != b.names


def _req(t, stop, **kw):
    d = {"t": t, "type": "n", "in": 200, "out": 10, "hash_ids": [1, 2, 3],
         "input_types": ["text"], "output_types": ["text"], "stop": stop}
    d.update(kw)
    return d


def _session(sid, reqs, **kw):
    d = {"id": sid, "block_size": 64, "hash_id_scope": "local", "requests": reqs}
    d.update(kw)
    return d


@pytest.mark.parametrize("bad, match", [
    (_session("x", [_req(0.0, "weird")]), "line 1, agent 0 request 0, field 'stop'"),
    (_session("x", [_req(0.0, "tool_use", hash_ids=[1, 2])]), "2 hash_ids for in=200"),
    (_session("x", [_req(-1.0, "tool_use")]), "field 't'"),
    (_session("x", [_req(0.0, "tool_use", type="z")]), "field 'type'"),
    (_session("x", [_req(0.0, "tool_use", hash_ids=[1, -2, 3])]), "field 'hash_ids'"),
    (_session("x", [_req(0.0, "tool_use")], hash_id_scope="global"), "hash_id_scope"),
    (_session("x", [_req(0.0, "tool_use")], block_size=0), "block_size"),
])
def test_reader_names_the_bad_field(tmp_path, bad, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=match):
        read_sessions(path)


def test_reader_counts_dropped_requests_and_flattens_subagents(tmp_path):
    sub = {"t": 3.0, "type": "subagent", "requests": [
        _req(0.0, "tool_use", hash_ids=[9, 8, 7]), _req(2.0, "end_turn", hash_ids=[9, 8, 7])]}
    s = _session("x", [_req(0.0, "tool_use"), sub, _req(4.0, "", out=0),
                       _req(9.0, "", output_types=["tool_use"])])
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(s) + "\n")
    S = read_sessions(path)
    assert S.report.dropped == (("zero output tokens", 1),)
    assert S.t_s.tolist() == [0.0, 3.0, 5.0, 9.0]
    assert S.agent.tolist() == [0, 1, 1, 0]
    assert S.prev.tolist() == [-1, 0, 1, 0]  # the sub-agent follows its spawner
    assert S.wait_kind.tolist() == [WAIT_TOOL, WAIT_TOOL, WAIT_USER, WAIT_TOOL]


def test_wait_kind_is_validated_and_kept():
    kw = dict(arrival_s=[0.0, 1.0], prompt_tokens=[5, 5], output_tokens=[1, 1])
    with pytest.raises(TraceError, match="wait_kind"):
        Trace.from_arrays(**kw, wait_kind=[0, 7])
    t = Trace.from_arrays(**kw, wait_kind=[0, -1])
    assert t.take([1]).wait_kind.tolist() == [-1]
    assert Trace.concat([t, t.shifted(5.0)]).wait_kind.tolist() == [0, -1, 0, -1]
    assert t.stats()["wait_kind"] == {"unknown": 1, "tool": 1, "user": 0}
    assert t.digest() != Trace.from_arrays(**kw, wait_kind=[1, -1]).digest()


def test_digests_of_traces_without_wait_kind_are_unchanged():
    """Stored results are keyed by digests: the new field must not move them."""
    assert lp.bundled_trace("azure-conv-10min").digest() == \
        "45c0d6d7b87cc04a6b104616f06e9715fa7f537a42d12004dfa7aa34b002a38d"
    assert lp.bundled_trace("mooncake-conv-5min").digest() == \
        "687348a05c19dd25f47ba18af980342316d2e579912d0744920533cb95373958"
    inst, _ = load_instance("small")
    assert inst.digest() == "3e6336bfa4625bffcb1e8cf91151769c262d3f307222d3599c0f91ebef659731"
