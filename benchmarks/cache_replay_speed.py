"""Speed of the KV cache replay and of the prefix LP / FOO-L bounds.

Prints replay throughput (block accesses per second) per evictor and the wall time of the
bounds on the shared Mooncake 30-minute slice (the bundled 5-minute trace if absent).
Run: python benchmarks/cache_replay_speed.py
"""
from __future__ import annotations

import time
from pathlib import Path

import lpserve as lp
from lpserve.evaluate.cache import replay_accesses
from lpserve.opt import cache_flow as cf

SLICE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake_fast25_conversation_first30min.jsonl.gz"
C = 5859

trace = lp.load_trace(SLICE) if SLICE.exists() else lp.bundled_trace("mooncake-conv-5min")
acc = cf.block_accesses(trace)
for name in ("lru", "radix-lru", "lfu", "gdsf", "knapsack", "belady"):
    replay_accesses(acc, C, name)  # compile
    t0 = time.perf_counter()
    r = replay_accesses(acc, C, name)
    dt = time.perf_counter() - t0
    print(f"replay {name:<10} {acc.n_accesses / dt / 1e6:8.2f} M accesses/s  "
          f"hit rate {100 * r.hit_rate:.2f} %")
t0 = time.perf_counter()
sol = cf.solve(cf.build(acc, C))
print(f"prefix LP  {time.perf_counter() - t0:6.2f} s  UB {100 * sol.info['hit_rate_lp']:.2f} %  "
      f"rounded {100 * sol.info['hit_rate_rounded']:.2f} %")
t0 = time.perf_counter()
foo = cf.foo(acc.request, acc.key, [1] * acc.n_accesses, [1] * acc.n_accesses, C)
print(f"FOO-L (HiGHS) {time.perf_counter() - t0:6.2f} s  status {foo.status}")
