"""Sarathi-Serve (Agrawal et al., OSDI 2024) and the drift-plus-penalty budget controller.

Tables printed:

1. **Sarathi's set-up**: Mistral-7B on one A100-80GB, Sarathi's own ShareGPT-8k length
   table (``sharegpt_8k_llama2_lengths.csv.gz`` of the shared data, from the
   sarathi-serve repository; without it a log-normal fit of its statistics), Poisson
   arrivals. Capacity as Sarathi defines it: the highest rate whose P99 time between
   tokens stays within the TBT SLO and whose median scheduling delay (queue time) stays
   within 2 s. Sarathi with budgets 512 and 2048 against vLLM (``vllm-v0``, the
   prefill-first scheduler the paper compared with) at batch caps 32 / 64 / 128 (the
   paper's vLLM configurations) and a token budget of 8,192 (V0 without chunked prefill
   schedules whole prompts: its budget is the context length). The paper's TBT SLO values are not known here; the table
   uses 0.1 s and 0.5 s, lpserve's choices.
2. **Why ``benchmarks/lyapunov_capacity.py`` shows 3.29x, not 2.6x** (``--explain``): on
   that benchmark's workload (the Azure conversation trace) the ratio sarathi-512 /
   vllm-v0 under its own capacity rule (>= 90 % of requests meet TTFT <= 2 s and TPOT <=
   0.1 s, and P99 TBT <= 0.1 s; vLLM with 256 sequences and 8,192 tokens) and under
   Sarathi's rule with the paper's vLLM batch caps, changing one thing at a time.
3. **The controller on bursty traffic**: Llama-3-8B on one H100, the Azure code trace
   (bursty: dispersion well above Poisson), SLO TTFT 2 s / TPOT 50 ms; goodput (requests
   meeting both per second) of ``lyapunov`` (TBT target from the instance's SLO, 50 ms),
   ``lyapunov`` with the 0.1 s target it used before it mirrored the SLO, and Sarathi
   with budgets 256 - 2048, at several rate scales of the recorded arrivals; then the
   same requests as a Poisson stream at the trace's mean rate (the bursts isolated from
   the lengths), and per policy where the goodput is lost (TTFT or TPOT, short or long
   outputs, the share of token gaps above 50 ms).
4. the claims table.

Run: ``python benchmarks/seeds/sarathi.py [--requests 300] [--code-requests 600]
[--explain]``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C

import lpserve as lp
from lpserve.policies.lyapunov import lyapunov, with_recorder
from lpserve.trace import generate as G
from lpserve.trace import papers

SARATHI_GPU, SARATHI_LLM = "a100-80gb", "mistral-7b"
CODE_GPU, CODE_LLM = "h100-sxm", "llama-3-8b"
CODE_SLO = lp.SLO(ttft_s=2.0, tpot_s=0.05)
BUDGETS = (256, 512, 1024, 2048)
SCALES = (1.0, 1.5, 2.0)
MAX_LEN = 8192  # vLLM V0 sets max_num_batched_tokens to the context length without chunking
#: ShareGPT-8k (Llama-2 tokenizer, sarathi-serve's table): prefill mean 2,340 (std 2,089),
#: decode mean 439 (std 266), totals <= 8,149; the fallback fits log-normals to these
SHAREGPT8K = {"prompt_mean": 2340.0, "prompt_cv": 2088.9 / 2340.0, "output_mean": 438.7,
              "output_cv": 265.6 / 438.7}


def sharegpt8k(n: int, seed: int = 0) -> lp.Trace:
    """``n`` Poisson (rate 1/s) requests with ShareGPT-8k's (prompt, output) pairs."""
    path = C.SHARED / "sharegpt_8k_llama2_lengths.csv.gz"
    if path.exists():
        lengths = G.EmpiricalJoint.from_trace(lp.load_trace(path))
        return G.synthetic(n, arrivals=G.Poisson(1.0), lengths=lengths, seed=seed,
                           name="sharegpt-8k")
    s = SHAREGPT8K
    return G.synthetic(n, arrivals=G.Poisson(1.0),
                       prompt=G.LogNormal(s["prompt_mean"], s["prompt_cv"], 8000),
                       output=G.LogNormal(s["output_mean"], s["output_cv"], 1024),
                       seed=seed, name="sharegpt-8k-fit")


