"""FastServe's proactive swapping when host memory fills: who drops, parks and swaps.

``fastserve`` (skip-join MLFQ, proactive swapping on the overlapped host link) on the
bundled Mooncake conversation trace, 4 x H100 / Llama-3-8B, ``max_num_batched_tokens``
131072 (the longest prompt is 121,924 tokens), history predictor, at a utilisation of the
fluid capacity estimate. Prints, per replica, its clock, waiting requests, swap-outs,
recomputes (KV dropped to recompute, by proactive swapping, memory pressure or reactive
preemption) and free host blocks, and the run's totals (``models/simulator.md`` (30),
"Host room"). ``--wall`` stops a run that thrashes and prints the state it reached (a
SIGALRM, so POSIX only).

    python benchmarks/fastserve_host_room.py --utilization 0.75 --wall 300
"""
from __future__ import annotations

import argparse
import signal
import time

import numpy as np


def main() -> None:
    """Run the case and print the counts (see the module docstring)."""
    import lpserve as lp
    from lpserve.evaluate.utilization import fluid_capacity
    from lpserve.policies.predictors import make_predictor
    from lpserve.sim.engine import Simulation
    from lpserve.sim.state import FINISHED
    from lpserve.trace.loaders import load_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--utilization", type=float, default=0.75)
    ap.add_argument("--requests", type=int, default=0, help="first N requests (0: all)")
    ap.add_argument("--wall", type=int, default=300, help="stop after this many seconds")
    args = ap.parse_args()

    tr = load_trace("mooncake-conv-5min")
    cl = lp.Cluster(gpu="h100-sxm", llm="llama-3-8b", replicas=4)
    tr = tr.scale_rate(fluid_capacity(lp.Instance(trace=tr, cluster=cl))
                       .load_for(args.utilization))
    if args.requests:
        tr = tr.take(np.arange(min(args.requests, len(tr))))
    sim = Simulation(lp.Instance(trace=tr, cluster=cl),
                     lp.make_policy("fastserve", max_num_batched_tokens=131072), 0,
                     predictor=make_predictor("history"))
    def report(tag: str) -> None:
        done = int(np.count_nonzero(sim.state.status == FINISHED))
        print(f"{tag} after {time.perf_counter() - t0:.1f} s wall; finished "
              f"{done} of {len(tr)} requests")
        print(" replica  clock_s  waiting  running  swap-outs  recomputes  host_free_blocks")
        for r in sim.front:
            print(f" {r.index:7d} {r.now:8.1f} {len(r.waiting):8d} {len(r.running):8d} "
                  f"{r.n_swaps:10d} {r.n_recomputes:11d} {r.host_free:17d}")
        print(f" total swap-outs {sum(r.n_swaps for r in sim.front)}, recomputes "
              f"{sum(r.n_recomputes for r in sim.front)}")

    def stop(*_):
        report("stopped")
        raise SystemExit(0)

    signal.signal(signal.SIGALRM, stop)
    t0 = time.perf_counter()
    signal.alarm(args.wall)
    sim.run()
    signal.alarm(0)
    report("done")


if __name__ == "__main__":
    main()
