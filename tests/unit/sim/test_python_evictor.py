"""An evictor written in Python on the compiled replicas (lpserve/sim/hooks.py): it is
asked at the same evictions with the same views, and told of the same arrivals and
finishes, whether the replicas run decode runs or one iteration per step (the reference
mode), so every request's outcome is equal; a wrong answer raises the contract's
error."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import lpserve as lp
from lpserve.policy import Evictor, PolicyError
from tests.strategies import RESULT_FIELDS, same_array

FIELDS = ("block", "last_access_s", "hits", "depth", "created_s", "children", "parent",
          "turn_gap_s", "queued", "thread", "wait_kind")


class Recorder(Evictor):
    """Most recently used first among the blocks no waiting request would hit, deepest
    first; records every view and event it is shown (keys relabelled by first sight, so
    the two engines' key types compare)."""

    name = "recorder"
    reads_queue = True
    reads_keys = True
    observes_requests = True

    def reset(self, cluster, rng):
        self.views, self.events, self._ids = [], [], {}

    def _label(self, keys):
        return [self._ids.setdefault(k, len(self._ids)) for k in keys]

    def observe(self, event):
        self.events.append(dataclasses.replace(event, block_keys=tuple(
            self._label(event.block_keys))))

    def evict(self, view, need_blocks):
        rec = {f: np.asarray(getattr(view, f)).copy() for f in FIELDS}
        rec.update(now_s=view.now_s, replica=view.replica, need=need_blocks,
                   key=self._label(view.key), block_tokens=view.block_tokens)
        self.views.append(rec)
        order = np.lexsort((-np.asarray(view.depth), -np.asarray(view.last_access_s),
                            np.asarray(view.queued)))
        return order[:need_blocks]


def _instance(seed: int, replicas: int, frac: float) -> lp.Instance:
    rng = np.random.default_rng(seed)
    n, bt = 60, 16
    shared = [int(b) for b in rng.integers(0, 1 << 30, 30)]
    prompts = rng.integers(40, 700, n)
    blocks = []
    for p in prompts:
        full = int(p) // bt
        k = min(int(rng.integers(0, full + 1)), len(shared))
        blocks.append(shared[:k] + [int(b) for b in rng.integers(1 << 31, 1 << 40, full - k)])
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 4, n)), prompt_tokens=prompts,
                              output_tokens=rng.integers(1, 200, n), block_ids=blocks,
                              block_tokens=bt, session_id=rng.integers(0, 8, n),
                              wait_kind=rng.integers(0, 2, n))
    return lp.Instance(trace=tr, cluster=lp.Cluster(
        gpu="a100-80gb", llm="llama-2-7b", replicas=replicas, gpu_memory_fraction=frac))


def _same_outcomes(a, b):
    for col in RESULT_FIELDS:
        assert same_array(a.arrays[col], b.arrays[col]), col


@pytest.mark.parametrize("seed,replicas,frac,preemption", [
    (0, 1, 0.17, "recompute"), (1, 2, 0.17, "swap"), (2, 1, 0.18, "swap"),
    (3, 2, 0.17, "compress-swap")])
def test_views_events_and_outcomes_equal_the_reference_mode(seed, replicas, frac,
                                                              preemption):
    inst = _instance(seed, replicas, frac)
    runs = {}
    for reference in (False, True):
        ev = Recorder()
        base = lp.make_policy("vllm-chunked")
        pol = base.with_(evictor=ev, engine=dataclasses.replace(
            base.engine, preemption=preemption, max_num_seqs=16))
        res = lp.simulate(inst, pol, seed=1, check=True, reference=reference)
        runs[reference] = (res, ev.views, ev.events)
    (fast, fv, fe), (ref, rv, re_) = runs[False], runs[True]
    assert fast.stats["engine"] == "compiled+python-evictor"
    assert ref.stats["engine"] == "compiled+python-evictor+reference"
    _same_outcomes(fast, ref)
    assert len(rv) > 5 and len(fv) == len(rv)  # the case evicts
    for a, b in zip(fv, rv):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k]), k
    assert fe == re_ and {e.kind for e in fe} == {"arrive", "finish"}
    assert any(e.block_keys for e in fe)


@pytest.mark.parametrize("name", ["ttl-pin", "tail-lru"])
def test_a_session_evictor_runs_compiled_equal_to_the_python_replicas(name):
    inst = _instance(5, 2, 0.17)
    make = lambda: lp.make_policy(f"vllm-chunked+{name}", min_n=3, refit=4)
    fast = lp.simulate(inst, make(), seed=1)
    ref = lp.simulate(inst, make(), seed=1, reference=True)
    # ttl-pin's duel keeps shadow caches in Python; tail-lru runs in the kernels
    assert fast.stats["engine"] == ("compiled+python-evictor" if name == "ttl-pin"
                                    else "compiled")
    _same_outcomes(fast, ref)
    assert fast.summary()["prefix_hit_rate"] == ref.summary()["prefix_hit_rate"] > 0


class _Repeats(Evictor):
    name = "repeats"

    def evict(self, view, need_blocks):
        return np.zeros(need_blocks + 1, np.int64)


def test_a_wrong_answer_in_the_pause_raises_the_contract_error():
    pol = lp.make_policy("vllm-chunked").with_(evictor=_Repeats())
    with pytest.raises(PolicyError, match=r"evictor 'repeats'\): evict\(\) returned shape"):
        lp.simulate(_instance(0, 1, 0.17), pol)
