"""Capacity under SLO of the drift-plus-penalty prefill controller and the baselines.

Capacity (DistServe goodput / Sarathi-Serve capacity): the largest arrival rate at which
at least 90 % of requests meet the TTFT and TPOT SLOs *and* the P99 of all token gaps
(time between tokens, TBT) stays within the TBT SLO; found by geometric bisection on the
rate scale of each workload. Mistral-7B on one A100-80GB.

Tables printed:

1. capacity (requests/s) per workload x policy: ``vllm-v0`` (vLLM V0: prefill-first), ``decode-first``
   (decode-first without chunking), ``sarathi`` with budgets 256/512/1024/2048, and
   ``lyapunov`` (one V for every workload), with the ratio ``sarathi-512 / vllm-v0``
   (Sarathi-Serve reports about 2.6x) and ``lyapunov / best fixed budget``;
2. at each policy's own capacity on the first workload: P99 TBT, TTFT p50/p90 and SLO
   attainment;
3. disaggregated pools: replica counts from the fluid MIP (``pool_sizes``) per load, and
   the share of late KV transfers on one link under FCFS, MFS's reverse multi-level queue
   and least laxity first, for the finished prefills of a ``lyapunov-disagg`` run with two
   tenants (KV due 0.5 s or 5 s after arrival).

Workloads: the Azure conversation and code traces (``../shared/traces`` beside the checkout, or ``$LPSERVE_SHARED/traces``, when present,
else the bundled 10-minute conversation slice), and a generated Poisson workload with
log-normal lengths. Real traces keep their burstiness: the rate scale divides every
inter-arrival time.

Run: ``python benchmarks/lyapunov_capacity.py [--requests 400] [--rel-tol 0.05] [--seed 0]``.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import lpserve as lp
from lpserve.policies.disagg import link_schedule, pool_sizes
from lpserve.policies.lyapunov import constants, lyapunov, with_recorder
from lpserve.registry import make_policy
from lpserve.trace import generate as G

TRACES = Path(os.environ.get("LPSERVE_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "traces"
GPU, LLM = "a100-80gb", "mistral-7b"
TTFT_SLO_S, TPOT_SLO_S, TBT_SLO_S = 2.0, 0.1, 0.1
ATTAINMENT = 0.9
TBT_QUANTILE = 0.99
V_DPP = 1.0  # the one V used on every workload
# the controller aims at half the allowed share of slow gaps: its guarantee is a long-run
# average and Z_TBT starts at zero, so a finite run needs a margin for the transient
EPS_MARGIN = 0.5


def policies(tbt_slo_s: float = TBT_SLO_S) -> dict[str, Callable[[], lp.Policy]]:
    """Name -> factory of a fresh policy that records token gaps."""
    common = dict(prefix_caching=False)
    out: dict[str, Callable[[], lp.Policy]] = {
        "vllm-v0": lambda: with_recorder(make_policy("vllm-v0", max_num_batched_tokens=8192,
                                                  **common), tbt_slo_s),
        "decode-first": lambda: with_recorder(make_policy(
            "vllm-v0", batching="decode-first", max_num_batched_tokens=8192,
            **common).with_(name="decode-first"), tbt_slo_s),
    }
    for b in (256, 512, 1024, 2048):
        out[f"sarathi-{b}"] = (lambda b=b: with_recorder(make_policy(
            "sarathi", max_num_batched_tokens=b, **common).with_(name=f"sarathi-{b}"),
            tbt_slo_s))
    out["lyapunov"] = lambda: lyapunov(V=V_DPP, tbt_slo_s=tbt_slo_s,
                                       eps=EPS_MARGIN * (1.0 - TBT_QUANTILE),
                                       prefix_caching=False)
    return out


def workloads(n_requests: int, seed: int = 0) -> dict[str, lp.Trace]:
    """Name -> trace of ``n_requests`` requests (arrivals as recorded or generated)."""
    out = {}
    conv = TRACES / "azure_llm_2023_conv_first30min.csv.gz"
    code = TRACES / "azure_llm_2023_code_first30min.csv.gz"
    out["azure-conv"] = (lp.load_trace(conv) if conv.exists() else lp.bundled_trace()
                         ).head(n_requests).rebased()
    if code.exists():
        out["azure-code"] = lp.load_trace(code).head(n_requests).rebased()
    out["generated"] = G.synthetic(
        n_requests, arrivals=G.Poisson(rate_per_s=1.0),
        prompt=G.LogNormal(mean=1024, cv=1.0, max_tokens=8000),
        output=G.LogNormal(mean=256, cv=1.0, max_tokens=2000), seed=seed, name="generated")
    return out


def evaluate(trace: lp.Trace, make: Callable[[], lp.Policy], rate_rps: float,
             seed: int = 0) -> dict[str, Any]:
    """Run ``make()`` on ``trace`` rescaled to ``rate_rps``; SLO attainment and TBT."""
    inst = lp.Instance(trace=trace.with_rate(rate_rps),
                       cluster=lp.Cluster(gpu=GPU, llm=LLM, replicas=1,
                                          gpu_memory_fraction=0.9),
                       slo=lp.SLO(ttft_s=TTFT_SLO_S, tpot_s=TPOT_SLO_S))
    pol = make()
    res = lp.simulate(inst, pol, seed=seed)
    a = res.arrays
    ok = (a["status"] == "finished") & (a["ttft_s"] <= TTFT_SLO_S) & \
        (np.nan_to_num(a["tpot_s"], nan=0.0) <= TPOT_SLO_S)
    rep = pol.engine.budget_controller.report()
    att = float(ok.mean())
    tbt_ok = rep["tbt_violation_fraction"] <= 1.0 - TBT_QUANTILE
    ttft = a["ttft_s"][np.isfinite(a["ttft_s"])]
    return {"rate_rps": rate_rps, "attainment": att, "tbt_p99_s": rep["tbt_p99_s"],
            "tbt_violation_fraction": rep["tbt_violation_fraction"],
            "ttft_p50_s": float(np.median(ttft)) if ttft.size else np.inf,
            "ttft_p90_s": float(np.percentile(ttft, 90)) if ttft.size else np.inf,
            "meets": bool(att >= ATTAINMENT and tbt_ok)}


def capacity_rps(trace: lp.Trace, make: Callable[[], lp.Policy], *, hi_rps: float,
                 rel_tol: float = 0.05, seed: int = 0) -> float:
    """Largest rate meeting the SLOs, by geometric bisection until ``hi / lo <= 1 + rel_tol``.

    The bracket starts at ``[hi / 32, hi]``; while its lower end fails it is halved (down
    to ``hi / 4096``, below which the capacity is reported as 0).
    """
    hi = hi_rps
    if evaluate(trace, make, hi, seed)["meets"]:
        return hi
    lo = hi / 32
    while not evaluate(trace, make, lo, seed)["meets"]:
        hi, lo = lo, lo / 2
        if lo < hi_rps / 4096:
            return 0.0
    while hi / lo > 1 + rel_tol:
        mid = float(np.sqrt(lo * hi))
        if evaluate(trace, make, mid, seed)["meets"]:
            lo = mid
        else:
            hi = mid
    return lo


def ceiling_rps(trace: lp.Trace) -> float:
    """Li-Dai-Peng service rate at the rate-optimal budget: no policy sustains more."""
    cost = lp.cost_model(gpu=GPU, llm=LLM)
    mp, md = float(trace.prompt_tokens.mean()), float(trace.output_tokens.mean())
    return max(constants(cost, budget_tokens=b, mean_prompt_tokens=mp,
                         mean_output_tokens=md)["capacity_rps"]
               for b in (512, 1024, 2048, 4096))


def capacity_table(n_requests: int = 400, rel_tol: float = 0.05, seed: int = 0,
                   names: list[str] | None = None,
                   only: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Workload -> policy -> capacity (requests/s)."""
    pols = policies()
    if names is not None:
        pols = {k: v for k, v in pols.items() if k in names}
    out: dict[str, dict[str, float]] = {}
    for wname, tr in workloads(n_requests, seed).items():
        if only is not None and wname not in only:
            continue
        hi = 1.2 * ceiling_rps(tr)
        out[wname] = {p: capacity_rps(tr, make, hi_rps=hi, rel_tol=rel_tol, seed=seed)
                      for p, make in pols.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rel-tol", type=float, default=0.05,
                    help="relative width of the final bisection bracket")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    table = capacity_table(args.requests, args.rel_tol, args.seed)
    names = list(next(iter(table.values())))
    print(f"capacity under SLO (req/s): >= {ATTAINMENT:.0%} meet TTFT <= {TTFT_SLO_S} s and "
          f"TPOT <= {TPOT_SLO_S} s, P99 TBT <= {TBT_SLO_S} s; {GPU} {LLM}, "
          f"{args.requests} requests")
    print(f"{'workload':<12}" + "".join(f"{n:>14}" for n in names) +
          f"{'s512/v0':>11}{'dpp/best':>10}")
    for w, row in table.items():
        best = max(v for k, v in row.items() if k.startswith("sarathi"))
        r_sv = row["sarathi-512"] / row["vllm-v0"] if row["vllm-v0"] > 0 else float("inf")
        r_db = row["lyapunov"] / best if best > 0 else float("inf")
        print(f"{w:<12}" + "".join(f"{row[n]:>14.3f}" for n in names) +
              f"{r_sv:>11.2f}{r_db:>10.2f}")
    w0, tr0 = next(iter(workloads(args.requests, args.seed).items()))
    print(f"\nat each policy's capacity on {w0}:")
    print(f"{'policy':<14}{'rate':>8}{'attain':>8}{'P99 TBT':>9}{'TTFT p50':>10}{'TTFT p90':>10}")
    for p, make in policies().items():
        rate = table[w0][p]
        if rate <= 0:
            continue
        m = evaluate(tr0, make, rate, args.seed)
        print(f"{p:<14}{rate:>8.3f}{m['attainment']:>8.3f}{m['tbt_p99_s']:>9.3f}"
              f"{m['ttft_p50_s']:>10.3f}{m['ttft_p90_s']:>10.3f}")
    disagg_tables(args.requests, args.seed)
    print(f"\nwall {time.perf_counter() - t0:.0f} s")


