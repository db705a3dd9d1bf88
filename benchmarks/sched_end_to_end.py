"""Competitive schedulers end to end in the simulator.

Tables printed:

1. Azure conversation trace (bundled; ``../shared/traces`` beside the checkout when present), Llama-2-70B on
   2 x A100-80GB (TP2), one replica, at a moderate and a high load: mean and p99 end-to-end
   latency of every scheduler, its ratio to vLLM FCFS and to the cost-model lower bound
   (``lpserve.opt.lower_bounds``, a bound on total latency, shown per request), and
   goodput (requests per second meeting TTFT <= 2 s and TPOT <= 0.2 s).
2. FastServe-style skip-join MLFQ against vLLM FCFS as the load rises.
3. A generated agentic workload (``lp.generate.agentic_programs``): program latency (last
   call's finish minus the program's start) under PLAS, ATLAS, PLAS x MLFQ and
   request-level MLFQ and FCFS.

Predicted intervals come from ``lpserve.policies.predictors`` through ``simulate(predictor=...)``:
``IntervalClasses(alpha=0.5)`` (the truth always inside) for MC-SF, A_max, A_min,
SJF-predicted, skip-join on predicted service and the SLO-aware scheduler.

Run: ``python benchmarks/sched_end_to_end.py [--requests 300] [--seed 0]``.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import lpserve as lp
from lpserve.opt import lower_bounds as LB
from lpserve.policies.predictors import IntervalClasses
from lpserve.trace import generate as G

SCHEDULERS = ["vllm-v0", "sjf-oracle", "srpt-oracle", "sjf-predicted", "las", "rr-sched",
              "mlfq", "fastserve", "mlfq-predicted", "fastserve-adaptive", "mcsf",
              "mcsf-oracle", "a-max", "a-min", "slo-aware", "plas", "atlas", "plas-mlfq"]
PREDICTED = {"sjf-predicted", "mcsf", "a-max", "a-min", "slo-aware", "mlfq-predicted"}
SHARED = Path(os.environ.get("LPSERVE_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "traces" / "azure_llm_2023_conv_first30min.csv.gz"


SLO = lp.SLO(ttft_s=2.0, tpot_s=0.2)  # the slo-aware scheduler's defaults


def cluster() -> lp.Cluster:
    return lp.Cluster(gpu="a100-80gb", llm="llama-2-70b", tp=2, replicas=1)


def azure_trace(n: int) -> lp.Trace:
    tr = lp.load_trace(str(SHARED), "azure") if SHARED.exists() else lp.bundled_trace()
    return tr.take(np.arange(min(n, len(tr))))


def run(inst: lp.Instance, name: str, seed: int) -> lp.sim.Result:
    pred = IntervalClasses(alpha=0.5) if name in PREDICTED else None
    return lp.simulate(inst, lp.make_policy(name), seed=seed, predictor=pred)


def bound_mean_s(inst: lp.Instance) -> float:
    sol = LB.solve_cost_bound(LB.build_cost_bound(inst))
    return sol.objective / len(inst.trace)


def table(inst: lp.Instance, names: list[str], seed: int, title: str) -> dict[str, dict]:
    lb = bound_mean_s(inst)
    print(f"\n## {title}  (cost-model bound: mean e2e >= {lb:.2f} s)")
    print(f"{'scheduler':20s} {'mean_s':>8s} {'p99_s':>8s} {'/fcfs':>6s} {'/bound':>7s} "
          f"{'goodput':>7s} {'done':>5s} {'preempt':>7s} {'wall_s':>6s}")
    out, base = {}, None
    for name in names:
        t0 = time.perf_counter()
        s = run(inst, name, seed).summary()
        e = s["e2e_s"]
        base = base or e["mean"]
        out[name] = e
        print(f"{name:20s} {e['mean']:8.2f} {e['p99']:8.2f} {e['mean'] / base:6.2f} "
              f"{e['mean'] / lb:7.2f} {s['goodput_rps']:7.3f} {s['n_finished']:5d} "
              f"{s['preemptions']:7d} "
              f"{time.perf_counter() - t0:6.1f}")
    return out


def program_latency_s(res: lp.sim.Result, trace: lp.Trace) -> np.ndarray:
    a = res.arrays
    pid = trace.program_id
    out = []
    for p in np.unique(pid):
        m = pid == p
        out.append(np.nanmax(a["finish_s"][m]) - np.min(a["arrival_s"][m]))
    return np.asarray(out)


def programs_table(n_programs: int, rate_per_s: float, seed: int) -> None:
    tr = G.agentic_programs(n_programs, program_arrivals=G.Poisson(rate_per_s),
                            stages=G.Uniform(1, 6), fanout=G.Uniform(1, 3),
                            prompt=G.LogNormal(600, 1.0), output=G.LogNormal(120, 1.5),
                            seed=seed)
    inst = lp.Instance(trace=tr, cluster=cluster())
    print(f"\n## agentic programs: {n_programs} programs, {len(tr)} calls, "
          f"{rate_per_s}/s (program latency)")
    print(f"{'scheduler':12s} {'mean_s':>8s} {'p99_s':>8s} {'/fcfs':>6s}")
    base = None
    for name in ["vllm-v0", "mlfq", "fastserve", "plas", "atlas", "plas-mlfq"]:
        lat = program_latency_s(lp.simulate(inst, lp.make_policy(name), seed=seed), tr)
        base = base or lat.mean()
        print(f"{name:12s} {lat.mean():8.2f} {np.percentile(lat, 99):8.2f} "
              f"{lat.mean() / base:6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--programs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tr = azure_trace(args.requests)
    for rate in (1.0, 2.5):
        inst = lp.Instance(trace=tr.with_rate(rate), cluster=cluster(), slo=SLO)
        table(inst, SCHEDULERS, args.seed,
              f"Azure conv, {len(tr)} requests at {rate}/s, llama-2-70b on 2xA100 TP2")
    print("\n## FastServe skip-join vs vLLM FCFS as load rises (mean / p99 e2e, s)")
    for rate in (1.0, 2.0, 3.0, 4.0):
        inst = lp.Instance(trace=tr.with_rate(rate), cluster=cluster())
        f = run(inst, "vllm-v0", args.seed).summary()["e2e_s"]
        m = run(inst, "fastserve", args.seed).summary()["e2e_s"]
        print(f"rate {rate:4.1f}/s  vllm {f['mean']:7.2f} / {f['p99']:7.2f}   fastserve "
              f"{m['mean']:7.2f} / {m['p99']:7.2f}   ratio {m['mean'] / f['mean']:.2f}")
    for rate in (1.0, 3.0):
        programs_table(args.programs, rate, args.seed)


if __name__ == "__main__":
    main()
