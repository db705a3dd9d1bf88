"""End to end in the simulator: session-aware KV eviction on composed agentic sessions,
a long-context model, loads where KV binds; then routing (session affinity vs load
balance) on 4 replicas.

Workload: the held-out half (split seed 0) of the kv-cache-tester sessions (the bundled
slice without ``../shared``), as a closed population of ``K`` concurrent sessions
(``compose(..., concurrent=K, seed=2, dependencies=True)``: a request is released once the
one it follows has finished), the first ``--horizon-s`` seconds. Cluster: Llama-3.1-8B
(128k context) on H100-SXM, TP 1, 90 % of memory for the engine, 64-token KV blocks;
vLLM with chunked prefill (8,192-token budget), FCFS. The session-aware evictors start
from wait statistics fitted on the fit half (Poisson starts at 1/60 s, 90 minutes).

For each run it prints the prefix hit rate, TTFT p50/p99 (s), the prefill GPU-seconds the
hits saved (cost model: prefill of each prompt from scratch minus prefill of its uncached
part after its cached prefix), the share of KV blocks held by requests in flight (time
average; only the rest can be retained for sessions between turns) and the finished
requests.

Run: ``python benchmarks/cache_sessions_end_to_end.py [--concurrency 5,6,7]
[--replicas-concurrency 20,24] [--horizon-s 1800] [--evictors lru,ttl-pin,return-knapsack]
[--routers least-outstanding,prefix-affinity]`` (the routers of the 4-replica runs).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cache_sessions import load_sessions

import lpserve as lp
from lpserve.opt import cache_flow as cf
from lpserve.policies.evictors_sessions import SESSION_SPECS, fit_wait_stats
from lpserve.trace.sessions import compose, split

BUDGET = 8192


def saved_prefill_s(res, trace, cost) -> float:
    """Prefill seconds the prefix hits saved (from scratch minus after the cached part)."""
    a = res.arrays
    done = a["status"] == "finished"
    P = np.asarray(trace.prompt_tokens)[done]
    c = np.minimum(np.asarray(a["cached_prompt_tokens"])[done], P - 1)
    full = cost.batch_times_s([{"prefill_tokens": [int(p)], "prefill_cached": [0]} for p in P])
    part = cost.batch_times_s([{"prefill_tokens": [int(p - k)], "prefill_cached": [int(k)]}
                               for p, k in zip(P, c)])
    return float(np.sum(full - part))


def policy(evictor: str, router: str, prior):
    if evictor in SESSION_SPECS:
        return lp.make_policy(f"vllm-chunked+{evictor}", max_num_batched_tokens=BUDGET,
                              router=router, prior=prior)
    return lp.make_policy("vllm-chunked", max_num_batched_tokens=BUDGET, router=router,
                          evictor=evictor)


def run(held, prior, K: int, replicas: int, horizon_s: float, evictors, routers) -> None:
    tr = compose(held, concurrent=K, seed=2, horizon_s=horizon_s, dependencies=True,
                 name=f"{K} sessions")
    cl = lp.Cluster(gpu="h100-sxm", llm="llama-3.1-8b", replicas=replicas, block_tokens=64,
                    gpu_memory_fraction=0.9)
    inst = lp.Instance(trace=tr, cluster=cl, slo=lp.SLO(ttft_s=5.0, tpot_s=0.1))
    cost = lp.cost_model(gpu="h100-sxm", llm="llama-3.1-8b", tp=1)
    print(f"\n{K} concurrent sessions on {replicas} replica(s): {tr.n} requests, prompts "
          f"p50 {np.median(tr.prompt_tokens):.0f} tokens")
    print(f"  {'router':<18} {'evictor':<16} {'hit':>6} {'TTFT p50':>9} {'p99':>8} "
          f"{'saved GPU-s':>11} {'KV busy':>7} {'done':>5} {'wall s':>6}")
    for router in routers:
        for ev in evictors:
            t0 = time.perf_counter()
            res = lp.simulate(inst, policy(ev, router, prior), seed=0)
            s = res.summary()
            print(f"  {router:<18} {ev:<16} {100 * s['prefix_hit_rate']:5.1f}% "
                  f"{s['ttft_s']['p50']:9.2f} {s['ttft_s']['p99']:8.2f} "
                  f"{saved_prefill_s(res, tr, cost):11.1f} "
                  f"{100 * res.stats['kv_utilization']:6.1f}% {s['n_finished']:5d} "
                  f"{time.perf_counter() - t0:6.0f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="5,6,7")
    ap.add_argument("--replicas-concurrency", default="20,24")
    ap.add_argument("--horizon-s", type=float, default=1800.0)
    ap.add_argument("--evictors", default="lru,ttl-pin,return-knapsack")
    ap.add_argument("--routers", default="least-outstanding,prefix-affinity")
    a = ap.parse_args()
    fit, held = split(load_sessions(), 0.5, seed=0)
    prior = fit_wait_stats(cf.block_accesses(compose(fit, rate_per_s=1 / 60, seed=1,
                                                     horizon_s=5400.0)))
    evs = a.evictors.split(",")
    for K in (int(x) for x in a.concurrency.split(",") if x):
        run(held, prior, K, 1, a.horizon_s, evs, ["round-robin"])
    for K in (int(x) for x in a.replicas_concurrency.split(",") if x):
        run(held, prior, K, 4, a.horizon_s, evs, a.routers.split(","))


if __name__ == "__main__":
    main()
