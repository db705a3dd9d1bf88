"""Swap vs compress-and-swap vs recompute as PCIe bandwidth falls: the tipping point.

Workload: the first ``--requests`` requests of the bundled Azure conversation trace at
``--rate`` requests/s, Llama-2-7B on one A100-80GB with a small KV pool
(``gpu_memory_fraction=0.22``: 646 blocks of 16 tokens) and 64 GB of host memory, so
preemption is frequent. Two preempting engines:

* ``vllm``: FCFS, preempts (reactively) only when KV memory runs out;
* ``fastserve``: skip-join MLFQ with priority preemption, which swaps lower-priority
  running requests out whenever a better-ranked one waits (FastServe's proactive swapping).

Each runs with recompute, swap, compress-swap (``compression_ratio=4``: FP16 KV to INT4)
and the cost-based per-victim decider (``vllm-preempt-decider``'s rule; ``decider`` with
no swap budget, so it prefers a full swap whenever that beats recompute, and
``decider-b0`` with ``swap_budget_s=0``, so it never swaps at full size), while the PCIe
bandwidth is swept through the cost model's ``pcie_efficiency`` (one-way GB/s = 32 x
efficiency on the A100). Printed per bandwidth: mean and p99 end-to-end latency (s) and
the share of busy time the replica spent on swaps (PCIe and (de)quantize,
models/kv-compression-swap.md (1), (4)).

The tipping point of a mode is the bandwidth below which its mean latency exceeds
recompute's (log-linear interpolation between sweep points); the model's per-victim
prediction (7) for a victim of the mean compressed-victim context is printed beside it.
Swaps are charged to the next iteration as vLLM V0 (``--transfers serial``, the default
``EngineConfig.transfers``); ``--transfers overlap`` runs them on the host link overlapping
compute, ``fastserve`` then swapping proactively, and the swap share is the share of busy
time spent on (de)quantize passes only. Overlapped fastserve still collapses at low
bandwidth (MLFQ's starvation promotion; ``models/simulator.md``, "Why serial is the
default"): its low-bandwidth rows are slow.

Run: ``python benchmarks/swap_tipping_point.py [--requests 200] [--rate 1.0]``.
"""
from __future__ import annotations

import argparse
import math
import time

import lpserve as lp
from lpserve.cost.preemption import tipping_bandwidth_gbps
from lpserve.policies.kvcompress import CostBasedDecider

EFFS = (1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01, 0.005)
MODES = ("swap", "compress-swap", "decider", "decider-b0")
RATIO = 4.0
GPU, LLM = "a100-80gb", "llama-2-7b"


def instance(trace: lp.Trace, eff: float) -> lp.Instance:
    cost = lp.cost_model(gpu=GPU, llm=LLM, pcie_efficiency=eff)
    return lp.Instance(trace=trace, cost=cost, cluster=lp.Cluster(
        gpu=GPU, llm=LLM, gpu_memory_fraction=0.22, host_memory_gb=64.0))


TRANSFERS = {"transfers": "serial"}


def run(inst: lp.Instance, name: str, mode: str) -> dict:
    kw = dict(compression_ratio=RATIO, **TRANSFERS)
    if TRANSFERS["transfers"] == "serial" and name.startswith("fastserve"):
        kw["proactive_swap"] = False
    if mode.startswith("decider"):
        budget = 0.0 if mode == "decider-b0" else math.inf
        kw["preemption_decider"] = CostBasedDecider(swap_budget_s=budget)
    else:
        kw["preemption"] = mode
    r = lp.simulate(inst, lp.make_policy(name, **kw), seed=0)
    s, st = r.summary(), r.stats
    if s["n_finished"] + s["n_rejected"] != s["n_requests"]:
        raise SystemExit(f"{name}/{mode}: {s['n_unfinished']} requests unfinished")
    return {"mean": s["e2e_s"]["mean"], "p99": s["e2e_s"]["p99"],
            "share": st["swap_wait_s"] / st["busy_s"], "swaps": st["swaps"],
            "comp": st["compressed_swaps"], "ctok": st["compressed_tokens"],
            "pre": s["preemptions"]}


def predicted_gbps(ctx: int, ratio: float | None) -> float:
    """models/kv-compression-swap.md (7): one-way PCIe GB/s at which a victim of ``ctx``
    tokens swaps (out and in) as fast as it recomputes; compressed when ``ratio``."""
    c = lp.cost_model(gpu=GPU, llm=LLM)
    t_rec = c.batch_time_s(prefill_tokens=[ctx])
    kv = c.kv_bytes_per_token  # tp = 1: one GPU holds it all
    if ratio is None:
        return 2 * ctx * kv / t_rec / 1e9
    blocks = -(-ctx // 16)
    t_q = c.kv_quantize_time_s(blocks, 16, ratio)
    return 2 * ctx * kv / (ratio * (t_rec - 2 * t_q)) / 1e9 if t_rec > 2 * t_q else math.inf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=1.0, help="arrival rate (requests/s)")
    ap.add_argument("--transfers", choices=("overlap", "serial"), default="serial")
    args = ap.parse_args()
    TRANSFERS["transfers"] = args.transfers
    t0 = time.perf_counter()
    trace = lp.bundled_trace().head(args.requests).rebased().with_rate(args.rate)
    one_way = lp.cost_model(gpu=GPU, llm=LLM).gpu.pcie_gbps / 2.0
    bw = [one_way * e for e in EFFS]
    print(f"{len(trace)} requests at {args.rate:g}/s, {LLM} on {GPU}, {args.transfers} "
          f"transfers, compression ratio {RATIO:g}; e2e latency (s) mean / p99, swap share "
          "of busy time\n")
    for name in ("vllm-v0", "fastserve"):
        rec = run(instance(trace, 1.0), name, "recompute")
        rows = {m: [run(instance(trace, e), name, m) for e in EFFS] for m in MODES}
        print(f"== {name}: recompute mean {rec['mean']:.2f} p99 {rec['p99']:.2f} "
              f"({rec['pre']} preemptions)")
        print(f"{'PCIe GB/s':>9} | " + " | ".join(f"{m:^27}" for m in MODES))
        for k, b in enumerate(bw):
            cells = [f"{rows[m][k]['mean']:8.2f} {rows[m][k]['p99']:8.2f} "
                     f"{100 * rows[m][k]['share']:5.1f}% {rows[m][k]['swaps']:4d}"
                     for m in MODES]
            print(f"{b:9.2f} | " + " | ".join(cells))
        full = rows["compress-swap"][0]
        ctx = int(round(full["ctok"] / full["comp"])) if full["comp"] else 1024
        tips = {m: tipping_bandwidth_gbps(bw, [r["mean"] for r in rows[m]], rec["mean"])
                for m in ("swap", "compress-swap")}
        pred = {"swap": predicted_gbps(ctx, None), "compress-swap": predicted_gbps(ctx, RATIO)}
        for m in ("swap", "compress-swap"):
            print(f"tipping point {m:>13}: measured {tips[m]:6.2f} GB/s, model (7) for a "
                  f"{ctx}-token victim {pred[m]:6.2f} GB/s")
        if 0 < tips["compress-swap"] < math.inf and 0 < tips["swap"] < math.inf:
            print(f"compression moves it by {tips['swap'] / tips['compress-swap']:.2f}x "
                  f"(model: {pred['swap'] / pred['compress-swap']:.2f}x, ratio {RATIO:g})")
        print()
    print(f"wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