def code_trace(n: int, offset: int = 0) -> lp.Trace:
    """``n`` requests of the Azure code trace from request ``offset`` (recorded
    arrivals); without the shared data, :func:`lpserve.trace.papers.azure_code_like`
    (seeded by ``offset``)."""
    path = C.SHARED / "azure_llm_2023_code_first30min.csv.gz"
    if not path.exists():
        return papers.azure_code_like(n, seed=offset)
    tr = lp.load_trace(path)
    return tr.take(np.arange(offset, min(offset + n, len(tr)))).rebased()


# ----------------------------------------------------------------------------- capacity
def sarathi_ok(res: lp.sim.Result, policy: lp.Policy, tbt_slo_s: float) -> bool:
    """Sarathi's capacity rule: P99 TBT <= ``tbt_slo_s`` and median queue time <= 2 s,
    every request finished."""
    a = res.arrays
    if not np.all(a["status"] == "finished"):
        return False
    rep = policy.engine.budget_controller.report()
    return bool(rep["tbt_violation_fraction"] <= 0.01 and np.median(a["queue_s"]) <= 2.0)


def attainment_ok(res: lp.sim.Result, policy: lp.Policy, tbt_slo_s: float) -> bool:
    """``lyapunov_capacity.py``'s rule: >= 90 % meet TTFT <= 2 s and TPOT <= 0.1 s, and
    P99 TBT <= ``tbt_slo_s``."""
    a = res.arrays
    ok = (a["status"] == "finished") & (a["ttft_s"] <= 2.0) & \
        (np.nan_to_num(a["tpot_s"], nan=0.0) <= 0.1)
    rep = policy.engine.budget_controller.report()
    return bool(ok.mean() >= 0.9 and rep["tbt_violation_fraction"] <= 0.01)


def capacity(trace: lp.Trace, make: Callable[[], lp.Policy], rule: Callable, tbt_slo_s: float,
             cluster: lp.Cluster, rel_tol: float = 0.08, seed: int = 0) -> float:
    """Highest rate (req/s) at which ``rule`` holds (a fresh recorded policy per run)."""
    def ok(rate: float) -> bool:
        pol = with_recorder(make(), tbt_slo_s)
        inst = lp.Instance(trace=trace.with_rate(rate), cluster=cluster,
                           slo=lp.SLO(ttft_s=2.0, tpot_s=tbt_slo_s))
        return rule(lp.simulate(inst, pol, seed=seed), pol, tbt_slo_s)

    return C.max_rate(ok, 0.05, 16.0, rel_tol)


def sarathi_policies() -> dict[str, Callable[[], lp.Policy]]:
    """Sarathi budgets 512 / 2048 and vLLM V0 at the paper's batch caps."""
    out: dict[str, Callable[[], lp.Policy]] = {}
    for b in (512, 2048):
        out[f"sarathi-{b}"] = lambda b=b: lp.make_policy(
            "sarathi", max_num_batched_tokens=b, prefix_caching=False).with_(
            name=f"sarathi-{b}")
    for n in (32, 64, 128):  # V0 without chunking needs a budget >= the longest prompt
        out[f"vllm-v0-{n}"] = lambda n=n: lp.make_policy(
            "vllm-v0", max_num_seqs=n, max_num_batched_tokens=MAX_LEN,
            prefix_caching=False).with_(name=f"vllm-v0-{n}")
    return out


