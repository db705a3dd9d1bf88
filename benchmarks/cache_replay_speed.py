"""Speed of the KV cache replay and of the prefix LP / FOO-L bounds.

Prints replay throughput (block accesses per second) per evictor and the wall time of the
bounds on the shared Mooncake 30-minute slice (the bundled 5-minute trace if absent), then
the session-aware evictors' throughput on composed kv-cache-tester sessions (the first 120
sessions of the shared file, Poisson starts at 1/60 s, 90 minutes; the bundled slice if
absent) at 10,000 blocks, with the prefix LP on segments. Throughput is given per
wall-clock second and per CPU-second of the process (the latter is what a shared machine
can still measure).
Run: python benchmarks/cache_replay_speed.py
"""
from __future__ import annotations

import time
from pathlib import Path

import lpserve as lp
from lpserve.evaluate.cache import replay_accesses
from lpserve.opt import cache_flow as cf
from lpserve.opt import cache_segments as cs
from lpserve.trace.loaders import bundled_sessions, read_sessions
from lpserve.trace.sessions import compose

SLICE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake_fast25_conversation_first30min.jsonl.gz"
C = 5859

trace = lp.load_trace(SLICE) if SLICE.exists() else lp.bundled_trace("mooncake-conv-5min")
acc = cf.block_accesses(trace)
for name in ("lru", "radix-lru", "lfu", "gdsf", "knapsack", "belady", "ttl-pin",
             "reuse-decay", "tail-lru", "return-knapsack"):
    replay_accesses(acc, C, name)  # compile
    t0, c0 = time.perf_counter(), time.process_time()
    r = replay_accesses(acc, C, name)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print(f"replay {name:<15} {acc.n_accesses / dt / 1e6:8.2f} M accesses/s "
          f"({acc.n_accesses / dc / 1e6:.2f} per CPU-second)  hit rate {100 * r.hit_rate:.2f} %")
t0 = time.perf_counter()
sol = cf.solve(cf.build(acc, C))
print(f"prefix LP  {time.perf_counter() - t0:6.2f} s  UB {100 * sol.info['hit_rate_lp']:.2f} %  "
      f"rounded {100 * sol.info['hit_rate_rounded']:.2f} %")
t0 = time.perf_counter()
foo = cf.foo(acc.request, acc.key, [1] * acc.n_accesses, [1] * acc.n_accesses, C)
print(f"FOO-L (HiGHS) {time.perf_counter() - t0:6.2f} s  status {foo.status}")

SESSIONS = SLICE.parent / "kv_cache_tester_sessions_part1.jsonl.gz"
sess = (read_sessions(SESSIONS, indices=range(120)) if SESSIONS.exists()
        else bundled_sessions())
tr = compose(sess, rate_per_s=1 / 60, seed=0, horizon_s=5400.0)
acc = cf.block_accesses(tr)
print(f"composed sessions: {tr.n} requests, {acc.n_accesses} block accesses")
for name in ("lru", "ttl-pin", "reuse-decay", "tail-lru", "return-knapsack", "belady-prefix"):
    replay_accesses(acc, 10_000, name)  # compile
    t0, c0 = time.perf_counter(), time.process_time()
    r = replay_accesses(acc, 10_000, name)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print(f"replay {name:<15} {acc.n_accesses / dt / 1e6:8.2f} M accesses/s "
          f"({acc.n_accesses / dc / 1e6:.2f} per CPU-second)  hit rate {100 * r.hit_rate:.2f} %")
t0 = time.perf_counter()
ub, info = cs.lp_hit_rate(acc, 10_000)
print(f"prefix LP on segments {time.perf_counter() - t0:6.2f} s  UB {100 * ub:.2f} %  "
      f"({info['columns']} columns)")
