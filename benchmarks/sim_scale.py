"""Simulator cost as the workload grows: wall time per request at 1,000 and 100,000
requests, on 1 and on 16 replicas, for each policy with its own defaults.

Vidur's synthetic workload (Poisson arrivals, total tokens ~ U[512, 2048], prefill:decode
3:1, seed 42) at 3 QPS per replica (the rate scales with the replicas), Llama-2-7B on
A100-80GB TP1, SLO TTFT 2 s / TPOT 100 ms (the targets that ``lyapunov`` mirrors);
policies that read predicted lengths (``mcsf``) use the online History predictor. For each
policy and replica count prints the wall time and the wall time
per request at each size, their ratio (linear cost: within 1.5x), and the 100,000-request
wall time on 16 replicas (target: under 5 s). Compilation (numba, first use) is excluded
and printed apart.

    python benchmarks/sim_scale.py [--policies vllm,sarathi,fastserve,lyapunov,mcsf]
        [--small 1000] [--large 100000] [--replicas 1,16]

Exits 1 when a ratio exceeds 1.5 or a 16-replica large run takes 5 s or more.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

POLICIES = "vllm,sarathi,fastserve,lyapunov,mcsf"


def workload(n: int, qps: float):
    """Vidur's synthetic workload of ``n`` requests at ``qps``."""
    import lpserve as lp

    rng = np.random.default_rng(42)
    arrival = np.cumsum(rng.exponential(1.0 / qps, n))
    total = rng.integers(512, 2049, n)
    decode = np.ceil(total / 4.0).astype(np.int64)
    return lp.Trace.from_arrays(arrival_s=arrival - arrival[0],
                                prompt_tokens=total - decode, output_tokens=decode)


def main() -> int:
    import lpserve as lp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--large", type=int, default=100_000)
    ap.add_argument("--replicas", default="1,16")
    ap.add_argument("--qps-per-replica", type=float, default=3.0)
    args = ap.parse_args()
    SLO = lp.SLO(ttft_s=2.0, tpot_s=0.1)
    reps = [int(r) for r in args.replicas.split(",")]
    ok = True
    print(f"{'policy':<12} {'replicas':>8} {'wall s (small)':>14} {'wall s (large)':>14} "
          f"{'us/req small':>12} {'us/req large':>12} {'ratio':>6} {'compile s':>9}  engine")
    for name in args.policies.split(","):
        for r in reps:
            cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", tp=1, replicas=r)
            qps = args.qps_per_replica * r
            t0 = time.perf_counter()
            # policies that read predicted lengths get lpserve's online History predictor
            kw = {"predictor": "history"} if lp.make_policy(name).reads_predictions else {}
            lp.simulate(lp.Instance(trace=workload(200, qps), cluster=cl, slo=SLO), name, **kw)
            compile_s = time.perf_counter() - t0
            walls = []
            for n in (args.small, args.large):
                inst = lp.Instance(trace=workload(n, qps), cluster=cl, slo=SLO)
                t = time.perf_counter()
                res = lp.simulate(inst, name, **kw)
                walls.append(time.perf_counter() - t)
                s = res.summary()
                if s["n_finished"] != n:
                    print(f"  {name} on {r}: {s['n_finished']} of {n} finished")
            per = [w / n * 1e6 for w, n in zip(walls, (args.small, args.large))]
            ratio = per[1] / per[0]
            bad = ratio > 1.5 or (r == 16 and walls[1] >= 5.0)
            ok &= not bad
            print(f"{name:<12} {r:>8} {walls[0]:>14.3f} {walls[1]:>14.3f} {per[0]:>12.1f} "
                  f"{per[1]:>12.1f} {ratio:>6.2f} {compile_s:>9.2f}  "
                  f"{res.stats['engine']}{'  MISS' if bad else ''}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
