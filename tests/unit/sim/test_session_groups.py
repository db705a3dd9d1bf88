"""The session-aware evictors' compiled order (``sim/_session_evict.py`` over the pool's
groups, ``sim/_groups.py``) against the same evictor asked in Python with its view of every
evictable block: the same blocks evicted, so the same run."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.policies.evictors_kv import make_evictor
from lpserve.policies.evictors_sessions import SessionEvictor
from lpserve.trace import Trace
from lpserve.trace import generate as g


class AskedInPython(SessionEvictor):
    """The same evictor without a ``kernel_spec`` of its own: asked in pauses, its
    :meth:`evict` counted."""

    calls = 0

    def evict(self, view, need_blocks):
        AskedInPython.calls += 1
        return super().evict(view, need_blocks)


def _instance(seed: int, kv_fraction: float, threads: bool = True) -> lp.Instance:
    """Chat sessions with tool calls inside a session and a user turn after its last
    request, on a KV cache small enough to evict often."""
    tr = g.sessions(40, session_arrivals=g.Poisson(1.0), turns=g.Uniform(3, 8),
                    first_prompt=g.Uniform(300, 1500), turn_prompt=g.Uniform(20, 200),
                    output=g.Uniform(10, 80), think_time_s=4.0, block_tokens=16, seed=seed)
    sid = np.asarray(tr.session_id)
    last = np.array([i == np.flatnonzero(sid == sid[i]).max() for i in range(tr.n)])
    t = Trace.from_arrays(arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                          output_tokens=tr.output_tokens, block_ids=tr.block_lists(),
                          block_tokens=16, session_id=sid if threads else None,
                          wait_kind=np.where(last, 1, 0) if threads else None,
                          name="chat-waits")
    return lp.Instance(trace=t, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                   gpu_memory_fraction=kv_fraction))


def _run(inst: lp.Instance, name: str, python: bool, **knobs) -> lp.Result:
    ev = make_evictor(name, min_n=3, refit=4, **knobs)
    if python:
        ev = AskedInPython(ev.spec)
    pol = lp.make_policy("vllm-chunked", evictor=ev)
    return lp.simulate(inst, pol, seed=1, check=True)


@pytest.mark.parametrize("name,knobs", [("tail-lru", {}), ("reuse-decay", {}),
                                        ("return-knapsack", {}),
                                        ("ttl-pin", {"duel_alpha": 0.0})])
@pytest.mark.parametrize("seed,kv_fraction,threads", [(3, 0.2, True), (5, 0.17, True),
                                                      (4, 0.17, False)])
def test_compiled_order_evicts_what_the_evictor_chooses(monkeypatch, name, knobs, seed,
                                                        kv_fraction, threads):
    inst = _instance(seed, kv_fraction, threads)
    AskedInPython.calls = 0
    ref = _run(inst, name, True, **knobs)
    assert AskedInPython.calls > 20  # the cache evicts often enough to tell orders apart
    monkeypatch.setattr(SessionEvictor, "evict", None)  # the compiled run never asks
    got = _run(inst, name, False, **knobs)
    assert got.digest() == ref.digest()
    for k in ("first_token_s", "finish_s", "cached_prompt_tokens"):
        assert np.array_equal(got.arrays[k], ref.arrays[k], equal_nan=True), k


@pytest.mark.parametrize("seed,kv_fraction,threads,knobs", [
    (3, 0.2, True, {}), (5, 0.17, True, {}), (4, 0.17, False, {}),
    (4, 0.17, False, {"ttl_s": 30.0})])  # a fixed TTL: pins the duel has not yet allowed
def test_the_duel_is_asked_in_python_once_it_starts(monkeypatch, seed, kv_fraction, threads,
                                                    knobs):
    """ttl-pin with its duel (shadow caches only the Python object keeps): the kernels
    evict until the first finish of a thread steps the shadows, then ask the object (the
    evictions before it are the kernels'); the same run as the evictor asked in Python
    throughout. Without threads the duel never starts and the object is never asked."""
    inst = _instance(seed, kv_fraction, threads)
    AskedInPython.calls = 0
    ref = _run(inst, "ttl-pin", True, **knobs)
    asked = AskedInPython.calls
    assert asked > 20
    calls = []
    real = SessionEvictor.evict

    def counted(self, view, need_blocks):
        calls.append(float(view.now_s))
        return real(self, view, need_blocks)

    monkeypatch.setattr(SessionEvictor, "evict", counted)
    got = _run(inst, "ttl-pin", False, **knobs)
    assert got.digest() == ref.digest()
    for k in ("first_token_s", "finish_s", "cached_prompt_tokens"):
        assert np.array_equal(got.arrays[k], ref.arrays[k], equal_nan=True), k
    assert got.stats["engine"] == "compiled+python-evictor"
    first_finish = float(np.nanmin(np.asarray(got.arrays["finish_s"])))
    # evictions before the duel starts (the first finish) are the kernels'
    assert not calls if not threads else min(calls) >= first_finish


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0]),
                          st.sampled_from([-3.0, 0.0, 1.0]), st.integers(-1, 3),
                          st.integers(0, 4), st.integers(-1, 2)), min_size=0, max_size=70,
                unique_by=lambda t: t[2:]))
def test_groups_are_taken_by_key_then_thread_time_and_wait(rows):
    """Scans (the first 16 groups) and the merge sort of the rest give the order by key,
    then thread, release time and wait kind (groups differ in the last three), as does
    the merge sort alone."""
    from lpserve.sim._session_evict import _order, _sorted

    G = len(rows)
    keys = np.array([[r[0] for r in rows], [r[1] for r in rows]], np.float64).reshape(2, G)
    ties = np.array([[r[2] for r in rows], [r[3] for r in rows], [r[4] for r in rows],
                     [0] * G], np.int64).reshape(4, G)
    want = sorted(range(G), key=lambda k: (keys[0, k], keys[1, k], *ties[:3, k]))
    assert _sorted(keys, ties, np.arange(G, dtype=np.int64)).tolist() == want
    order, used, n = np.empty(G, np.int64), np.zeros(G, np.bool_), 0
    while n < G:
        n = _order(keys, ties, order, n, used)
    assert order.tolist() == want
