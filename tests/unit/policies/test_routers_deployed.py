"""The deployed KV-aware routers (Dynamo, llm-d, SGLang, Preble) on hand-built views, the
KV-aware view fields the simulator fills, and the locality router's kernel and twin."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies import _routing_kernels as K
from lpserve.policies.routers_deployed import DynamoKV, LlmdScheduler, SGLangCacheAware
from lpserve.policies.routers_locality import LocalityIndexRouter
from lpserve.policies.routers_preble import Preble
from lpserve.policy import Router, RouterView


def view(prompt, *, cached=None, pending=None, outstanding=None, running=None, used=None,
         total=None, waiting=None, keys=(), now=0.0, session=None, bt=16, key_tokens=0,
         max_prompt=None, completions=None, request=None):
    n = len(prompt)
    R = len(outstanding if outstanding is not None else pending)
    z = np.zeros(R, np.int64)
    out = np.asarray(outstanding if outstanding is not None else z)
    st = {"outstanding": out, "waiting": np.asarray(waiting if waiting is not None else out),
          "running": np.asarray(running if running is not None else z),
          "used_blocks": np.asarray(used if used is not None else z),
          "total_blocks": np.asarray(total if total is not None else np.full(R, 10_000))}
    if max_prompt is not None:
        st["max_prompt_tokens"] = np.asarray(max_prompt)
    return RouterView(
        now_s=now, n_replicas=R, phase="colocated",
        request=np.arange(n) if request is None else np.asarray(request),
        arrival_s=np.zeros(n), prompt_tokens=np.asarray(prompt),
        tenant=np.full(n, -1), session_id=np.asarray(session if session is not None
                                                      else np.full(n, -1)),
        predicted_lo=None, predicted_hi=None, output_tokens=None,
        block_keys=tuple(np.asarray(k, np.int64) for k in keys), replica_state=st,
        block_tokens=bt, key_tokens=key_tokens,
        cached_tokens=np.asarray(cached if cached is not None else np.zeros((n, R), np.int64)),
        load_state={"prefill_tokens": np.asarray(pending if pending is not None else z),
                    "cached_blocks": z}, completions=completions)


def test_dynamo_logit_and_tie_break():
    r = DynamoKV()
    r.reset(None, np.random.default_rng(0))
    # logit = (pending + P - cached)/16 + used + pending/16 + ceil(P/16) - cached/16
    v = view([320], cached=[[0, 160, 320]], pending=[0, 0, 640], used=[0, 0, 0])
    # worker 0: 20 + 20 = 40; worker 1: 10 + 10 = 20; worker 2: (640)/16 + 40 + 0 = 80
    assert r.route(v).tolist() == [1]
    # ties go to the smallest tree
    v = view([160], pending=[0, 0])
    v._load_src["cached_blocks"] = np.array([5, 2])
    assert r.route(v).tolist() == [1]
    # a second request in the same call sees the first one's load
    assert r.route(view([1600, 1600], pending=[0, 0])).tolist() == [0, 1]
    with pytest.raises(ValueError, match="cached_tokens"):
        r.route(RouterView(now_s=0, n_replicas=2, phase="colocated", request=np.arange(1),
                           arrival_s=np.zeros(1), prompt_tokens=np.array([5]),
                           tenant=np.full(1, -1), session_id=np.full(1, -1),
                           predicted_lo=None, predicted_hi=None, output_tokens=None,
                           block_keys=(), replica_state=view([5], pending=[0, 0])._state_fn))


def test_dynamo_temperature_samples_by_softmax():
    r = DynamoKV(temperature=0.5)
    r.reset(None, np.random.default_rng(1))
    picks = [r.route(view([320], cached=[[320, 0]], pending=[0, 0]))[0] for _ in range(400)]
    share = np.mean(np.array(picks) == 0)
    # logits 0 and 40 -> normalized 0, -1 -> p0 = 1 / (1 + e^-2) = 0.881
    assert abs(share - 1 / (1 + np.exp(-2.0))) < 0.05


def test_llmd_weighted_scorers():
    r = LlmdScheduler()
    r.reset(None, np.random.default_rng(0))
    # prefix: replica 2 holds more blocks (score 1), replica 1 fewer (0); queue: replica 0
    # shortest; KV: all empty
    v = view([640], cached=[[0, 160, 480]], waiting=[0, 3, 3], outstanding=[0, 3, 3])
    # scores: r0 = 2*0 + 1 + 1 = 2; r1 = 0 + 1 + 0 = 1; r2 = 2 + 1 + 0 = 3
    assert r.route(v).tolist() == [2]
    r2 = LlmdScheduler(prefix_weight=0.0)
    r2.reset(None, np.random.default_rng(0))
    assert r2.route(v).tolist() == [0]
    with pytest.raises(ValueError):
        LlmdScheduler(queue_weight=-1)


def test_sglang_cache_threshold_and_imbalance():
    r = SGLangCacheAware()
    r.reset(None, np.random.default_rng(0))
    keys = [11, 12, 13, 14]
    assert r.route(view([64], outstanding=[1, 0], keys=[keys])).tolist() == [1]
    # 3 of 4 blocks match replica 1's tree (> 0.3): affinity beats the shorter queue
    assert r.route(view([64], outstanding=[0, 5], keys=[keys[:3] + [99]])).tolist() == [1]
    # 1 of 4 (0.25 <= 0.3): least loaded
    assert r.route(view([64], outstanding=[0, 5], keys=[[11, 98, 97, 96]])).tolist() == [0]
    # imbalance (70 - 1 > 64 and 70 > 1.5): least loaded despite the match
    assert r.route(view([64], outstanding=[1, 70], keys=[keys])).tolist() == [0]


def test_preble_exploit_explore_and_completions():
    r = Preble()
    r.reset(lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2),
            np.random.default_rng(0))
    # a new prefix hangs off the root: exploit with the root's allocation (every replica),
    # least load cost (all 0: the lowest index); the prefix is then allocated to both
    assert r.route(view([512], pending=[0, 0], keys=[[1, 2, 3, 4, 5, 6, 7, 8]],
                        key_tokens=64, request=[0])).tolist() == [0]
    # sharing 1 of 8 blocks (new part >= matched part, a node split): explore, the least
    # load cost over all replicas (replica 0 carries request 0's decode): replica 1
    assert r.route(view([512], pending=[0, 0], keys=[[1, 20, 21, 22, 23, 24, 25, 26]],
                        key_tokens=64, request=[1])).tolist() == [1]
    # sharing 7 of 8 blocks with request 1: exploit its prefix's allocation {1}, although
    # replica 1 now has the larger load cost
    assert r._costs()[1] > r._costs()[0]
    assert r.route(view([512], pending=[0, 0], keys=[[1, 20, 21, 22, 23, 24, 25, 30]],
                        key_tokens=64, request=[2])).tolist() == [1]
    # completions release the active counts along the request's path
    done = {"request": np.array([0, 1]), "replica": np.array([0, 0]),
            "ttft_s": np.array([0.1, 0.1]), "tpot_s": np.array([0.02, 0.02]),
            "output_tokens": np.array([10, 10])}
    r.route(view([512], pending=[0, 0], keys=[[30, 31]], key_tokens=64, request=[3],
                 completions=done))
    assert not r._inflight.keys() & {0, 1}
    assert r._tpot[0][-1] == 0.02


class _Cap(Router):
    pass


@pytest.mark.parametrize("make", [DynamoKV, LlmdScheduler, SGLangCacheAware, Preble,
                                  lambda: _locality(2)])
def test_routers_skip_replicas_that_cannot_hold_the_prompt(make):
    r = make()
    r.reset(lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2),
            np.random.default_rng(0))
    # replica 0 is idle and holds the prefix, but only replica 1 can hold the prompt
    v = view([4000], cached=[[3200, 0]], pending=[0, 10**6], outstanding=[0, 50],
             running=[0, 50], max_prompt=[3000, 10**6], keys=[[1, 2, 3]], key_tokens=1024)
    assert r.route(v).tolist() == [1]
    # fits nowhere: the replica with the most room (its engine rejects the request)
    v = view([4000], pending=[0, 0], max_prompt=[3000, 3500], keys=[[1]], key_tokens=1024)
    assert r.route(v).tolist() == [1]


def _locality(R, **kw):
    from lpserve.opt.routing_profile import replica_profile

    p = replica_profile(lp.cost_model(gpu="a100-80gb", llm="llama-2-7b"), c_max=8192)
    return LocalityIndexRouter.from_profiles([p] * R, **kw)


def test_locality_kernel_equals_its_twin():
    rng = np.random.default_rng(0)
    r = _locality(5, chunk_tokens=4096)
    for trial in range(40):
        n = int(rng.integers(1, 4))
        modes = np.array([rng.integers(2), rng.integers(2), rng.integers(4)], np.int64)
        args = (r.coef * rng.uniform(0.5, 2.0, r.coef.shape),
                rng.integers(1, 6000, n).astype(np.float64), rng.uniform(1, 500, n),
                rng.integers(0, 2000, (n, 5)), rng.integers(0, 10**5, 5),
                rng.integers(0, 10**9, 5),
                rng.integers(0, 64, 5), rng.integers(0, 5000, 5), 16.0,
                rng.integers(100, 8000, 5), modes, rng.integers(0, 3, 5).astype(float),
                float(rng.choice([0.0, rng.uniform(0.01, 1.0)])))
        assert np.array_equal(K.locality_route(*args), K.locality_route_ref(*args))


def test_locality_prefers_cached_and_faster_replica():
    from lpserve.opt.routing_profile import replica_profile

    slow = replica_profile(lp.cost_model(gpu="a100-40gb", llm="llama-3-8b"), c_max=32768)
    fast = replica_profile(lp.cost_model(gpu="h100-sxm", llm="llama-3-8b"), c_max=32768)
    r = LocalityIndexRouter.from_profiles([slow, fast], chunk_tokens=8192, decode="none")
    assert r.route(view([8000], pending=[0, 0])).tolist() == [1]          # speed
    assert r.route(view([8000], cached=[[7680, 0]], pending=[0, 0])).tolist() == [0]  # cache
    # the faster replica's backlog in seconds, not in tokens, decides
    assert r.route(view([2000], pending=[10_000, 30_000])).tolist() == [1]
    with pytest.raises(ValueError, match="one of"):
        LocalityIndexRouter.from_profiles([slow], backlog="blocks")


# vLLM V1 (``vllm``) on an A100 prefills in 2,048-token chunks: at request 2's arrival
# request 0 still has 3,000 - 2,048 = 952 prompt tokens to prefill; vLLM V0 prefills the
# whole prompt in its first iteration
@pytest.mark.parametrize("engine, left_of_request_0", [("vllm", 952), ("vllm-v0", 0)])
def test_simulator_fills_the_kv_aware_view_fields(engine, left_of_request_0):
    seen = []

    class Spy(Router):
        name = "spy"
        reads_completions = True

        def route(self, v):
            seen.append((v.now_s, v.cached_tokens.copy(), v.prefill_tokens.copy(),
                         v.cached_blocks.copy(), v.completions, v.max_prompt_tokens.copy(),
                         v.prefill_square_tokens.copy()))
            return np.zeros(len(v), np.int64)

    # request 1 arrives while request 0's prefill iteration runs, so request 1 waits;
    # request 2 shares request 0's first 4 blocks; request 3 comes after all finished
    b0, b1 = list(range(1, 48)), list(range(100, 147))
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 0.001, 0.002, 50.0],
                              prompt_tokens=[3000, 3000, 256, 256], output_tokens=[4] * 4,
                              block_ids=[b0, b1, b0[:4], b0[:4]], block_tokens=64)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=2))
    res = lp.simulate(inst, lp.make_policy(engine, router=Spy()))
    assert res.summary()["n_finished"] == 4
    t, cached, pend, blocks, done, maxp, square = seen[2]
    assert cached.tolist() == [[256, 0]]     # request 0's first 16 KV blocks, on replica 0
    # request 1 waits with nothing cached; request 0's unfinished prefill counts too
    assert pend.tolist() == [3000 + left_of_request_0, 0]
    # their attention: 3000^2 - 0^2 for request 1, 3000^2 - 2048^2 for request 0's tail
    tail = 3000**2 - (3000 - left_of_request_0)**2 if left_of_request_0 else 0
    assert square.tolist() == [3000**2 + tail, 0]
    assert seen[0][4]["request"].size == 0   # nothing finished before the first arrival
    t, cached, pend, blocks, done, maxp, square = seen[3]
    assert cached.tolist() == [[256, 0]] and pend.tolist() == [0, 0]
    assert square.tolist() == [0, 0]
    assert blocks[0] >= 16 and blocks[1] == 0
    assert sorted(done["request"].tolist()) == [0, 1, 2]
    assert np.all(done["ttft_s"] > 0) and np.all(done["output_tokens"] == 4)
    assert np.all(done["replica"] == 0)
    assert maxp[0] == maxp[1] > 3000
