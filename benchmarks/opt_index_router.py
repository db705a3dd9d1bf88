"""Decision latency of the exported dual-price index routers (target p99 <= 50 us per
request), with the fluid-split router beside them.

The fluid routers are exported from the fluid LP of the bundled trace on 4 and 32
replicas; the locality router (``lp-locality``, ``models/routing-lp.md`` (18)) from the
routing-locality LP of the bundled Mooncake slice on 16 heterogeneous replicas (4 H100,
4 A100-80GB at TP 2, 8 A100-40GB). Each call routes one arriving request given a view with
live replica state, the cached tokens of the prompt on every replica and the pending
prefill tokens; the view is built before the clock starts (the simulator builds it), the
first access of its fields inside ``route`` is timed.

    python benchmarks/opt_index_router.py [--calls 20000] [--clock wall|thread]
        [--fields timed|materialized]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.opt import solve
from lpserve.opt.routing_locality import export_locality
from lpserve.opt.routing_lp import export_fluid
from lpserve.policy import RouterView


def views(trace: lp.Trace, R: int, calls: int, rng: np.random.Generator):
    """``calls`` router views, each built when the caller asks for the next one (as the
    simulator builds a view just before it routes), so its arrays are as fresh in the
    CPU's caches as in a simulation."""
    n = len(trace.arrival_s)
    for q in range(calls):
        i = q % n
        occ = rng.integers(0, 50, R)
        P = int(trace.prompt_tokens[i])
        yield RouterView(
            now_s=float(trace.arrival_s[i]), n_replicas=R, phase="colocated",
            request=np.array([i]), arrival_s=trace.arrival_s[i:i + 1],
            prompt_tokens=trace.prompt_tokens[i:i + 1], tenant=np.array([-1]),
            session_id=np.array([-1]), predicted_lo=None, predicted_hi=None,
            output_tokens=None, block_keys=(),
            replica_state={"outstanding": occ, "waiting": occ // 2, "running": occ - occ // 2,
                           "used_blocks": occ * 10, "total_blocks": np.full(R, 10_000)},
            cached_tokens=(rng.uniform(0, 1, (1, R)) * P).astype(np.int64) // 16 * 16,
            load_state={"prefill_tokens": occ * 2000, "cached_blocks": occ * 40})


def materialize(v: RouterView) -> None:
    """Read the view fields the routers use, so their first access is not timed."""
    v.outstanding, v.running, v.used_blocks, v.cached_tokens, v.prefill_tokens
    v.prompt_tokens, v.predicted_lo, v.predicted_hi, v.max_prompt_tokens


def timed(router, vs, calls: int, clock=time.perf_counter_ns,
          fields: str = "timed") -> np.ndarray:
    """Microseconds per ``route`` call for ``calls`` views of the iterator ``vs``, after
    200 warm-up calls, read on ``clock`` (ns); ``fields="materialized"`` reads the view's
    fields before the clock starts."""
    for _ in range(200):                     # warm-up (numba compiles on first use)
        router.route(next(vs))
    lat = np.empty(calls)
    for q in range(calls):
        v = next(vs)
        if fields == "materialized":
            materialize(v)
        t0 = clock()
        router.route(v)
        lat[q] = (clock() - t0) / 1e3
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="wall: perf_counter (the figure); thread: this thread's CPU time, "
                         "which leaves out time the process waits for a core (a shared "
                         "machine's preemptions), not a substitute for the wall figure")
    ap.add_argument("--fields", choices=("timed", "materialized"), default="timed",
                    help="timed: the first access of the view's fields counts (default); "
                         "materialized: they are read before the clock starts (the "
                         "router's own work, as in routing_kv_aware.py)")
    args = ap.parse_args()
    clock = time.perf_counter_ns if args.clock == "wall" else time.thread_time_ns
    trace = lp.bundled_trace()
    for R in (4, 32):
        inst = lp.Instance(trace=trace, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                           replicas=R))
        sol = solve("routing-fluid", inst, rate_scale=R / 4)
        for kind in ("index", "split"):
            router = export_fluid(sol, inst, kind=kind)
            router.reset(inst.cluster, np.random.default_rng(0))
            lat = timed(router, views(trace, R, args.calls + 200, np.random.default_rng(2)),
                        args.calls, clock, args.fields)
            print(f"FIGURE {router.name} R={R}: p50 {np.percentile(lat, 50):.1f} us, "
                  f"p99 {np.percentile(lat, 99):.1f} us per request, {args.clock} clock, "
                  f"fields {args.fields} "
                  "(target p99 <= 50 us)")
    moon = lp.bundled_trace("mooncake-conv-5min")
    cl = lp.Cluster.mixed(llm="llama-3-8b", groups=[("h100-sxm", 4), ("a100-80gb", 4, 2),
                                                    ("a100-40gb", 8)])
    inst = lp.Instance(trace=moon.scale_rate(2.0), cluster=cl)
    router = export_locality(solve("routing-locality", inst), inst, chunk_tokens=8192)
    router.reset(cl, np.random.default_rng(0))
    lat = timed(router, views(moon, 16, args.calls + 200, np.random.default_rng(3)),
                args.calls, clock, args.fields)
    print(f"FIGURE {router.name} R=16 (mixed): p50 {np.percentile(lat, 50):.1f} us, "
          f"p99 {np.percentile(lat, 99):.1f} us per request, {args.clock} clock, "
          f"fields {args.fields} "
          "(target p99 <= 50 us)")


if __name__ == "__main__":
    main()
