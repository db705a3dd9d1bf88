"""Autellix (Luo et al., arXiv 2502.13965): program-level scheduling of agentic programs.

Set-up (the paper's section 6): Llama-3.1-8B on one A100-80GB; program workloads generated
to the paper's statistics (:mod:`lpserve.trace.programs`: ShareGPT conversations, BFCL
ReAct agents, LATS trees, and their mix), Poisson program arrivals; the multi-engine
experiment on 4 x Llama-3.1-8B. All schedulers run on vLLM's V0 engine (``vllm-v0``,
Autellix extends vLLM 0.6.1) with priority preemption by swap; ``vllm-v0`` is FCFS.

Metric: program-level token latency (program response time over the output tokens on its
critical path, :func:`lpserve.objectives.program_token_latency_s`), mean over programs.

Tables printed:

1. per workload and program rate: mean program token latency of FCFS, request-level MLFQ,
   PLAS and ATLAS, and each over FCFS;
2. throughput at equal latency: the highest program rate at which each policy's mean
   program token latency stays within ``--latency`` s/token (default 0.1, about four
   decode iterations of this model per token), and the ratio to FCFS;
3. multi-engine: ATLAS on 4 engines behind round robin, least-used (fewest outstanding
   calls) and Autellix's load balancer (``autellix-lb``: calls of at most 2,048 prompt
   tokens to the least-used engine, longer ones to their program's engine);
4. the claims table.

Run: ``python benchmarks/seeds/autellix.py [--programs 80] [--seed 0]``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C

import lpserve as lp
from lpserve import objectives as obj
from lpserve.trace import programs as P

GPU, LLM = "a100-80gb", "llama-3.1-8b"
POLICIES = ("vllm-v0", "mlfq", "plas", "atlas")
WORKLOADS: dict[str, Callable[..., lp.Trace]] = {
    "sharegpt": P.sharegpt_programs, "bfcl": P.react_programs, "lats": P.lats_programs,
    "mixed": P.mixed_programs}
#: programs per run: LATS programs have ~160 calls each
N_PROGRAMS = {"sharegpt": 1.0, "bfcl": 1.0, "lats": 0.1, "mixed": 0.3}


def programs(kind: str, n: int, rate: float, seed: int) -> lp.Trace:
    """``n`` (scaled per kind) programs of ``kind`` arriving at ``rate`` per second."""
    return WORKLOADS[kind](max(int(round(n * N_PROGRAMS[kind])), 4), rate, seed=seed)


def latency(trace: lp.Trace, policy: str | lp.Policy, replicas: int = 1,
            seed: int = 0) -> float:
    """Mean program-level token latency (s/token); inf when a program does not finish."""
    inst = lp.Instance(trace=trace, cluster=lp.Cluster(gpu=GPU, llm=LLM, replicas=replicas))
    pol = lp.make_policy(policy) if isinstance(policy, str) else policy
    a = lp.simulate(inst, pol, seed=seed).arrays
    lat = obj.program_token_latency_s(arrival_s=a["arrival_s"], finish_s=a["finish_s"],
                                      output_tokens=a["output_tokens"],
                                      program_id=trace.program_id, parent=trace.parent)
    return float(np.mean(lat)) if np.all(np.isfinite(lat)) else float("inf")


def rates_for(kind: str) -> tuple[float, ...]:
    """Program rates around one A100's capacity for each workload (programs/s)."""
    return {"sharegpt": (1.0, 2.0), "bfcl": (1.5, 3.0), "lats": (0.04, 0.08),
            "mixed": (0.1, 0.2)}[kind]


def capacity(kind: str, policy: str, n: int, target_s: float, seed: int) -> float:
    """Highest program rate with mean program token latency <= ``target_s``."""
    base = programs(kind, n, 1.0, seed)

    def ok(rate: float) -> bool:
        return latency(base.scale_rate(rate), policy, seed=seed) <= target_s

    hi = 4.0 * rates_for(kind)[-1]
    return C.max_rate(ok, hi / 64, hi, 0.08)


