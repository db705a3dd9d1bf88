"""How far from optimal, really: the optimality interval on the bundled default workload.

The first 150 s of the bundled Azure conversation trace (~600 requests) on 2 x A100-80GB
with Llama-2-7B, at rate scales x0.5, x1 and x2. For each load: the best valid lower bound
(``cost-lp`` under a time limit, ``srpt-bound``, ``cost-bound``), the best offline schedule
(``schedule-search`` under a time limit, and the simulated baselines), their ratio, and the
wall time of the whole computation (simulations included).

Targets (issue "how far from optimal"): upper / lower <= 1.15 at x0.5 and x1, <= 1.3 at
x2, under 60 s per load. Exit status 1 when a target is missed. Timings depend on the
machine and its load.

    python benchmarks/opt_interval_default.py [--loads 0.5,1,2] [--lp-time 20] [--search-time 15]

Where the width is (seed 0): ``cost-lp`` gives the same certified bound at 20 s as at 40 s
at every load (x0.5 2.7622, x1 2.9169, x2 3.4958 s per request). Solved in both of its
window rounds without a time limit, the LP is 2.9350 s at x1 (101 s, 0.6 % above) and
3.7226 s at x2 (127 s, 6.5 % above: ratio 1.94 instead of 2.06); more solver time does
not close the gap.
On the upper side, 636 simulations at x1 (35 s of search) find no order better than the
220 of 15 s (3.5925 s); the best token budget is the crossover n* = 75, and the budgets
below it are worse for every seed order (48 tokens: 4.03-4.18 s; 16 tokens: 35-58 s). The
ratio is held up by the LP relaxation's value, not by its time limit or the search.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import lpserve as lp
from lpserve.evaluate.interval import optimality_interval
from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

TARGETS = {0.5: 1.15, 1.0: 1.15, 2.0: 1.3}
BASELINES = ("vllm", "vllm+least-outstanding", "sarathi")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0.5,1,2")
    ap.add_argument("--duration", type=float, default=150.0)
    ap.add_argument("--lp-time", type=float, default=20.0, help="cost-lp time limit (s)")
    ap.add_argument("--search-time", type=float, default=15.0,
                    help="schedule-search time limit (s)")
    ap.add_argument("--target-s", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tr = load_trace(DEFAULT_TRACE)
    t0 = float(tr.arrival_s[0])
    window = tr.window(t0, t0 + args.duration).rebased()
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2)
    ok = True
    out = []
    for load in [float(x) for x in args.loads.split(",")]:
        inst = lp.Instance(trace=window if load == 1.0 else window.scale_rate(load), cluster=cl)
        t = time.perf_counter()
        totals = {}
        for name in BASELINES:
            r = lp.simulate(inst, name)
            if (r.arrays["status"] == "finished").all():
                totals[name] = float(r.arrays["e2e_s"].sum())
        rec = optimality_interval(inst, lp_time_limit_s=args.lp_time,
                                  search_time_limit_s=args.search_time, policy_totals=totals)
        wall = time.perf_counter() - t
        rec.update(load=load, wall_s=wall, baselines_mean_s={k: v / rec["n_requests"]
                                                             for k, v in totals.items()})
        out.append(rec)
        target = TARGETS.get(load)
        met = (target is None or rec["ratio"] <= target) and wall < args.target_s
        ok &= met
        b = "; ".join(f"{x['name']} {x['mean_s']:.4f} s ({x['status']}, {x['wall_s']:.1f} s)"
                      for x in rec["bounds"])
        s = rec["search"]
        print(f"load x{load:g}: {rec['n_requests']} requests; lower {rec['lower_mean_s']:.4f} s "
              f"({rec['lower_name']}; {b}); upper {rec['upper_mean_s']:.4f} s "
              f"({rec['upper_name']}; search {s['mean_s']:.4f} s, {s['status']}, "
              f"{s['wall_s']:.1f} s, {s['evaluations']} simulations, engine {s['engine']}, "
              f"{s['router']}); baselines " + ", ".join(f"{k} {v:.4f}" for k, v in
                                                      rec["baselines_mean_s"].items()))
        print(f"FIGURE load x{load:g}: upper / lower {rec['ratio']:.3f} (target "
              f"{'-' if target is None else f'<= {target:g}'}), wall {wall:.1f} s (target < "
              f"{args.target_s:g} s): {'met' if met else 'MISSED'}", flush=True)
    if args.json:
        print(json.dumps(out, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