def capacity_table(n: int, seed: int = 0, tbt_slos: tuple[float, ...] = (0.1, 0.5)
                   ) -> dict[float, dict[str, float]]:
    """TBT SLO -> policy -> capacity (req/s) on Sarathi's set-up."""
    tr = sharegpt8k(n, seed)
    cl = lp.Cluster(gpu=SARATHI_GPU, llm=SARATHI_LLM)
    return {s: {p: capacity(tr, make, sarathi_ok, s, cl, seed=seed)
                for p, make in sarathi_policies().items()} for s in tbt_slos}


def explain_table(n: int, seed: int = 0) -> list[tuple[str, float, float]]:
    """(change, sarathi-512, vllm-v0) capacities on the Azure conversation trace, moving
    from ``lyapunov_capacity.py``'s set-up to Sarathi's one step at a time."""
    path = C.SHARED / "azure_llm_2023_conv_first30min.csv.gz"
    tr = (lp.load_trace(path) if path.exists() else lp.bundled_trace()).head(n).rebased()
    cl = lp.Cluster(gpu=SARATHI_GPU, llm=SARATHI_LLM)
    s512 = sarathi_policies()["sarathi-512"]

    def v0(**kw: Any) -> Callable[[], lp.Policy]:
        return lambda: lp.make_policy("vllm-v0", prefix_caching=False, **kw)

    poisson = G.with_arrivals(tr, G.Poisson(1.0), seed=seed)
    rows = []
    for label, trace, rule, base in (
            ("lyapunov_capacity.py: 90 % TTFT+TPOT, vLLM 256 seq / 8192 tok", tr,
             attainment_ok, v0(max_num_batched_tokens=8192)),
            ("Sarathi's rule (P99 TBT, median delay <= 2 s), same vLLM", tr, sarathi_ok,
             v0(max_num_batched_tokens=8192)),
            ("Sarathi's rule, vLLM at the paper's best cap (128 seq)", tr, sarathi_ok,
             v0(max_num_batched_tokens=8192, max_num_seqs=128)),
            ("same, Poisson arrivals instead of the trace's bursts", poisson, sarathi_ok,
             v0(max_num_batched_tokens=8192, max_num_seqs=128))):
        a = capacity(trace, s512, rule, 0.1, cl, seed=seed)
        b = capacity(trace, base, rule, 0.1, cl, seed=seed)
        rows.append((label, a, b))
    return rows


# ----------------------------------------------------------------------- bursty traffic
def code_policies() -> dict[str, Callable[[], lp.Policy]]:
    """The DPP controller (mirrored and 0.1 s targets) and Sarathi's fixed budgets."""
    out: dict[str, Callable[[], lp.Policy]] = {
        "lyapunov": lambda: lyapunov(),
        "lyapunov@0.1s": lambda: lyapunov(tbt_slo_s=0.1).with_(name="lyapunov@0.1s"),
    }
    for b in BUDGETS:
        out[f"sarathi-{b}"] = lambda b=b: lp.make_policy(
            "sarathi", max_num_batched_tokens=b).with_(name=f"sarathi-{b}")
    return out


def code_goodput(n: int, offset: int = 0, scales: tuple[float, ...] = SCALES,
                 names: list[str] | None = None, seed: int = 0,
                 poisson: bool = False) -> dict[float, dict[str, float]]:
    """Rate scale -> policy -> goodput (req/s meeting TTFT 2 s and TPOT 50 ms). With
    ``poisson`` the same requests arrive as a Poisson stream at the trace's mean rate
    (isolates the bursts from the lengths)."""
    tr = code_trace(n, offset)
    if poisson:
        tr = G.with_arrivals(tr, G.Poisson(tr.rate_per_s), seed=seed)
    cl = lp.Cluster(gpu=CODE_GPU, llm=CODE_LLM)
    pols = code_policies()
    out: dict[float, dict[str, float]] = {}
    for s in scales:
        inst = lp.Instance(trace=tr.scale_rate(s), cluster=cl, slo=CODE_SLO)
        out[s] = {p: lp.simulate(inst, make(), seed=seed).summary()["goodput_rps"]
                  for p, make in pols.items() if names is None or p in names}
    return out


