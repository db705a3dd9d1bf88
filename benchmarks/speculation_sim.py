"""Speculative decoding inside the simulator: throughput and TPOT by load and decider.

Llama-2-70B on 4 x A100-80GB (TP4) with vLLM's engine, drafted by Llama-2-7B (TP4 on the
same GPUs; its weights and KV share shrink the KV pool, models/speculative-decoding.md
(1)-(3)). The first requests of the bundled Azure conversation trace (real prompt and
output lengths; prompts within vLLM's 4096-token budget) are split at random into two
request classes (tenants) with per-token acceptance rates 0.8 and 0.4, and replayed at
several arrival rates. Deciders: no draft at all (``off``), the draft loaded but never
used (``never``: no draft prefill either, eq. (4)), fixed k = 2 and k = 4, UCB1 per
(class, batch bucket) over k in 0..4, optimistic per-tenant acceptance rates plugged into
the step's tokens/s (``acc-ucb``, eq. (12)), and the clairvoyant per-step oracle over the
same arms; all but ``off`` and ``never`` pay the draft's prefill. Printed per load and
decider: output tokens/s (generated tokens of the run over its makespan), TPOT p50 and
p99, mean end-to-end latency, mean tokens per sequence per step and the share of steps
that speculated.

Usage: python benchmarks/speculation_sim.py [--requests 500] [--loads 0.25,1,2,4] [--seed 0]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.policies.speculation import (
    AcceptanceUCBSpeculation,
    FixedSpeculation,
    NeverSpeculate,
    OracleSpeculation,
    UCBSpeculation,
)

TARGET, DRAFT, GPU, TP = "llama-2-70b", "llama-2-7b", "a100-80gb", 4
RATES = {0: 0.8, 1: 0.4}  # tenant -> per-token acceptance rate
MAX_K = 4


def deciders() -> dict[str, object]:
    return {
        "off": None,
        "never": NeverSpeculate(DRAFT, RATES),
        "fixed k=2": FixedSpeculation(2, DRAFT, RATES),
        "fixed k=4": FixedSpeculation(4, DRAFT, RATES),
        "ucb": UCBSpeculation(DRAFT, RATES, max_k=MAX_K),
        "acc-ucb": AcceptanceUCBSpeculation(DRAFT, RATES, max_k=MAX_K),
        "oracle": OracleSpeculation(DRAFT, RATES, max_k=MAX_K),
    }


def workload(n_requests: int, seed: int) -> lp.Trace:
    tr = lp.bundled_trace()
    tr = tr.take(np.flatnonzero(tr.prompt_tokens <= 4096)[:n_requests])  # vLLM's token budget
    tenant = np.random.default_rng(seed).integers(0, 2, len(tr))
    return lp.Trace.from_arrays(arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                                output_tokens=tr.output_tokens, tenant=tenant,
                                name=f"azure-conv-{n_requests}-two-classes")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--loads", default="0.25,1,2,4", help="arrival rates (requests/s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    base = workload(args.requests, args.seed)
    cluster = lp.Cluster(gpu=GPU, llm=TARGET, tp=TP, replicas=1)
    print(f"{TARGET} TP{TP} on {GPU}, draft {DRAFT}; {len(base)} Azure conversation requests, "
          f"acceptance {RATES} by tenant; seed {args.seed}")
    for rate in [float(x) for x in args.loads.split(",")]:
        inst = lp.Instance(trace=base.with_rate(rate), cluster=cluster)
        print(f"\narrival rate {rate:g} req/s")
        print(f"{'decider':<10} {'tok/s':>8} {'TPOT p50':>9} {'TPOT p99':>9} {'mean E2E':>9} "
              f"{'tok/step':>8} {'spec':>5} {'blocks':>7} {'wall':>6}")
        for name, dec in deciders().items():
            pol = lp.make_policy("vllm-v0", speculation=dec)
            t0 = time.perf_counter()
            res = lp.simulate(inst, pol, seed=args.seed)
            wall = time.perf_counter() - t0
            a, s = res.arrays, res.summary()
            span = float(np.nanmax(a["finish_s"]) - a["arrival_s"].min())
            tok_s = float(a["generated_tokens"].sum()) / span
            sp = res.stats.get("speculation")
            per_step = sp["tokens_per_sequence_step"] if sp else 1.0
            share = sp["speculative_steps"] / sp["steps"] if sp and sp["steps"] else 0.0
            print(f"{name:<10} {tok_s:8.1f} {s['tpot_s']['p50'] * 1e3:7.1f}ms "
                  f"{s['tpot_s']['p99'] * 1e3:7.1f}ms {s['e2e_s']['mean']:8.2f}s "
                  f"{per_step:8.2f} {share:5.2f} {res.stats['total_blocks']:7d} {wall:5.1f}s")
            if s["n_finished"] != len(base):
                print(f"  ({len(base) - s['n_finished']} unfinished: {s['reasons']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
