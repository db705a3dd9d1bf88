"""Memory a simulation holds per replica and per request, at 1, 100 and 10,000 replicas.

The bundled Azure conversation trace's first ``--requests`` requests (default 20) on
``R`` replicas of Llama-2-7B on A100-80GB, policy ``vllm``. For each ``R`` prints the
bytes one compiled replica holds (its KV block pool and state, ``lpserve.sim.memory``),
the bytes of the run's per-request arrays divided by the requests, the estimate for the
replicas the run can build (a replica is built when a request first reaches it,
``lpserve.sim.vacant``: at most requests + 1), and then runs the simulation in a child
process, reporting the replicas it built, its wall time and peak resident memory, or the
refusal (``MemoryError``: the replicas would not fit in the
memory the machine has available) with its message.

    python benchmarks/memory_per_replica.py [--replicas 1,100,10000] [--requests 20]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, resource, sys, time
    import lpserve as lp
    from lpserve.sim import memory
    from lpserve.sim.engine import Simulation
    R, n = int(sys.argv[1]), int(sys.argv[2])
    trace = lp.bundled_trace().head(n)
    one = lp.Instance(trace=trace, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    sim = Simulation(one, lp.make_policy("vllm"))
    per_replica = memory.replica_bytes(sim.front[0])
    per_request = sum(a.nbytes for a in sim.runset.req_a if hasattr(a, "nbytes")) / n
    out = {"replicas": R, "per_replica_bytes": per_replica, "per_request_bytes": per_request,
           "estimate_bytes": per_replica * min(R, n + 1), "blocks": sim.total_blocks,
           "built": 0}
    inst = one.with_(cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=R))
    t0 = time.perf_counter()
    try:
        run = Simulation(inst, lp.make_policy("vllm"))
        run.run()
        out["built"] = sum(not getattr(r, "vacant", False) for r in run.replicas())
        out["status"] = "ran"
    except MemoryError as exc:
        out["status"] = "refused: " + str(exc)
    out["wall_s"] = time.perf_counter() - t0
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out))
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="1,100,10000")
    ap.add_argument("--requests", type=int, default=20)
    args = ap.parse_args()
    print(f"{'replicas':>9s} {'per replica':>12s} {'per request':>12s} {'estimate':>11s} "
          f"{'built':>6s} {'wall s':>7s} {'peak RSS':>9s}  status")
    for r in [int(x) for x in args.replicas.split(",")]:
        run = subprocess.run([sys.executable, "-c", CHILD, str(r), str(args.requests)],
                             capture_output=True, text=True, timeout=600)
        if run.returncode:
            print(f"{r:9d}  failed: {run.stderr.strip().splitlines()[-1][:200]}")
            continue
        o = json.loads(run.stdout.strip().splitlines()[-1])
        print(f"{r:9,d} {o['per_replica_bytes'] / 2**20:9.2f} MiB {o['per_request_bytes']:8,.0f} B "
              f"{o['estimate_bytes'] / 2**30:7.2f} GiB {o['built']:6,d} {o['wall_s']:7.2f} "
              f"{o['peak_rss_bytes'] / 2**30:5.2f} GiB  {o['status'][:160]}")
    print(f"(pool of {o['blocks']:,} KV blocks per replica; the arrays are sized by the pool "
          "and the run's limits, not by what a replica holds; a replica is built when a "
          "request first reaches it, so the estimate counts at most requests + 1 replicas)")


if __name__ == "__main__":
    main()
