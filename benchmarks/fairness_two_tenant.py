"""Two tenants, one flooding: per-tenant service and p99 latency under FCFS, VTC and
weighted VTC, and the largest measured service difference beside VTC's bound.

Workload: Poisson arrivals of two tenants on one A100-80GB serving Llama-2-7B (the vLLM
engine, ``--max-num-seqs`` running requests at most); request lengths drawn from the
bundled Azure conversation trace. Tenant 0 floods at ``--flood-rps`` (above the replica's
capacity), tenant 1 sends ``--light-rps``. Weighted VTC gives tenant 1 weight
``--weight``.

Printed per policy: service received per tenant while the flood lasts (``[0, duration]``;
``w_p * prompt + w_q * output`` tokens with ``w_p = 1, w_q = 2`` as VTC charges), p99 TTFT
and E2E per tenant and SLO attainment (TTFT 2 s, TPOT 0.1 s) over the whole run, Jain's
index of that service, and the largest change of
the service difference of the two tenants over any interval in which both were backlogged
(:func:`lpserve.evaluate.fairness.max_service_difference`), beside the bound
``U_0 + U_1`` of ``proofs/fairness-vtc.md`` and the paper's form
``2 max(w_p L, w_q M)`` (M = the most tokens in one running batch, here
``max_num_seqs * (L + O)``; unweighted only). For weighted VTC the difference and bound
are in weighted units (service / weight). Exits non-zero if a VTC run exceeds its bound.

Run: ``python benchmarks/fairness_two_tenant.py [--duration 60] [--seed 0]``.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import lpserve as lp
from lpserve.evaluate.fairness import max_service_difference, with_service_recorder
from lpserve.policies.fairness import vtc_bound


def workload(duration_s: float, flood_rps: float, light_rps: float, seed: int) -> lp.Trace:
    """Poisson arrivals per tenant, lengths resampled from the bundled trace."""
    rng = np.random.default_rng(seed)
    src = lp.bundled_trace()
    parts = []
    for tenant, rate in ((0, flood_rps), (1, light_rps)):
        n = int(rng.poisson(rate * duration_s))
        t = np.sort(rng.uniform(0.0, duration_s, n))
        k = rng.integers(0, len(src), n)
        parts.append((t, src.prompt_tokens[k], src.output_tokens[k], np.full(n, tenant)))
    arr, p, o, ten = (np.concatenate(x) for x in zip(*parts))
    order = np.lexsort((ten, arr))
    return lp.Trace.from_arrays(arrival_s=arr[order], prompt_tokens=p[order],
                                output_tokens=o[order], tenant=ten[order],
                                name="two-tenant-flood")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    ap.add_argument("--flood-rps", type=float, default=12.0)
    ap.add_argument("--light-rps", type=float, default=1.5)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--weight", type=float, default=3.0, help="tenant 1's weight (wVTC)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tr = workload(args.duration, args.flood_rps, args.light_rps, args.seed)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"),
                       slo=lp.SLO(ttft_s=2.0, tpot_s=0.1))
    R = args.max_num_seqs
    L = int(tr.prompt_tokens.max())
    O = int(tr.output_tokens.max())
    n0 = int(np.sum(tr.tenant == 0))
    print(f"two tenants on 1 x A100-80GB / Llama-2-7B (vllm engine, max_num_seqs {R}): "
          f"{len(tr)} requests in {args.duration:.0f} s, tenant 0 {n0} "
          f"({args.flood_rps} rps), tenant 1 {len(tr) - n0} ({args.light_rps} rps); "
          f"L = {L}, O = {O} tokens")
    runs = [("fcfs", "vllm-v0", {}), ("vtc", "vtc", {}),
            (f"wvtc (w1={args.weight:g})", "vtc", {"weights": {1: args.weight}})]
    print(f"{'policy':<16} {'tenant':>6} {'service':>10} {'share':>6} {'p99 TTFT s':>11} "
          f"{'p99 E2E s':>10} {'SLO att.':>9}   {'Jain':>5} {'max diff':>9} {'bound':>9} "
          f"{'paper 2U':>9} {'wall s':>7}")
    bad = False
    for label, name, kw in runs:
        pol, rec = with_service_recorder(lp.make_policy(name, max_num_seqs=R, **kw))
        t0 = time.perf_counter()
        res = lp.simulate(inst, pol, seed=args.seed)
        wall = time.perf_counter() - t0
        s = res.summary()
        w = kw.get("weights", {})
        d = max_service_difference(res, rec, weights=w)
        bound = sum(vtc_bound(L, O, R, weight=w.get(f, 1.0)) for f in (0, 1))
        paper = 2 * max(1.0 * L, 2.0 * R * (L + O)) if name == "vtc" and not w \
            else float("nan")
        a = res.arrays
        served = np.zeros(2)
        for end, _, i, k in rec.events:
            if end <= args.duration:
                served[a["tenant"][i]] += 2.0 * k
        adm = np.isfinite(a["first_scheduled_s"]) & (a["first_scheduled_s"] <= args.duration)
        for f in (0, 1):
            served[f] += a["prompt_tokens"][adm & (a["tenant"] == f)].sum()
        jain = float(served.sum() ** 2 / (2 * np.sum(served ** 2)))
        for k, f in enumerate(("0", "1")):
            t = s["tenants"][f]
            tail = (f"   {jain:5.3f} {d['max']:9.0f} "
                    f"{bound if name == 'vtc' else float('nan'):9.0f} "
                    f"{paper:9.0f} {wall:7.2f}") if k == 0 else ""
            print(f"{label if k == 0 else '':<16} {f:>6} {served[k]:>10,.0f} "
                  f"{served[k] / served.sum():>6.3f} {t['ttft_s']['p99']:>11.2f} "
                  f"{t['e2e_s']['p99']:>10.2f} {t['slo_attainment']:>9.3f}{tail}")
        if name == "vtc" and d["max"] > bound + 1e-6:
            bad = True
            print(f"  ! {label}: measured difference {d['max']:.0f} exceeds the bound "
                  f"{bound:.0f}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