def diagnose(n: int, scale: float = 1.0, seed: int = 0) -> dict[str, dict[str, float]]:
    """Why the controller trails the best fixed budget on bursty code traffic: per policy
    the share of requests within TTFT 2 s and within TPOT 50 ms, the mean TPOT and the
    share of token gaps above 50 ms. ``lyapunov eps=0.5`` (a diagnostic, not a default)
    aims at the median gap instead of the P99, which is what a mean-TPOT SLO asks."""
    tr = code_trace(n).scale_rate(scale)
    cl = lp.Cluster(gpu=CODE_GPU, llm=CODE_LLM)
    inst = lp.Instance(trace=tr, cluster=cl, slo=CODE_SLO)
    makes = {"lyapunov": lambda: lyapunov(),
             "lyapunov eps=0.5": lambda: lyapunov(eps=0.5).with_(name="lyapunov eps=0.5"),
             "sarathi-1024": lambda: with_recorder(lp.make_policy(
                 "sarathi", max_num_batched_tokens=1024).with_(name="sarathi-1024"),
                 CODE_SLO.tpot_s)}
    out = {}
    for name, make in makes.items():
        pol = make()
        res = lp.simulate(inst, pol, seed=seed)
        a, s = res.arrays, res.summary()
        fin = a["status"] == "finished"
        rep = pol.engine.budget_controller.report()
        tpot_ok = fin & (np.nan_to_num(a["tpot_s"], nan=0.0) <= CODE_SLO.tpot_s)
        short = a["output_tokens"] <= 16
        out[name] = {"ttft_ok": float(np.mean(fin & (a["ttft_s"] <= CODE_SLO.ttft_s))),
                     "tpot_ok": float(np.mean(tpot_ok)),
                     "tpot_ok_short": float(np.mean(tpot_ok[short])),
                     "tpot_ok_long": float(np.mean(tpot_ok[~short])),
                     "tbt_p99_s": rep["tbt_p99_s"],
                     "tpot_mean_s": s["tpot_s"]["mean"], "ttft_p50_s": s["ttft_s"]["p50"],
                     "gaps_over": rep["tbt_violation_fraction"],
                     "goodput_rps": s["goodput_rps"]}
    return out