def disagg_tables(n_requests: int, seed: int = 0) -> None:
    """Table 3: pool sizes per load and KV-transfer orders on one link."""
    cost = lp.cost_model(gpu=GPU, llm=LLM)
    conv = workloads(n_requests, seed)["azure-conv"]
    mp, md = float(conv.prompt_tokens.mean()), float(conv.output_tokens.mean())
    print(f"\npool sizes (MIP, utilization <= 0.85, TPOT SLO 0.05 s, 25 Gb/s link), "
          f"m_p = {mp:.0f}, m_d = {md:.0f}:")
    print(f"{'rate':>6}{'prefill':>9}{'decode':>8}{'u_pre':>7}{'u_dec':>7}{'u_link':>8}")
    for rate in (5.0, 10.0, 20.0, 40.0):
        s = pool_sizes(cost, rate_rps=rate, mean_prompt_tokens=mp, mean_output_tokens=md,
                       tpot_slo_s=0.05, link_gbps=25.0)
        print(f"{rate:>6.0f}{s['prefill_replicas']:>9}{s['decode_replicas']:>8}"
              f"{s['prefill_utilization']:>7.2f}{s['decode_utilization']:>7.2f}"
              f"{s['link_utilization']:>8.2f}")
    inst = lp.Instance(trace=conv.with_rate(6.0),
                       cluster=lp.Cluster(gpu=GPU, llm=LLM, prefill_replicas=1,
                                          decode_replicas=1, link_gbps=25.0),
                       slo=lp.SLO(ttft_s=TTFT_SLO_S, tpot_s=TPOT_SLO_S))
    a = lp.simulate(inst, "lyapunov-disagg", seed=seed).arrays
    done = np.isfinite(a["first_token_s"])
    ready = a["first_token_s"][done]
    size = a["prompt_tokens"][done] * cost.kv_bytes_per_token
    tight = np.random.default_rng(seed).random(int(done.sum())) < 0.5
    deadline = a["arrival_s"][done] + np.where(tight, 0.5, 5.0)
    print("\nlate KV transfers on one link (finished prefills of lyapunov-disagg at 6 req/s):")
    print(f"{'Gb/s':>6}{'order':>7}{'late':>8}{'late (0.5 s tenant)':>21}")
    for gbps in (8.0, 10.0, 15.0):
        for order in ("fcfs", "rmlq", "llf"):
            late = link_schedule(ready, size, deadline, gbps, order)["late"]
            print(f"{gbps:>6.0f}{order:>7}{late.mean():>8.3f}{late[tight].mean():>21.3f}")


if __name__ == "__main__":
    main()
