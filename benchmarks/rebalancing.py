"""Load rebalancing by live migration: no migration vs the Llumnix freeness heuristic vs
the assignment MILP (models/rebalancing.md), under bursty load that a load-blind router
spreads unevenly.

Cluster: 4 x Llama-2-7B on A100-80GB at gpu_memory_fraction 0.22 (about 10,000 KV
tokens per replica, so KV memory binds), vLLM engine (prefill-first, recompute
preemption). Workloads: a Gamma-renewal trace (CV 3, long LogNormal outputs) and a
window of the bundled Azure conversation trace (requests within Llama-2's 4,096-token
context) with Gamma (CV 3) arrivals. Routers:
round robin and random. Each cell is averaged over ``--seeds`` trace seeds; the
rebalancers decide every 0.5 s of simulated time.

    python benchmarks/rebalancing.py [--requests 600] [--seeds 3] [--rate 6] [--link-gbps G]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.trace import generate as G

POLICIES = {"none": "vllm-v0", "llumnix": "rebalance-llumnix", "assignment-lp": "rebalance-lp"}
COLS = ("ttft_mean_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_mean_s", "preempt",
        "migrations", "migrated_gb", "copy_s", "wall_s")


def workloads(n: int, seed: int, rate_per_s: float) -> dict[str, lp.Trace]:
    arr = G.GammaRenewal(rate_per_s=rate_per_s, cv=3.0)
    synth = G.synthetic(n, arrivals=arr, prompt=G.Uniform(200, 1500),
                        output=G.LogNormal(mean=300, cv=1.5, max_tokens=3000), seed=seed,
                        name="gamma-cv3")
    az = lp.bundled_trace()
    fits = np.flatnonzero(az.prompt_tokens + az.output_tokens <= 4096)  # Llama-2 context
    start = int(np.random.default_rng(seed).integers(0, max(fits.size - n, 1)))
    win = az.take(fits[start:start + n])
    azure = G.with_arrivals(win, G.GammaRenewal(rate_per_s=rate_per_s, cv=3.0),
                            seed=seed)
    return {"gamma-cv3": synth, "azure-conv": azure}


def row(res: lp.Result) -> dict[str, float]:
    s = res.summary()
    return {"ttft_mean_s": s["ttft_s"]["mean"], "ttft_p99_s": s["ttft_s"]["p99"],
            "tpot_p50_s": s["tpot_s"]["p50"], "tpot_p99_s": s["tpot_s"]["p99"],
            "e2e_mean_s": s["e2e_s"]["mean"], "preempt": s["preemptions"],
            "migrations": s.get("migrations", 0), "migrated_gb": s.get("migrated_gb", 0.0),
            "copy_s": res.stats.get("migration_s", 0.0),
            "wall_s": res.stats["wall_s"], "finished": s["n_finished"],
            "requests": s["n_requests"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=6.0, help="mean arrivals per second")
    ap.add_argument("--link-gbps", type=float, default=None,
                    help="replica-to-replica link in GB/s (default: the GPU's NVLink)")
    args = ap.parse_args()
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=4, gpu_memory_fraction=0.22,
                    link_gbps=args.link_gbps)
    t0 = time.perf_counter()
    cells: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for seed in range(args.seeds):
        for wname, trace in workloads(args.requests, seed, args.rate).items():
            inst = lp.Instance(trace=trace, cluster=cl, slo=lp.SLO(ttft_s=1.0, tpot_s=0.1))
            for router in ("round-robin", "random"):
                for label, name in POLICIES.items():
                    res = lp.simulate(inst, lp.make_policy(name, router=router), seed=seed)
                    r = row(res)
                    if r["finished"] != r["requests"]:
                        raise SystemExit(f"{wname}/{router}/{label} seed {seed}: "
                                         f"{r['requests'] - r['finished']} requests did not "
                                         "finish")
                    cells.setdefault((wname, router, label), []).append(r)
    blocks = lp.cost_model(gpu=cl.gpu, llm=cl.llm, tp=cl.tp).kv_capacity_blocks(
        block_tokens=cl.block_tokens, gpu_memory_fraction=cl.gpu_memory_fraction)
    print(f"4 x llama-2-7b on a100-80gb, gpu_memory_fraction {cl.gpu_memory_fraction} "
          f"({blocks} blocks of {cl.block_tokens} tokens per replica), {args.requests} "
          f"requests, link {args.link_gbps or 'NVLink'} GB/s, mean of {args.seeds} seeds")
    head = f"{'workload':<11} {'router':<12} {'policy':<14}" + "".join(
        f"{c:>13}" for c in COLS)
    print(head)
    print("-" * len(head))
    for (w, router, label), rows in cells.items():
        m = {c: float(np.mean([r[c] for r in rows])) for c in COLS}
        print(f"{w:<11} {router:<12} {label:<14}" + "".join(
            f"{m[c]:>13.3f}" if c not in ("preempt", "migrations") else f"{m[c]:>13.1f}"
            for c in COLS))
    print(f"total wall {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