def dispersion(tr: lp.Trace) -> float:
    """Variance over mean of arrivals per one-second bin (1 for Poisson)."""
    c = np.bincount(np.floor(tr.arrival_s - tr.arrival_s[0]).astype(np.int64))
    return float(c.var() / c.mean())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the tables; returns the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests per capacity run")
    ap.add_argument("--code-requests", type=int, default=600)
    ap.add_argument("--explain", action="store_true", help="also print table 2")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cap = capacity_table(args.requests, args.seed)
    print(f"## Sarathi's set-up: capacity (req/s), {SARATHI_LLM} on one {SARATHI_GPU}, "
          f"ShareGPT-8k, {args.requests} requests; P99 TBT <= SLO, median delay <= 2 s")
    names = list(next(iter(cap.values())))
    print(f"{'TBT SLO':>8}" + "".join(f"{p:>14}" for p in names) + f"{'best s / best v':>17}")
    ratios = {}
    for s, row in cap.items():
        bs = max(v for k, v in row.items() if k.startswith("sarathi"))
        bv = max(v for k, v in row.items() if k.startswith("vllm"))
        ratios[s] = bs / bv if bv > 0 else float("inf")
        print(f"{s:>8.2f}" + "".join(f"{row[p]:>14.3f}" for p in names) + f"{ratios[s]:>17.2f}")
    explain = None
    if args.explain:
        explain = explain_table(400, args.seed)
        print("\n## lyapunov_capacity.py's 3.29x, one change at a time (Azure conversation, "
              "400 requests, TBT SLO 0.1 s)")
        for label, a, b in explain:
            print(f"{label:<66} sarathi-512 {a:6.3f}  vllm-v0 {b:6.3f}  ratio "
                  f"{a / b if b else float('inf'):5.2f}")
    tr = code_trace(args.code_requests)
    print(f"\n## bursty Azure code traffic: {CODE_LLM} on one {CODE_GPU}, SLO TTFT 2 s / TPOT "
          f"50 ms, {len(tr)} requests (dispersion {dispersion(tr):.1f}, Poisson 1); goodput "
          "req/s")
    good = code_goodput(args.code_requests, seed=args.seed)
    pnames = list(next(iter(good.values())))
    print(f"{'scale':>6}" + "".join(f"{p:>15}" for p in pnames) + f"{'dpp/best':>10}"
          f"{'0.1s/best':>10}")
    dpp_ratio = {}
    for s, row in good.items():
        best = max(v for k, v in row.items() if k.startswith("sarathi"))
        dpp_ratio[s] = (row["lyapunov"] / best, row["lyapunov@0.1s"] / best)
        print(f"{s:>6.1f}" + "".join(f"{row[p]:>15.3f}" for p in pnames) +
              f"{dpp_ratio[s][0]:>10.2f}{dpp_ratio[s][1]:>10.2f}")
    calm = code_goodput(args.code_requests, seed=args.seed, poisson=True)
    print("\nsame requests, Poisson arrivals at the trace's mean rate (bursts removed)")
    calm_ratio = {}
    for s, row in calm.items():
        best = max(v for k, v in row.items() if k.startswith("sarathi"))
        calm_ratio[s] = (row["lyapunov"] / best, row["lyapunov@0.1s"] / best)
        print(f"{s:>6.1f}" + "".join(f"{row[p]:>15.3f}" for p in pnames) +
              f"{calm_ratio[s][0]:>10.2f}{calm_ratio[s][1]:>10.2f}")
    diag = diagnose(args.code_requests, 1.0, args.seed)
    print(f"\nat scale 1.0: {'ttft ok':>8} {'tpot ok':>8} {'(<=16 tok)':>11} {'(>16)':>7} "
          f"{'TPOT mean':>10} {'gaps > 50 ms':>13} {'P99 gap':>8} {'goodput':>8}")
    for name, d in diag.items():
        print(f"{name:<17}{d['ttft_ok']:>8.3f} {d['tpot_ok']:>8.3f} {d['tpot_ok_short']:>11.3f} "
              f"{d['tpot_ok_long']:>7.3f} {d['tpot_mean_s']:>10.4f} {d['gaps_over']:>13.3f} "
              f"{d['tbt_p99_s']:>8.3f} {d['goodput_rps']:>8.3f}")
    worst = min(r[0] for r in dpp_ratio.values())
    rows = [(f"capacity, best Sarathi / best vLLM, TBT SLO {s} s", "2.6x", r, 2.6,
             C.verdict(r > 1.0, abs(r / 2.6 - 1) < 0.25)) for s, r in ratios.items()]
    rows.append(("DPP (one V) >= best fixed budget, bursty code, worst scale", ">= 1",
                 worst, 1.0, C.verdict(worst >= 0.95, worst >= 1.0)))
    calm_worst = min(r[0] for r in calm_ratio.values())
    rows.append(("same requests, Poisson arrivals, worst scale", ">= 1", calm_worst, 1.0,
                 C.verdict(calm_worst >= 0.95, calm_worst >= 1.0)))
    C.claims_table("Sarathi-Serve and the DPP controller: claims", rows)
    print(f"\nwall {time.perf_counter() - t0:.0f} s")
    return {"capacity": cap, "ratios": ratios, "explain": explain, "goodput": good,
            "dpp_ratio": dpp_ratio, "poisson_goodput": calm, "poisson_ratio": calm_ratio,
            "diagnosis": diag}


if __name__ == "__main__":
    main()
