"""The optimality interval of ``lpserve gap``: per load, the best certified lower bound
(cost-bound, srpt-bound, cost-lp) and the best offline schedule found (schedule search),
with every policy placed between them; its options, terminal lines, report section and
plot (``models/cost-lp.md``, ``models/schedule-search.md``)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from lpserve.commands.common import CLIError, emit_json, fmt_num, md_table
from lpserve.commands.gap_run import load_label, load_name, load_tag

__all__ = ["EXIT_BOUND_VIOLATED", "add_interval_args", "optimality_intervals", "print_interval",
           "violated", "write_interval"]

EXIT_BOUND_VIOLATED = 3  # exit code of lpserve gap when a policy beats a lower bound
#: default simulations of the schedule search per load: the five seed orders on the first
#: engine x router, then the other 11 engine x router pairs of the best seed
SEARCH_EVALUATIONS = 16
#: cost-lp's default time limit per load (s) and time step (a multiple of the LP's own
#: default), solved in one round (no widened windows): on the bundled default workload
#: the coarse LP takes 3-7 s per load (build included) and certifies 2.775 / 3.034 /
#: 3.575 s mean at x0.5 / x1 / x2 in `lpserve gap`, where the fine grid certifies 2.791 /
#: 3.036 / 3.399 s, each stopped by its 20 s
LP_TIME_LIMIT_S = 10.0
LP_GRID_SCALE = 4.0


def add_interval_args(p: argparse.ArgumentParser) -> None:
    """Add the interval's options (bound and search time limits, ``--no-interval``) to
    ``lpserve gap``'s parser ``p``."""
    p.add_argument("--no-interval", dest="interval", action="store_false",
                   help="skip the optimality interval (best lower bound, best offline "
                   "schedule) of each load")
    p.add_argument("--bound-time-limit", type=float, default=LP_TIME_LIMIT_S,
                   metavar="SECONDS",
                   help="time limit of the cost-model LP bound (cost-lp) at each load "
                   f"(default {LP_TIME_LIMIT_S:g} s; at the limit the best certified bound "
                   "is kept and its status says limit)")
    p.add_argument("--lp-grid-scale", type=float, default=LP_GRID_SCALE, metavar="K",
                   help="cost-lp's time step as a multiple of its default (the median "
                   "least latency / 5, up to 4x finer below 200 requests); default "
                   f"{LP_GRID_SCALE:g}: a smaller LP that certifies within the limit on ~600 "
                   "requests, solved in one round. 1 is the fine grid with two rounds "
                   "(slower; with --bound-time-limit 20 it certifies more at light load). "
                   "Every grid gives a valid bound (models/cost-lp.md section 5)")
    p.add_argument("--search-evaluations", type=int, default=SEARCH_EVALUATIONS,
                   metavar="N", help="simulations of the offline schedule search per load "
                   f"(default {SEARCH_EVALUATIONS}: every seed order, then every engine x "
                   "router of the best seed; a fixed count keeps the report the same on "
                   "every machine)")
    p.add_argument("--search-time-limit", type=float, default=60.0, metavar="SECONDS",
                   help="wall-time cap of the schedule search per load (default 60 s; a "
                   "search stopped by it says so in its status)")


def violated(exc: Any, args: argparse.Namespace) -> int:
    """Report a :class:`~lpserve.evaluate.BoundViolation` (one JSON object with ``--json``,
    one line on stderr) and return :data:`EXIT_BOUND_VIOLATED`."""
    if args.json:
        emit_json({"error": f"BoundViolation: {exc}", "policy": exc.policy,
                   "bound": exc.bound, "metric": exc.metric,
                   "bound_value": exc.bound_value, "policy_value": exc.policy_value})
    print(f"lpserve gap: error: bound violated: {exc}", file=sys.stderr)
    return EXIT_BOUND_VIOLATED


