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
        [--lp-grid-scale 4] [--case default|mooncake|sharegpt|all]

Where the width is (seed 0): with the fine grid and 20 s, ``cost-lp`` certifies x0.5
2.7905, x1 3.0358, x2 3.5027 s per request (ratios 1.090 / 1.183 / 2.057); the coarse grid
of ``--lp-grid-scale 4`` certifies 2.7753 / 3.0341 / 3.5754 s in 3-7 s. Wider windows on
the coarse grid (``build_cost_lp(window_mult=...)``, no time limit) raise x1 to 3.0523 s
(3x, 6 s), 3.0631 s (4x, 8 s) and 3.0814 s (8x, 16 s): the LP's own value, not its time
limit, holds the ratio above 1.15 at x1 (3.5925 / 3.0814 = 1.166).
On the upper side, 636 simulations at x1 (35 s of search) find no order better than the
220 of 15 s (3.5925 s); the best token budget is the crossover n* = 75, and the budgets
below it are worse for every seed order (48 tokens: 4.03-4.18 s; 16 tokens: 35-58 s). The
ratio is held up by the LP relaxation's value, not by its time limit or the search.

``--lp-grid-scale 4`` runs the LP as ``lpserve gap``'s default does (a grid four times
coarser, one round). On the default workload that lifts x2 to 3.575 s within the limit; on
the Mooncake slice it certifies 2.825 / 2.942 s at utilisations 0.5 / 0.8 in 6 s, above
the cost bound (2.790 s), against uppers of 5.716 / 9.239 s (intervals 2.02 / 3.14).

``--case`` adds the issue's other two workloads (``all`` runs the three):

* ``mooncake``: the bundled Mooncake conversation slice (918 requests) on 4 x H100 with
  Llama-3-8B at utilisations 0.5 and 0.8 of the fluid capacity estimate;
* ``sharegpt``: 600 Poisson requests with ShareGPT V3 first-turn lengths (prompt + output
  <= 2,048, OPT's context) on one A100 with OPT-13B at utilisation 0.9.

Each point also prints the p99 TTFT and p99 E2E intervals (the per-request cost bound's
p99 below, the best baseline that served every request above). Target there: upper /
lower <= 1.3 at every point.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import lpserve as lp
from lpserve.evaluate.bounds import QUANTILE_KEYS, quantile_intervals
from lpserve.evaluate.interval import optimality_interval
from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

TARGETS = {0.5: 1.15, 1.0: 1.15, 2.0: 1.3}
OTHER_TARGET = 1.3
BASELINES = ("vllm", "vllm+least-outstanding", "sarathi")


def default_points(args) -> list[tuple[str, lp.Instance, float | None]]:
    """The bundled default workload at rate scales ``args.loads``."""
    tr = load_trace(DEFAULT_TRACE)
    t0 = float(tr.arrival_s[0])
    window = tr.window(t0, t0 + args.duration).rebased()
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2)
    out = []
    for load in [float(x) for x in args.loads.split(",")]:
        inst = lp.Instance(trace=window if load == 1.0 else window.scale_rate(load), cluster=cl)
        out.append((f"default load x{load:g}", inst, TARGETS.get(load)))
    return out


def utilization_points(name: str, trace: lp.Trace, cluster: lp.Cluster,
                       utilizations: list[float]) -> list[tuple[str, lp.Instance, float]]:
    """``trace`` on ``cluster`` scaled to each utilisation of the fluid capacity."""
    from lpserve.evaluate.compare import at_load

    base = lp.Instance(trace=trace, cluster=cluster)
    return [(f"{name} utilisation {u:g}", at_load(base, utilization=u)[0], OTHER_TARGET)
            for u in utilizations]


