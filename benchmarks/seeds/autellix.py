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
2. how PLAS preempts: with swap (the registered policy), recompute or no preemption, the
   share of busy time spent on swaps (the simulator prices a swap inside the next
   iteration, serially; the transfer engine that overlaps it with compute is not used);
3. throughput at equal latency: the highest program rate at which FCFS's and PLAS's
   (ATLAS's on trees) mean program token latency stays within ``--latency`` s/token
   (default 0.1), and the ratio;
4. multi-engine: ATLAS on 4 engines behind round robin, least-used (fewest outstanding
   calls) and Autellix's load balancer (``autellix-lb``: calls of at most 2,048 prompt
   tokens to the least-used engine, longer ones to their program's engine);
5. the claims table.

Run: ``python benchmarks/seeds/autellix.py [--programs 800] [--seed 0]`` (about 30 minutes
on a loaded 2-core machine).
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
#: V0 without chunked prefill schedules whole prompts: its token budget is the context
ENGINE = {"max_num_batched_tokens": 8192}
WORKLOADS: dict[str, Callable[..., lp.Trace]] = {
    "sharegpt": P.sharegpt_programs, "bfcl": P.react_programs, "lats": P.lats_programs,
    "mixed": P.mixed_programs}
#: programs per run as a share of ``--programs`` (LATS programs have ~160 calls each) and
#: the program rate at which FCFS on one A100 queues (programs/s)
SCALE = {"sharegpt": 1.0, "bfcl": 1.0, "lats": 0.075, "mixed": 0.15}
RATE = {"sharegpt": 8.0, "bfcl": 24.0, "lats": 2.0, "mixed": 2.0}


def programs(kind: str, n: int, rate: float, seed: int) -> lp.Trace:
    """``n`` (scaled per kind) programs of ``kind`` arriving at ``rate`` per second."""
    return WORKLOADS[kind](max(int(round(n * SCALE[kind])), 4), rate, seed=seed)


def policy(name: str, **kw) -> lp.Policy:
    """A registered scheduler on the V0 engine with a context-length token budget."""
    return lp.make_policy(name, **{**ENGINE, **kw})


def run(trace: lp.Trace, pol: lp.Policy, replicas: int = 1, seed: int = 0) -> lp.sim.Result:
    """Simulate ``pol`` on ``trace`` on ``replicas`` A100s."""
    inst = lp.Instance(trace=trace, cluster=lp.Cluster(gpu=GPU, llm=LLM, replicas=replicas))
    return lp.simulate(inst, pol, seed=seed)


def latency_of(res: lp.sim.Result, trace: lp.Trace) -> float:
    """Mean program-level token latency (s/token); inf when a program does not finish."""
    a = res.arrays
    lat = obj.program_token_latency_s(arrival_s=a["arrival_s"], finish_s=a["finish_s"],
                                      output_tokens=a["output_tokens"],
                                      program_id=trace.program_id, parent=trace.parent)
    return float(np.mean(lat)) if np.all(np.isfinite(lat)) else float("inf")


def latency(trace: lp.Trace, name: str | lp.Policy, replicas: int = 1, seed: int = 0) -> float:
    """:func:`latency_of` a run of ``name`` (a registered scheduler or a Policy)."""
    pol = policy(name) if isinstance(name, str) else name
    return latency_of(run(trace, pol, replicas, seed), trace)


def capacity(kind: str, name: str, n: int, target_s: float, seed: int) -> float:
    """Highest program rate with mean program token latency <= ``target_s``."""
    base = programs(kind, n, 1.0, seed)

    def ok(rate: float) -> bool:
        return latency(base.scale_rate(rate), name, seed=seed) <= target_s

    hi = 2.0 * RATE[kind]
    return C.max_rate(ok, hi / 32, hi, 0.1)


def preemption_isolation(n: int, seed: int) -> dict[str, dict[str, float]]:
    """PLAS on ShareGPT programs with priority preemption by swap (the registered
    policy), by recompute, and without preemption (ranks order admission only): program
    token latency, preemptions and the share of busy time spent on swaps."""
    tr = programs("sharegpt", n, RATE["sharegpt"], seed)
    out = {}
    for label, kw in (("fcfs", None), ("plas, swap", {}),
                      ("plas, recompute", {"preemption": "recompute"}),
                      ("plas, no preemption", {"priority_preemption": False})):
        res = run(tr, policy("vllm-v0") if kw is None else policy("plas", **kw), seed=seed)
        st = res.stats
        out[label] = {"latency": latency_of(res, tr),
                      "preemptions": float(res.summary()["preemptions"]),
                      "swap_share": st["swap_wait_s"] / st["busy_s"] if st["busy_s"] else 0.0}
    return out


def multi_engine(n: int, seed: int) -> dict[str, float]:
    """ATLAS on 4 engines behind three routers, mixed programs at 4x one engine's rate."""
    tr = programs("mixed", 4 * n, 4 * RATE["mixed"], seed)
    return {r: latency(tr, policy("atlas", router=r).with_(name=f"atlas+{r}"), replicas=4,
                       seed=seed)
            for r in ("round-robin", "least-outstanding", "autellix-lb")}


def main(argv: list[str] | None = None) -> dict:
    """Print the tables; returns the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=800)
    ap.add_argument("--latency", type=float, default=0.1,
                    help="program token latency (s/token) at which throughput is compared")
    ap.add_argument("--workloads", default="sharegpt,bfcl,lats,mixed")
    ap.add_argument("--capacity", default="sharegpt,mixed",
                    help="workloads of the throughput-at-equal-latency table")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    kinds = args.workloads.split(",")
    print(f"Autellix seed: {LLM} on one {GPU}, vLLM V0 engine (token budget 8192, 256 "
          "sequences), Poisson program arrivals")
    lat: dict[str, dict[str, float]] = {}
    print("\n## mean program-level token latency (s/token); over FCFS in brackets")
    for kind in kinds:
        tr = programs(kind, args.programs, RATE[kind], args.seed)
        st = P.program_stats(tr)
        row = lat[kind] = {p: latency(tr, p, seed=args.seed) for p in POLICIES}
        print(f"{kind:<9} {st['programs']:.0f} programs at {RATE[kind]}/s, "
              f"{st['calls_per_program']:.2f} calls, prefill {st['prefill']:.0f} / decode "
              f"{st['decode']:.0f}: " + "  ".join(
                  f"{p} {row[p]:.4f} ({row[p] / row['vllm-v0']:.2f})" for p in POLICIES))
    iso = preemption_isolation(args.programs, args.seed)
    print(f"\n## ShareGPT programs at {RATE['sharegpt']}/s: how PLAS preempts")
    for label, d in iso.items():
        print(f"  {label:<22} latency {d['latency']:.4f}  preemptions {d['preemptions']:>7.0f}"
              f"  swap share of busy time {d['swap_share']:.3f}")
    cap = {}
    print(f"\n## throughput at equal latency (programs/s at mean token latency <= "
          f"{args.latency} s/token)")
    for kind in [k for k in args.capacity.split(",") if k]:
        best = "atlas" if kind in ("lats", "mixed") else "plas"
        cap[kind] = {p: capacity(kind, p, args.programs, args.latency, args.seed)
                     for p in ("vllm-v0", best)}
        c = cap[kind]
        print(f"{kind:<9} fcfs {c['vllm-v0']:.3f}  {best} {c[best]:.3f}  "
              f"x{c[best] / max(c['vllm-v0'], 1e-9):.2f}")
    me = multi_engine(args.programs, args.seed)
    print(f"\n## 4 engines, mixed programs at {4 * RATE['mixed']}/s, ATLAS: mean program "
          "token latency (s/token)")
    for r, v in me.items():
        print(f"  {r:<18} {v:.4f}")
    rows = []
    for kind in kinds:
        row = lat[kind]
        best = "atlas" if kind in ("lats", "mixed") else "plas"
        order = row[best] <= row["mlfq"] and row["mlfq"] <= row["vllm-v0"]
        paper = {"sharegpt": "<= 8x", "bfcl": "<= 8x", "lats": "<= 5x", "mixed": "<= 15x"}
        rows.append((f"{kind}: {best} <= MLFQ <= FCFS; FCFS / {best}", paper[kind],
                     row["vllm-v0"] / row[best], None, C.verdict(order)))
    for kind, c in cap.items():
        best = [p for p in c if p != "vllm-v0"][0]
        r = c[best] / max(c["vllm-v0"], 1e-9)
        rows.append((f"{kind}: throughput at equal latency, {best} / FCFS", "4-15x", r, None,
                     C.verdict(r > 1.0, 4.0 <= r <= 15.0)))
    lb = min(me["round-robin"], me["least-outstanding"]) / me["autellix-lb"]
    rows.append(("4 engines: best of RR / least-used over autellix-lb", "<= 1.4x", lb, None,
                 C.verdict(lb >= 1.0)))
    C.claims_table("Autellix: claims", rows)
    print(f"\nwall {time.perf_counter() - t0:.0f} s")
    return {"latency": lat, "isolation": iso, "capacity": cap, "multi_engine": me}


if __name__ == "__main__":
    main()