def optimality_intervals(cases, workload, runs, args) -> list[dict[str, Any]]:
    """:func:`lpserve.evaluate.interval.optimality_interval` at every load of the table's
    workload; each policy that finished every request must lie at or above the lower end
    (BoundViolation otherwise). Empty with ``--no-interval``."""
    if not args.interval:
        return []
    for flag in ("bound_time_limit", "search_time_limit", "lp_grid_scale"):
        v = getattr(args, flag)
        if v is not None and not (math.isfinite(v) and v > 0):
            unit = "" if flag == "lp_grid_scale" else " seconds"
            raise CLIError(f"--{flag.replace('_', '-')} must be > 0{unit}, got {v}")
    if args.search_evaluations < 1:
        raise CLIError(f"--search-evaluations must be an integer >= 1, got "
                       f"{args.search_evaluations}")
    from lpserve.evaluate import check_bound
    from lpserve.evaluate.bounds import QUANTILE_KEYS, quantile_intervals
    from lpserve.evaluate.interval import LOWER_BOUNDS, fitting_subset, optimality_interval

    out = []
    for wl, load, inst in cases:
        if wl != workload:
            continue
        n_fit = int(fitting_subset(inst)[1].sum())
        rows = runs[(runs["workload"] == wl) & (runs["load"] == load)]
        # a policy that finished every fitting request, by its total over all of them
        # (total_latency_s covers only the requests every policy finished)
        totals = {r["policy"]: float(r["served_total_latency_s"]) for _, r in rows.iterrows()
                  if int(round(float(r["n_finished"]))) == n_fit and _plain(r["policy"])}
        # tail values only where the row's latency columns cover every fitting request
        tails = {r["policy"]: {k: float(r[k]) for k in QUANTILE_KEYS}
                 for _, r in rows.iterrows() if r["policy"] in totals
                 and int(round(float(r["n_compared"]))) == n_fit}
        rec = optimality_interval(inst, lp_time_limit_s=args.bound_time_limit,
                                  search_time_limit_s=args.search_time_limit,
                                  search_evaluations=args.search_evaluations,
                                  policy_totals=totals, lower=LOWER_BOUNDS,
                                  lp_options=_lp_options(args))
        rec["quantiles"] = quantile_intervals(inst, tails)
        for name, v in totals.items():
            check_bound(policy=name, bound=rec["lower_name"] or "interval",
                        bound_values={"total_latency_s": rec["lower_s"]},
                        policy_values={"total_latency_s": v}, seed=0, n_requests=n_fit,
                        scope=f"every request, {load_name(args.load_unit, load)}")
        rec["load"] = load
        rec["policies"] = {k: {"total_s": v, "over_lower": v / rec["lower_s"],
                               "over_upper": v / rec["upper_s"]} for k, v in totals.items()}
        out.append(rec)
    return out


def _lp_options(args: argparse.Namespace) -> dict[str, Any]:
    """cost-lp's build options for ``--lp-grid-scale``: the coarse default grid in one
    round; the fine grid (scale 1) with the LP's own two rounds."""
    if args.lp_grid_scale == 1.0:
        return {}
    return {"dt_scale": args.lp_grid_scale, "window_rounds": 1}


def _plain(label: str) -> bool:
    """Whether a policy label is one whose schedules the interval covers (no speculative
    decoding: the bounds' proofs count one token per iteration)."""
    from lpserve.registry import make_policy, policy_names

    if label not in policy_names():
        return True
    return make_policy(label).engine.speculation is None


#: the line that says the cost-model LP certified no bound within its time limit
LP_LEFT_OUT = ("cost-lp (the time-indexed LP bound, models/cost-lp.md) certified no bound "
               "within --bound-time-limit: a larger limit or a coarser grid (--lp-grid-scale) "
               "may")


def _lp_left_out(intervals: list[dict[str, Any]]) -> bool:
    return any(not math.isfinite(b["total_s"]) for r in intervals for b in r["bounds"]
               if b["name"] == "cost-lp")


