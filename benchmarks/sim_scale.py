"""Simulator throughput at scale: 100,000 requests on 16 replicas.

Vidur's synthetic workload (Poisson arrivals, total tokens ~ U[512, 2048], prefill:decode
3:1, seed 42) at 3 QPS per replica, Llama-2-7B on A100-80GB TP1, vLLM scheduler (batch
cap 128, 4096 tokens per batch), round robin. Prints simulated requests per wall second
and decode iterations per wall second (numba compile excluded and reported separately).

    python benchmarks/sim_scale.py [--requests 100000] [--replicas 16] [--policy vllm]

Exits 1 when the run takes 10 s or more.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main() -> int:
    import lpserve as lp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--qps-per-replica", type=float, default=3.0)
    ap.add_argument("--policy", default="vllm-v0")
    args = ap.parse_args()

    def workload(n: int, qps: float):
        rng = np.random.default_rng(42)
        arrival = np.cumsum(rng.exponential(1.0 / qps, n))
        total = rng.integers(512, 2049, n)
        decode = np.ceil(total / 4.0).astype(np.int64)
        return lp.Trace.from_arrays(arrival_s=arrival - arrival[0],
                                    prompt_tokens=total - decode, output_tokens=decode)

    policy = lp.make_policy(args.policy, max_num_seqs=128, max_num_batched_tokens=4096,
                            prefix_caching=False)
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", tp=1, replicas=args.replicas)
    t0 = time.perf_counter()
    lp.simulate(lp.Instance(trace=workload(100, 3.0), cluster=cl), policy)
    compile_s = time.perf_counter() - t0
    inst = lp.Instance(trace=workload(args.requests, args.qps_per_replica * args.replicas),
                       cluster=cl)
    t = time.perf_counter()
    res = lp.simulate(inst, policy)
    wall = time.perf_counter() - t
    s = res.summary()
    it, dit = res.stats["iterations"], res.stats["decode_iterations"]
    print(f"numba compile + warm-up: {compile_s:.2f} s (excluded)")
    print(f"{args.requests:,} requests on {args.replicas} replicas ({args.policy}): "
          f"wall {wall:.2f} s; {args.requests / wall:,.0f} requests/s; "
          f"{dit / wall:,.0f} decode iterations/s ({dit:,} decode of {it:,} iterations); "
          f"finished {s['n_finished']:,}; TTFT p50 {s['ttft_s']['p50'] * 1e3:.1f} ms, "
          f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.2f} ms")
    return 0 if wall < 10.0 else 1


if __name__ == "__main__":
    sys.exit(main())
