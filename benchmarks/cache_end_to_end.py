"""KV evictors end to end in the simulator: TTFT beside the replay hit rates.

The shared Mooncake conversation 30-minute slice (``../shared/traces`` beside the checkout,
or ``$LPSERVE_SHARED``; the bundled 5-minute trace otherwise), Llama-3-8B on A100-80GB
replicas with chunked prefill (vLLM defaults otherwise) and a KV budget where the prefix
cache is far smaller than the working set (``--memory-fraction`` of GPU memory: weights
16 GB, the rest KV). Every online evictor runs inside each replica's prefix cache; the
router is cache-aware (``prefix-affinity``, as SGLang's router) or cache-blind
(``least-outstanding``). Printed per evictor: TTFT p50 / p90 / p99 and mean, the token
prefix hit rate in the simulator, recompute preemptions, makespan, and the evictor's hit
rate in the fast replay at the issue's capacity (5,859 blocks of 512 tokens).

Run: ``python benchmarks/cache_end_to_end.py [--replicas 10] [--router prefix-affinity]
[--minutes 30] [--evictors lru,knapsack,...]``.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import lpserve as lp
from lpserve.evaluate.cache import cache_replay
from lpserve.policies.evictors_kv import EVICTORS

SHARED = Path(os.environ.get("LPSERVE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
SLICE = SHARED / "traces" / "mooncake_fast25_conversation_first30min.jsonl.gz"
ALL = [k[3:] for k in EVICTORS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=10)
    ap.add_argument("--router", default="prefix-affinity")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--memory-fraction", type=float, default=0.5)
    ap.add_argument("--evictors", default=",".join(ALL))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    tr = lp.load_trace(SLICE) if SLICE.exists() else lp.bundled_trace("mooncake-conv-5min")
    tr = tr.window(0.0, a.minutes * 60.0)
    print(f"trace {tr.name}: {tr.n} requests over {a.minutes:g} min; Llama-3-8B on "
          f"{a.replicas} x A100-80GB, memory fraction {a.memory_fraction}, router {a.router}")
    cluster = lp.Cluster(gpu="a100-80gb", llm="llama-3-8b", replicas=a.replicas,
                         gpu_memory_fraction=a.memory_fraction)
    print(f"{'evictor':<12}{'TTFT p50':>10}{'p90':>9}{'p99':>9}{'mean':>9}{'sim hit':>9}"
          f"{'preempt':>9}{'makespan':>10}{'replay hit':>12}{'wall':>7}")
    for name in a.evictors.split(","):
        t0 = time.perf_counter()
        pol = lp.make_policy("vllm-chunked", evictor=name, router=a.router)
        res = lp.simulate(lp.Instance(trace=tr, cluster=cluster), pol, seed=a.seed)
        s = res.summary()
        ttft = s["ttft_s"]
        replay = cache_replay(tr, capacity_blocks=5859, policy=name).hit_rate
        print(f"{name:<12}{ttft['p50']:>9.2f}s{ttft['p90']:>8.2f}s{ttft['p99']:>8.2f}s"
              f"{ttft['mean']:>8.2f}s{100 * s['prefix_hit_rate']:>8.1f}%"
              f"{int(np.sum(res.arrays['preemptions'])):>9d}{s['makespan_s']:>9.0f}s"
              f"{100 * replay:>11.2f}%{time.perf_counter() - t0:>6.0f}s", flush=True)


if __name__ == "__main__":
    main()