def quotable(r: dict[str, Any], name: str, load_unit: str) -> str:
    """The sentence a reader can quote about policy ``name`` at one load of the interval
    ``r``: a valid schedule is never below the optimum, and the optimum lies in
    ``[lower, upper]``, so the policy is between ``max(1, value / upper)`` and
    ``value / lower`` times the optimum."""
    p = r["policies"][name]
    lo, hi = max(1.0, p["over_upper"]), p["over_lower"]
    where = load_name(load_unit, r["load"])
    if hi <= 1.0 + 1e-9:
        return f"{name} is optimal at {where} (mean end-to-end latency)"
    return (f"{name} is within {hi:.3g}x of optimal at {where} (mean end-to-end latency; "
            f"at least {lo:.3g}x)")


def _interval_lines(intervals: list[dict[str, Any]], load_unit: str) -> list[str]:
    lines = []
    for r in intervals:
        b = "; ".join(f"{x['name']} {fmt_num(x['mean_s'])} s ({x['status']}, "
                      f"{x['wall_s']:.1f} s)" for x in r["bounds"])
        s = r["search"]
        lines.append(f"{load_name(load_unit, r['load'])}: optimum in "
                     f"[{fmt_num(r['lower_mean_s'])}, "
                     f"{fmt_num(r['upper_mean_s'])}] s mean e2e (upper / lower "
                     f"{fmt_num(r['ratio'])}); lower: {b}; upper: {r['upper_name']} "
                     f"(schedule search {fmt_num(s['mean_s'])} s, {s['status']}, "
                     f"{s['wall_s']:.1f} s, {s['evaluations']} simulations)")
        lines.append("  " + _tail_line(r))
        if r["policies"]:
            lines.append("  " + quotable(r, next(iter(r["policies"])), load_unit))
    return lines


def _tail_line(r: dict[str, Any]) -> str:
    """The tail intervals of one load (p99 TTFT, p99 E2E)."""
    parts = []
    for key, label in (("ttft_s_p99", "p99 TTFT"), ("e2e_s_p99", "p99 E2E")):
        q = r.get("quantiles", {}).get(key)
        if q is None:
            continue
        up = (f"{fmt_num(q['upper_s'])}] s ({q['upper_name']}; upper / lower "
              f"{fmt_num(q['ratio'])})" if q["upper_name"] else
              "?] s (no simulated policy served every request)")
        parts.append(f"{label} optimum in [{fmt_num(q['lower_s'])}, {up}")
    return "; ".join(parts) + " (lower: the per-request cost bound's p99)"


def print_interval(intervals: list[dict[str, Any]], runs: Any, workload: str,
                   load_unit: str = "scale") -> None:
    """Print the interval per load (lower end, upper end, their ratio, each bound's status,
    the first policy's quotable sentence) and every policy's place in it, for ``workload``
    of ``runs`` (loads in ``load_unit``: ``"scale"`` or ``"utilization"``)."""
    if not intervals:
        return
    print("\noptimality interval (mean end-to-end latency over every request; the optimum "
          "of the simulator's non-speculative schedules lies inside):")
    for line in _interval_lines(intervals, load_unit):
        print("  " + line)
    if _lp_left_out(intervals):
        print("  " + LP_LEFT_OUT)
    r = max(intervals, key=lambda x: x["load"])
    print(f"{'policy':<26}" + "".join(f"{load_tag(load_unit, x['load']) + ' /lower':>13}"
                                       f"{'/upper':>8}" for x in intervals))
    for name in r["policies"]:
        cells = ""
        for x in intervals:
            p = x["policies"].get(name)
            cells += (f"{fmt_num(p['over_lower']):>13}{fmt_num(p['over_upper']):>8}" if p
                      else f"{'-':>13}{'-':>8}")
        print(f"{name:<26}{cells}")


