"""vLLM's CPU KV offload in the simulator (``EngineConfig.kv_offload_gib``,
``models/simulator.md`` (35)): what a host tier behind the GPU prefix cache buys on
agentic sessions whose contexts outgrow the GPU.

Workload: the held-out half (split seed 0) of the kv-cache-tester sessions (the bundled
43-session slice without ``../shared``) as a closed population of ``K`` concurrent
sessions (``compose(..., concurrent=K, seed=2, dependencies=True)``: each turn is released
when the one it follows has finished), the first ``--horizon-s`` seconds. Cluster:
Llama-3.1-8B on one H100-SXM (TP 1, 90 % of memory for the engine, 16-token blocks);
vLLM V1's engine as registered (``vllm``: decode-first, chunked prefill, async
scheduling), LRU on the GPU; host tiers of ``--gib`` GiB (0: no offload).

Per tier it prints the prompt tokens found on the GPU and in the tier (share of prompt
tokens sent), the blocks loaded and their copy time, TTFT p50 / p99 and mean E2E (s), the
finished requests and the wall time.

Run: ``python benchmarks/cpu_offload.py [--concurrency 6] [--gib 0,16,64,256]
[--horizon-s 900]``.
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
from lpserve.trace.sessions import compose, split

LLM, GPU = "llama-3.1-8b", "h100-sxm"


def run(held, K: int, horizon_s: float, gibs: list[float]) -> None:
    tr = compose(held, concurrent=K, seed=2, horizon_s=horizon_s, dependencies=True,
                 name=f"{K} sessions")
    cl = lp.Cluster(gpu=GPU, llm=LLM, replicas=1, gpu_memory_fraction=0.9)
    inst = lp.Instance(trace=tr, cluster=cl)
    sent = float(np.sum(tr.prompt_tokens))
    print(f"\n{K} concurrent sessions on 1 x {GPU} / {LLM}: {tr.n} requests, prompts p50 "
          f"{np.median(tr.prompt_tokens):.0f} tokens, {sent:,.0f} prompt tokens sent")
    print(f"  {'tier GiB':>8} {'engine':<9} {'GPU hit':>7} {'tier hit':>8} {'loaded':>8} "
          f"{'load s':>7} {'TTFT p50':>8} {'p99':>7} {'E2E mean':>8} {'done':>5} {'wall s':>6}")
    for gib in gibs:
        t0 = time.perf_counter()
        res = lp.simulate(inst, lp.make_policy("vllm", kv_offload_gib=gib), seed=0)
        s, off = res.summary(), res.stats["offload"] or {}
        host = off.get("hit_tokens", 0)
        gpu = float(np.sum(res.arrays["cached_prompt_tokens"])) - host
        print(f"  {gib:8g} {res.stats['engine']:<9} {100 * gpu / sent:6.1f}% "
              f"{100 * host / sent:7.1f}% {off.get('loaded_blocks', 0):8d} "
              f"{off.get('load_s', 0.0):7.2f} {s['ttft_s']['p50']:8.2f} "
              f"{s['ttft_s']['p99']:7.2f} {s['e2e_s']['mean']:8.2f} {s['n_finished']:5d} "
              f"{time.perf_counter() - t0:6.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="6")
    ap.add_argument("--gib", default="0,16,64,256")
    ap.add_argument("--horizon-s", type=float, default=900.0)
    a = ap.parse_args()
    _, held = split(load_sessions(), 0.5, seed=0)
    gibs = [float(x) for x in a.gib.split(",") if x]
    for K in (int(x) for x in a.concurrency.split(",") if x):
        run(held, K, a.horizon_s, gibs)


if __name__ == "__main__":
    main()