def multi_engine(n: int, rate: float, seed: int) -> dict[str, float]:
    """ATLAS on 4 engines behind three routers, mixed programs."""
    tr = P.mixed_programs(max(n, 8), rate, seed=seed)
    out = {}
    for router in ("round-robin", "least-outstanding", "autellix-lb"):
        pol = lp.make_policy("atlas", router=router).with_(name=f"atlas+{router}")
        out[router] = latency(tr, pol, replicas=4, seed=seed)
    return out


def main(argv: list[str] | None = None) -> dict:
    """Print the tables; returns the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=80)
    ap.add_argument("--latency", type=float, default=0.1,
                    help="program token latency (s/token) at which throughput is compared")
    ap.add_argument("--workloads", default="sharegpt,bfcl,lats,mixed")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    kinds = args.workloads.split(",")
    print(f"Autellix seed: {LLM} on one {GPU}; {args.programs} programs per run (LATS and "
          f"mixed fewer), Poisson program arrivals")
    lat: dict[str, dict[float, dict[str, float]]] = {}
    print("\n## mean program-level token latency (s/token); over FCFS in brackets")
    for kind in kinds:
        st = P.program_stats(programs(kind, args.programs, 1.0, args.seed))
        print(f"{kind}: {st['programs']:.0f} programs, {st['calls_per_program']:.2f} calls "
              f"each, prefill {st['prefill']:.0f} / decode {st['decode']:.0f} tokens per call")
        lat[kind] = {}
        for rate in rates_for(kind):
            tr = programs(kind, args.programs, rate, args.seed)
            row = lat[kind][rate] = {p: latency(tr, p, seed=args.seed) for p in POLICIES}
            f = row["vllm-v0"]
            print(f"  {rate:5.2f}/s " + "  ".join(
                f"{p} {row[p]:.4f} ({row[p] / f:.2f})" for p in POLICIES))
    cap = {}
    print(f"\n## throughput at equal latency (programs/s at mean token latency <= "
          f"{args.latency} s/token)")
    for kind in kinds:
        cap[kind] = {p: capacity(kind, p, args.programs, args.latency, args.seed)
                     for p in POLICIES}
        c = cap[kind]
        print(f"{kind:<9}" + "  ".join(f"{p} {c[p]:.3f} (x{c[p] / max(c['vllm-v0'], 1e-9):.2f})"
                                       for p in POLICIES))
    me_rate = 4 * rates_for("mixed")[-1]
    me = multi_engine(args.programs, me_rate, args.seed)
    print(f"\n## 4 engines, mixed programs at {me_rate:.2f}/s, ATLAS: mean program token "
          "latency (s/token)")
    for r, v in me.items():
        print(f"  {r:<18} {v:.4f}")
    rows = []
    for kind in kinds:
        hi = max(lat[kind])
        row = lat[kind][hi]
        best = "atlas" if kind in ("lats", "mixed") else "plas"
        order = row[best] <= row["mlfq"] * 1.02 and row["mlfq"] <= row["vllm-v0"] * 1.02
        paper = {"sharegpt": "<= 8x FCFS", "bfcl": "<= 8x FCFS", "lats": "5x FCFS",
                 "mixed": "15x FCFS"}[kind]
        rows.append((f"{kind}: {best} <= MLFQ <= FCFS, FCFS / {best} at {hi}/s", paper,
                     row["vllm-v0"] / row[best], None, C.verdict(order)))
        r = cap[kind][best] / max(cap[kind]["vllm-v0"], 1e-9)
        rows.append((f"{kind}: throughput at equal latency, {best} / FCFS", "4-15x", r, None,
                     C.verdict(r > 1.0, 4.0 <= r <= 15.0)))
    lb = min(me["round-robin"], me["least-outstanding"]) / me["autellix-lb"]
    rows.append(("4 engines: best of RR / least-used over autellix-lb", "<= 1.4x", lb, None,
                 C.verdict(lb >= 1.0)))
    C.claims_table("Autellix: claims", rows)
    print(f"\nwall {time.perf_counter() - t0:.0f} s")
    return {"latency": lat, "capacity": cap, "multi_engine": me}


if __name__ == "__main__":
    main()