def points(args) -> list[tuple[str, lp.Instance, float | None]]:
    """Every (label, instance, ratio target) of ``args.case``."""
    out = []
    if args.case in ("default", "all"):
        out += default_points(args)
    if args.case in ("mooncake", "all"):
        out += utilization_points("mooncake", lp.bundled_trace("mooncake-conv-5min"),
                                  lp.Cluster(gpu="h100-sxm", llm="llama-3-8b", replicas=4),
                                  [0.5, 0.8])
    if args.case in ("sharegpt", "all"):
        from seeds._common import sharegpt_requests

        out += utilization_points("sharegpt opt-13b", sharegpt_requests(600, 1.0, seed=0),
                                  lp.Cluster(gpu="a100-80gb", llm="opt-13b", replicas=1),
                                  [0.9])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="default", choices=("default", "mooncake", "sharegpt",
                                                          "all"))
    ap.add_argument("--loads", default="0.5,1,2")
    ap.add_argument("--duration", type=float, default=150.0)
    ap.add_argument("--lp-time", type=float, default=20.0, help="cost-lp time limit (s)")
    ap.add_argument("--lp-grid-scale", type=float, default=1.0,
                    help="cost-lp's time step as a multiple of its default; 1 (default): the "
                    "fine grid in two rounds; other values one round, as `lpserve gap`'s "
                    "default (4)")
    ap.add_argument("--search-time", type=float, default=15.0,
                    help="schedule-search time limit (s)")
    ap.add_argument("--target-s", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ok = True
    out = []
    for label, inst, target in points(args):
        t = time.perf_counter()
        totals, tails = {}, {}
        for name in BASELINES:
            r = lp.simulate(inst, name)
            if (r.arrays["status"] == "finished").all():
                totals[name] = float(r.arrays["e2e_s"].sum())
                flat = r.summary(flat=True)
                tails[name] = {k: flat[k] for k in QUANTILE_KEYS}
        lp_options = {} if args.lp_grid_scale == 1.0 else \
            {"dt_scale": args.lp_grid_scale, "window_rounds": 1}
        rec = optimality_interval(inst, lp_time_limit_s=args.lp_time,
                                  search_time_limit_s=args.search_time, policy_totals=totals,
                                  lp_options=lp_options)
        rec["quantiles"] = quantile_intervals(inst, tails)
        wall = time.perf_counter() - t
        rec.update(point=label, wall_s=wall, baselines_mean_s={
            k: v / rec["n_requests"] for k, v in totals.items()})
        out.append(rec)
        met = (target is None or rec["ratio"] <= target) and wall < args.target_s
        ok &= met
        b = "; ".join(f"{x['name']} {x['mean_s']:.4f} s ({x['status']}, {x['wall_s']:.1f} s)"
                      for x in rec["bounds"])
        s = rec["search"]
        print(f"{label}: {rec['n_requests']} requests; lower {rec['lower_mean_s']:.4f} s "
              f"({rec['lower_name']}; {b}); upper {rec['upper_mean_s']:.4f} s "
              f"({rec['upper_name']}; search {s['mean_s']:.4f} s, {s['status']}, "
              f"{s['wall_s']:.1f} s, {s['evaluations']} simulations, engine {s['engine']}, "
              f"{s['router']}); baselines " + ", ".join(f"{k} {v:.4f}" for k, v in
                                                      rec["baselines_mean_s"].items()))
        print(f"FIGURE {label}: mean E2E upper / lower {rec['ratio']:.3f} (target "
              f"{'-' if target is None else f'<= {target:g}'}), wall {wall:.1f} s (target < "
              f"{args.target_s:g} s): {'met' if met else 'MISSED'}", flush=True)
        for key, q in rec["quantiles"].items():
            tail_met = q["ratio"] <= OTHER_TARGET
            ok &= tail_met
            print(f"FIGURE {label}: {key} in [{q['lower_s']:.4f}, {q['upper_s']:.4f}] s "
                  f"({q['upper_name'] or 'no baseline served every request'}), upper / lower "
                  f"{q['ratio']:.3f} (target <= {OTHER_TARGET:g}): "
                  f"{'met' if tail_met else 'MISSED'}", flush=True)
    if args.json:
        print(json.dumps(out, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