def write_interval(out: Path, intervals, runs, workload, args, cluster) -> list[str]:
    """``interval.csv``, ``interval_vs_load.png`` and a section of ``gap_table.md``."""
    if not intervals:
        return []
    import pandas as pd

    from lpserve.evaluate.plots import plot_interval_vs_load

    flat = [{"load": r["load"], "lower_mean_s": r["lower_mean_s"], "lower": r["lower_name"],
             "upper_mean_s": r["upper_mean_s"], "upper": r["upper_name"], "ratio": r["ratio"],
             **{f"{b['name']}_mean_s": b["mean_s"] for b in r["bounds"]},
             **{f"{b['name']}_status": b["status"] for b in r["bounds"]},
             **{f"{b['name']}_wall_s": b["wall_s"] for b in r["bounds"]},
             "search_mean_s": r["search"]["mean_s"], "search_status": r["search"]["status"],
             "search_wall_s": r["search"]["wall_s"],
             **{f"{k}_{end}": q[f"{end}_s"] for k, q in r.get("quantiles", {}).items()
                for end in ("lower", "upper")},
             **{f"{k}_upper_by": q["upper_name"] for k, q in r.get("quantiles", {}).items()}}
            for r in intervals]
    pd.DataFrame(flat).to_csv(out / "interval.csv", index=False)
    pts: dict[str, list] = {}
    for r in intervals:
        for name, p in r["policies"].items():
            pts.setdefault(name, []).append((r["load"], p["total_s"] / r["n_requests"]))
    fig = plot_interval_vs_load(intervals, pts, title=f"Policies against the optimality "
                                f"interval\n{cluster.n_replicas} x {args.gpu} / {args.llm}",
                                x_label=load_label(args))
    fig.savefig(out / "interval_vs_load.png", dpi=110)
    rows = [[load_tag(args.load_unit, r["load"]), fmt_num(r["lower_mean_s"]), r["lower_name"],
             fmt_num(r["upper_mean_s"]), r["upper_name"], fmt_num(r["ratio"]),
             "; ".join(f"{b['name']} {b['status']} {b['wall_s']:.1f} s" for b in r["bounds"]),
             f"{r['search']['status']} {r['search']['wall_s']:.1f} s"] for r in intervals]
    pol = sorted({k for r in intervals for k in r["policies"]})
    prow = [[k] + [fmt_num(r["policies"][k]["over_lower"]) + " / "
                   + fmt_num(r["policies"][k]["over_upper"]) if k in r["policies"] else "-"
                   for r in intervals] for k in pol]
    md = ["", "## Optimality interval", "",
          "The optimum of the simulator's non-speculative schedules (mean end-to-end latency "
          "over every request) lies between the best valid lower bound (`cost-lp`, "
          "`srpt-bound`: models/cost-lp.md; `cost-bound`: models/lower-bounds.md) and the best offline schedule found "
          "(`schedule-search`: static priority orders, models/schedule-search.md) or "
          "simulated policy. Status `limit`: the time limit stopped the solver; the "
          "bound kept is the best certified one."
          + (" " + LP_LEFT_OUT + "." if _lp_left_out(intervals) else ""), "",
          md_table(["load", "lower (s)", "by", "upper (s)", "by", "upper / lower",
                     "bounds (status, wall)", "search (status, wall)"], rows),
          "Tails (the per-request cost bound's p99 below, the best simulated policy's "
          "above, over every fitting request):", "",
          *[f"- {load_tag(args.load_unit, r['load'])}: {_tail_line(r)}." for r in intervals],
          "", "Each policy as value / lower and value / upper:", "",
          md_table(["policy"] + [load_tag(args.load_unit, r["load"]) for r in intervals], prow),
          *[f"- {quotable(r, next(iter(r['policies'])), args.load_unit)}." for r in intervals
            if r["policies"]], "",
          "![interval vs load](interval_vs_load.png)", ""]
    with open(out / "gap_table.md", "a") as fh:
        fh.write("\n".join(md))
    return [str(out / "interval.csv"), str(out / "interval_vs_load.png")]
