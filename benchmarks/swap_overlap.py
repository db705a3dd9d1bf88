"""Swaps that overlap compute: serial vs overlapped reactive vs proactive swap vs recompute.

Workload (KV-bound, priority preemption): the first ``--requests`` requests of the bundled
Azure conversation trace at ``--rate`` requests/s, Llama-2-7B on one A100-80GB with a small
KV pool (``gpu_memory_fraction=0.22``: 646 blocks of 16 tokens) and 64 GB of host memory,
as ``benchmarks/swap_tipping_point.py``. Each preemptive scheduler runs with:

* ``serial``: ``transfers="serial"``, vLLM V0's blocking swap (copy time added to the
  next iteration);
* ``overlap``: ``transfers="overlap"``, reactive swapping on the host link's copy queue
  (``models/simulator.md`` (26)-(29));
* ``proactive``: overlap plus FastServe's proactive swapping (``proactive_swap=True``, (30));
* ``recompute``: ``preemption="recompute"`` (no copies).

Printed per cell: mean and p99 end-to-end latency (s) and the share of the finished
requests' summed E2E time spent waiting on the link (``stats["link_wait_s"]``: serial
swaps charged to a request's iterations, swap-ins it waited for, iterations stalled for
swap-outs). The serial cells run in reference mode (the compiled engine, which gives the
same per-request results, does not count link waits).

Run: ``python benchmarks/swap_overlap.py [--requests 150] [--rate 2.0]
[--schedulers fastserve,mlfq,las,...]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp

GPU, LLM = "a100-80gb", "llama-2-7b"
SCHEDULERS = ("fastserve", "fastserve-adaptive", "mlfq", "mlfq-predicted", "las",
              "srpt-oracle", "slo-aware")
MODES = ("serial", "overlap", "proactive", "recompute")


def instance(trace: lp.Trace) -> lp.Instance:
    return lp.Instance(trace=trace, cost=lp.cost_model(gpu=GPU, llm=LLM), cluster=lp.Cluster(
        gpu=GPU, llm=LLM, gpu_memory_fraction=0.22, host_memory_gb=64.0))


def run(inst: lp.Instance, name: str, mode: str) -> dict:
    kw = {"serial": dict(transfers="serial", proactive_swap=False),
          "overlap": dict(transfers="overlap", proactive_swap=False),
          "proactive": dict(transfers="overlap", proactive_swap=True),
          "recompute": dict(preemption="recompute", proactive_swap=False)}[mode]
    r = lp.simulate(inst, lp.make_policy(name, **kw), seed=0, reference=mode == "serial")
    s = r.summary()
    if s["n_finished"] + s["n_rejected"] != s["n_requests"]:
        raise SystemExit(f"{name}/{mode}: {s['n_unfinished']} requests unfinished")
    e2e = r.arrays["e2e_s"]
    total = float(np.nansum(e2e))
    wait = r.stats.get("link_wait_s", 0.0)
    return {"mean": s["e2e_s"]["mean"], "p99": s["e2e_s"]["p99"],
            "share": wait / total if total > 0 else 0.0, "swaps": r.stats["swaps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--rate", type=float, default=2.0, help="arrival rate (requests/s)")
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS))
    args = ap.parse_args()
    t0 = time.perf_counter()
    trace = lp.bundled_trace().head(args.requests).rebased().with_rate(args.rate)
    inst = instance(trace)
    print(f"{len(trace)} requests at {args.rate:g}/s, {LLM} on {GPU}, 646 KV blocks; "
          f"E2E mean / p99 (s), share of E2E waiting on the link, swaps\n")
    print(f"{'scheduler':>18} | " + " | ".join(f"{m:^28}" for m in MODES))
    for name in args.schedulers.split(","):
        cells = []
        for m in MODES:
            x = run(inst, name, m)
            cells.append(f"{x['mean']:7.2f} {x['p99']:7.2f} {100 * x['share']:5.1f}% "
                         f"{x['swaps']:5d}")
        print(f"{name:>18} | " + " | ".join(cells), flush=True)
    print(f"\nwall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
