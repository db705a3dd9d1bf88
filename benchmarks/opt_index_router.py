"""Decision latency of the exported dual-price index router (target p99 <= 50 us per
request), with the fluid-split router beside it.

The routers are exported from the fluid LP of the bundled trace on 4 and 32 replicas.
Each call routes one arriving request given a view with live replica state; the view is
built before the clock starts (the simulator builds it), the first access of the replica
state inside ``route`` is timed.

    python benchmarks/opt_index_router.py [--calls 20000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.opt import solve
from lpserve.opt.routing_lp import export_fluid
from lpserve.policy import RouterView


def views(trace: lp.Trace, R: int, calls: int, rng: np.random.Generator) -> list[RouterView]:
    n = len(trace.arrival_s)
    out = []
    for q in range(calls):
        i = q % n
        occ = rng.integers(0, 50, R)
        out.append(RouterView(
            now_s=float(trace.arrival_s[i]), n_replicas=R, phase="colocated",
            request=np.array([i]), arrival_s=trace.arrival_s[i:i + 1],
            prompt_tokens=trace.prompt_tokens[i:i + 1], tenant=np.array([-1]),
            session_id=np.array([-1]), predicted_lo=None, predicted_hi=None,
            output_tokens=None, block_keys=(),
            replica_state={"outstanding": occ, "waiting": occ // 2, "running": occ - occ // 2,
                           "used_blocks": occ * 10, "total_blocks": np.full(R, 10_000)}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20_000)
    args = ap.parse_args()
    trace = lp.bundled_trace()
    for R in (4, 32):
        inst = lp.Instance(trace=trace, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                           replicas=R))
        sol = solve("routing-fluid", inst, rate_scale=R / 4)
        for kind in ("index", "split"):
            router = export_fluid(sol, inst, kind=kind)
            router.reset(inst.cluster, np.random.default_rng(0))
            vs = views(trace, R, args.calls, np.random.default_rng(1))
            for v in vs[:200]:                       # warm-up
                router.route(v)
            vs = views(trace, R, args.calls, np.random.default_rng(2))
            lat = np.empty(len(vs))
            for q, v in enumerate(vs):
                t0 = time.perf_counter_ns()
                router.route(v)
                lat[q] = (time.perf_counter_ns() - t0) / 1e3
            print(f"FIGURE {router.name} R={R}: p50 {np.percentile(lat, 50):.1f} us, "
                  f"p99 {np.percentile(lat, 99):.1f} us per request (target p99 <= 50 us)")


if __name__ == "__main__":
    main()
