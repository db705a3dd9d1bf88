"""``lpserve gap``: how far serving heuristics are from the lower bounds.

Simulates the baseline heuristics and the principled policies on a trace, cluster and load,
computes the lower bounds that apply (the cost-model bound for the GPU cost model: per
request TTFT, TPOT and end-to-end, and the KV-memory term on mean end-to-end latency),
asserts that no bound is above any simulated value of the same metric, and prints the gap
table, a robustness view over workloads (consecutive windows of the trace) and loads, and
writes a report folder (Markdown, CSV, PNG plots).

Exit status: 0 on success, 2 on bad input, 3 when a lower bound is above a simulated value
(a bug in the simulator or in the bound; the message names the policy, bound and values).
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from lpserve.commands.common import (
    MIX_HELP,
    CLIError,
    add_json_flag,
    cluster_from_args,
    emit_json,
    fmt_num,
    int_at_least,
    md_table,
    name_list,
    positive_number,
    seed_list,
)
from lpserve.commands.gap_interval import (
    add_interval_args,
    optimality_intervals,
    print_interval,
    violated,
    write_interval,
)
from lpserve.commands.gap_run import (
    gap_run,
    load_label,
    load_name,
    nest_run,
    print_run_summary,
    rejected_title,
)

#: the default workload is the first DEFAULT_DURATION_S seconds of the bundled trace (and
#: DEFAULT_WINDOWS - 1 further windows for the robustness view), to finish within a minute
DEFAULT_DURATION_S = 150.0
DEFAULT_WINDOWS = 2
DEFAULT_LOADS = "0.5,1.0,2.0"
TABLE_COLUMNS = (  # (frame column, terminal header, Markdown header)
    ("ttft_s_mean", "TTFT mean s", "TTFT mean (s)"), ("ttft_s_p50", "p50", "TTFT p50 (s)"),
    ("ttft_s_p99", "p99", "TTFT p99 (s)"),
    ("tpot_s_mean", "TPOT mean s", "TPOT mean (s)"), ("tpot_s_p50", "p50", "TPOT p50 (s)"),
    ("tpot_s_p99", "p99", "TPOT p99 (s)"),
    ("e2e_s_mean", "E2E mean s", "E2E mean (s)"), ("e2e_s_p50", "p50", "E2E p50 (s)"),
    ("e2e_s_p99", "p99", "E2E p99 (s)"),
    ("goodput_rps", "goodput req/s", "goodput (req/s)"),
    ("prefix_hit_rate", "hit rate", "prefix hit rate"),
    ("n_rejected", "rejected", "rejected"), ("preemptions", "preempt", "preemptions"),
    ("bound_value", "bound", "bound"), ("ratio_to_bound", "ratio", "ratio to bound"),
    ("e2e_s_p99_over_p50", "P99/P50", "E2E P99/P50"),
)


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve gap`` (the gap of the serving heuristics to the lower bounds) on the
    subcommand parsers ``sub``: its flags and its handler."""
    p = sub.add_parser(
        "gap", help="gap of serving heuristics to lower bounds (table, robustness, report)",
        description="Simulate baseline heuristics (round robin / JSQ routing, FCFS vLLM "
        "scheduling, LRU eviction, fixed-budget chunked prefill) and principled policies on "
        "a trace, compute the lower bounds that apply, assert that no bound exceeds a "
        "simulated value, and print the gap table and a robustness view over workloads "
        "and loads; write a report folder with Markdown, CSV and PNG plots. Without "
        f"--trace: the first {DEFAULT_DURATION_S:g} s of the bundled trace. Exit status 3 "
        "when a bound is violated.")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace file or bundled trace name (default: the bundled trace, "
                   f"first {DEFAULT_DURATION_S:g} s)")
    p.add_argument("--duration", type=positive_number(), default=None, metavar="SECONDS",
                   help="length of each workload window (default: "
                   f"{DEFAULT_DURATION_S:g} s for the bundled default, else the whole trace)")
    p.add_argument("--full", action="store_true",
                   help="use the whole trace as one workload (no windows)")
    p.add_argument("--windows", type=int_at_least(1), default=DEFAULT_WINDOWS, metavar="N",
                   help="consecutive windows of --duration used as workloads in the "
                   f"robustness view (default {DEFAULT_WINDOWS}); the table uses the first")
    p.add_argument("--gpu", default="a100-80gb", help="catalog GPU (default a100-80gb)")
    p.add_argument("--llm", default="llama-2-7b", help="catalog LLM (default llama-2-7b)")
    p.add_argument("--tp", type=int_at_least(1), default=1, help="tensor-parallel degree per replica")
    p.add_argument("--replicas", type=int_at_least(1), default=2, help="colocated replicas (default 2)")
    p.add_argument("--mix", default=None, metavar="GPU:N[:TP],...", help=MIX_HELP)
    p.add_argument("--load", type=positive_number(), default=1.0, metavar="X",
                   help="load of the table: a rate scale, arrival rate x X (default 1.0), or a "
                   "utilisation with --load-unit utilization")
    p.add_argument("--loads", default=DEFAULT_LOADS, metavar="X,Y,...",
                   help=f"loads of the sweep, in --load-unit (default rate scales {DEFAULT_LOADS}); --load "
                   "is added when missing")
    p.add_argument("--policies", type=name_list, default=None, metavar="A,B,...",
                   help="policies to compare: registered names, lp-index, lp-split, "
                   "lp-locality (default: baselines + principled policies available)")
    p.add_argument("--bounds", default="cost-bound", metavar="A,B,...",
                   help="lower bounds to compute (default cost-bound; 'none' for none)")
    p.add_argument("--check-bound", action="append", default=[], metavar="METRIC=VALUE",
                   help="a lower bound computed elsewhere for the table's instance, e.g. "
                   "e2e_s_mean=2.5; asserted like the others (repeatable)")
    p.add_argument("--metric", default="e2e_s_mean",
                   help="metric of the ratio to the bound (default e2e_s_mean)")
    p.add_argument("--slo-ttft", type=positive_number(allow_inf=True), default=1.0, metavar="SECONDS",
                   help="TTFT target for goodput (default 1.0 s)")
    p.add_argument("--slo-tpot", type=positive_number(allow_inf=True), default=0.1, metavar="SECONDS",
                   help="TPOT target for goodput (default 0.1 s)")
    p.add_argument("--seeds", type=seed_list, default="0", metavar="S,T,...",
                   help="simulation seeds; metrics are averaged over them (default 0)")
    add_interval_args(p)
    p.add_argument("--out", default="lpserve-report", metavar="DIR",
                   help="report folder (default lpserve-report/)")
    _register_run_options(p)
    add_json_flag(p)
    p.set_defaults(func=_gap)


def _register_run_options(p: argparse.ArgumentParser) -> None:
    """Engine parameters, predictors, load unit, comparison set, checkpoints, progress."""
    from lpserve.commands.runopts import add_engine_options, add_progress_options

    add_engine_options(p)
    p.add_argument("--shared-engine", default=None, metavar="POLICY|own",
                   help="the engine every registered policy runs on: POLICY's, as it runs "
                   "on the cluster (default: the first baseline's, vllm's in the default "
                   "set), each keeping its own decisions (preemption by rank, hooks; an "
                   "engine baseline such as sarathi keeps its whole engine); 'own' runs each "
                   "on the engine it is registered with (`lpserve list policies` says why "
                   "they differ). --engine applies after it")
    p.add_argument("--load-unit", default="scale", choices=("scale", "utilization"),
                   help="what --load and --loads mean: a rate scale (x the trace's arrival "
                   "rate, default) or a utilisation of the cluster's fluid capacity "
                   "estimate (lpserve.evaluate.utilization: cost-model prefill and decode "
                   "GPU-seconds per request; 1.0 = where that model saturates)")
    p.add_argument("--over", default="common", choices=("common", "served"),
                   help="requests the latency columns, bounds and ratios cover: those every "
                   "policy served (default) or those each policy served")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="checkpoint folder: each simulation is stored when it ends and a "
                   "rerun with the same inputs loads it, so an interrupted run resumes "
                   "(default: OUT/checkpoints)")
    p.add_argument("--no-checkpoint", action="store_true", help="store no checkpoints")
    add_progress_options(p)


# ------------------------------------------------------------------------ arguments
def _floats(text: str, flag: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CLIError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not vals or not all(math.isfinite(v) and v > 0 for v in vals):
        raise CLIError(f"{flag} must hold numbers > 0, got {text!r}")
    return vals


def _claimed(items: list[str]) -> Any:
    """The ``--check-bound`` values as a ClaimedBound (None when there are none)."""
    from lpserve.evaluate import ClaimedBound

    out = {}
    for it in items:
        key, sep, val = it.partition("=")
        try:
            out[key.strip()] = float(val)
        except ValueError:
            sep = ""
        if not sep:
            raise CLIError(f"--check-bound must look like METRIC=VALUE, got {it!r}")
    return ClaimedBound("claimed", out) if out else None


def _workloads(args: argparse.Namespace) -> tuple[list[tuple[str, Any]], str]:
    """[(label, window trace)] and a note on the slicing."""
    from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

    trace = load_trace(args.trace or DEFAULT_TRACE)
    if len(trace) == 0:
        raise CLIError("the trace has no requests")
    if args.windows < 1:
        raise CLIError(f"--windows must be >= 1, got {args.windows}")
    duration = args.duration
    if duration is None and args.trace is None and not args.full:
        duration = DEFAULT_DURATION_S
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise CLIError(f"--duration must be > 0 seconds, got {duration}")
    if args.full or duration is None or duration >= trace.duration_s:
        return [(trace.name, trace)], (f"whole trace {trace.name}: {len(trace):,} requests "
                                       f"over {trace.duration_s:.0f} s")
    t0 = float(trace.arrival_s[0])
    out = []
    for k in range(args.windows):
        lo = t0 + k * duration
        if lo > float(trace.arrival_s[-1]):
            break
        w = trace.window(lo, lo + duration)
        if len(w) >= 2:
            out.append((f"{trace.name}[{k * duration:g}-{(k + 1) * duration:g}s]", w.rebased()))
    note = (f"workload = {len(out)} consecutive {duration:g}-s window(s) of {trace.name} "
            f"({', '.join(f'{len(w):,}' for _, w in out)} of {len(trace):,} requests over "
            f"{trace.duration_s:.0f} s); the table uses the first"
            + ("" if args.trace or args.duration else "; --full for the whole trace"))
    return out, note


# ------------------------------------------------------------------------ command
def _gap(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    from lpserve.evaluate import METRIC_KEYS, BoundViolation, default_policies, resolve_bounds
    from lpserve.evaluate.compare import SOLVED_POLICIES
    from lpserve.instance import SLO, Instance
    from lpserve.registry import policy_names

    loads = sorted(set(_floats(args.loads, "--loads")) | set(_floats(str(args.load), "--load")))
    seeds = list(args.seeds)
    claimed = _claimed(args.check_bound)
    bounds = [] if args.bounds.strip() in ("", "none") else \
        [b.strip() for b in args.bounds.split(",") if b.strip()]
    resolve_bounds(bounds)  # unknown names fail before any simulation
    if args.metric not in (*METRIC_KEYS, "total_latency_s"):
        raise CLIError(f"--metric must be one of {', '.join(METRIC_KEYS)}, total_latency_s; "
                       f"got {args.metric!r}")
    workloads, note = _workloads(args)
    cluster = cluster_from_args(args)
    slo = SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)
    if args.policies:
        policies = list(args.policies)
        known = set(policy_names()) | set(SOLVED_POLICIES)
        bad = [x for x in policies if x not in known]
        if bad:
            raise CLIError(f"unknown policies {bad}; registered: {', '.join(policy_names())}; "
                           f"solved: {', '.join(SOLVED_POLICIES)}")
    else:
        policies = default_policies(cluster.n_replicas)
    run = gap_run(args, workloads, cluster, slo, policies, loads, seeds)
    cases = [(wl, load, Instance(trace=tr if run.scale[wl, load] == 1.0 else
                                 tr.scale_rate(run.scale[wl, load]), cluster=cluster, slo=slo))
             for wl, tr in workloads for load in loads]
    main_case = (workloads[0][0], args.load)
    try:
        tables, frames, skipped = _run_cases(cases, main_case, policies, bounds, claimed,
                                             seeds, args, run)
    except BoundViolation as exc:
        run.reporter.close()
        return violated(exc, args)
    finally:
        run.reporter.close()
    import pandas as pd

    runs = pd.concat(frames, ignore_index=True)
    try:
        intervals = optimality_intervals(cases, workloads[0][0], runs, args)
    except BoundViolation as exc:
        return violated(exc, args)
    from lpserve.evaluate import common_cases, robustness_summary

    # aggregates (robustness, load curves, gap bars) compare policies on the same cases
    same, dropped = common_cases(runs, case=("workload", "load"))
    robust = robustness_summary(same, args.metric, case=("workload", "load"))
    table = tables[main_case]
    sim_s = float(runs["wall_s"].sum())
    note = "\n".join([note, *run.notes])
    files = _write_report(Path(args.out), table, runs, same, robust, note, args, cluster,
                          loads, skipped, run)
    files += write_interval(Path(args.out), intervals, runs, workloads[0][0], args, cluster)
    wall = time.perf_counter() - t_start
    out = _json(table, runs, robust, note, args, cluster, loads, policies, seeds, files, wall,
                sim_s)
    out.update(skipped=skipped, interval=intervals, **run.json())
    if args.json:
        emit_json(out)
        return 0
    _print(table, robust, note, args, cluster, files, wall, sim_s, len(cases), skipped)
    print_interval(intervals, runs, workloads[0][0], args.load_unit)
    print_run_summary(run, runs)
    return 0


def _run_cases(cases, main_case, policies, bounds, claimed, seeds, args, run):
    """compare() on every (workload, load) case; the claimed bound joins the main case."""
    import warnings

    from lpserve.commands.runopts import warn
    from lpserve.evaluate import compare
    from lpserve.evaluate.specs import RejectionWarning

    tables, frames, skipped = {}, [], []
    for wl, load, inst in cases:
        b = list(bounds)
        if claimed is not None and (wl, load) == main_case:
            b.append(claimed)
        case = f"{wl}, {run.load_name(load)}"
        run.reporter.case = case
        with warnings.catch_warnings():  # printed below, once, without a source line
            warnings.simplefilter("ignore", RejectionWarning)
            df = compare(inst, policies, b, seeds, metric=args.metric, skip_unavailable=True,
                         **run.compare_options())
        warn([f"{w} ({case})" for w in df.attrs["warnings"]], quiet=args.json)
        for label, reason in df.attrs["skipped"].items():
            skipped.append({"workload": wl, "load": load, "policy": label, "reason": reason})
            for _ in seeds:  # keep the progress bar's count
                run.reporter.on_requests(len(inst.trace))
        run.warnings += [f"{w} ({case})" for w in df.attrs["warnings"]]
        tables[(wl, load)] = df
        long = df.copy()
        long.attrs = {}
        long.insert(0, "utilization", run.utilization[wl, load])
        long.insert(0, "rate_scale", run.scale[wl, load])
        long.insert(0, "load", load)
        long.insert(0, "workload", wl)
        frames.append(long)
    return tables, frames, skipped


# ------------------------------------------------------------------------ output
def _header(args: argparse.Namespace, cluster: Any, note: str) -> list[str]:
    return [f"cluster {cluster.describe()}; "
            f"SLO TTFT <= {args.slo_ttft:g} s, TPOT <= {args.slo_tpot:g} s; "
            f"table at {load_name(args.load_unit, args.load)}",
            *note.split("\n")]


def _bound_note(table: Any, args: argparse.Namespace) -> str:
    s = table.attrs["samples"]
    common = table.attrs.get("over", "common") == "common"
    n = int(table["n_requests"].iloc[0]) if len(table) else 0
    scope = (f"latency columns, 'bound' and 'ratio' over the {s.n_common:,} of {n:,} requests "
             "every policy served (--over common)" if common else
             "latency columns, 'bound' and 'ratio' over the requests each policy served "
             "(--over served: a policy that rejects or starves the hard requests looks "
             "faster)")
    return (f"{scope}; 'bound' = the largest lower bound on {args.metric}; 'ratio' = "
            f"{args.metric} / bound; 'rejected' = requests the engine refused (counted in "
            "goodput, not in latencies); P99/P50 of end-to-end latency as a stability "
            f"diagnostic; lower-bound rows over the {s.n_common:,} requests every policy "
            "finished. Every bound is asserted <= every policy's value of the same metric "
            "over the same requests.")


def _bound_rows(table: Any) -> list[tuple[str, dict[str, float]]]:
    return [(f"lower bound: {name}", vals)
            for name, vals in table.attrs["samples"].bound_values.items()]


def _print(table, robust, note, args, cluster, files, wall, sim_s, n_cases, skipped) -> None:
    for line in _header(args, cluster, note):
        print(line)
    w = max(24, *(len(p) + 1 for p in table["policy"]))
    widths = [max(9, len(h) + 1) for _, h, _ in TABLE_COLUMNS]

    def line(label: str, values: list[float]) -> str:
        return f"{label:<{w}}" + "".join(f"{fmt_num(v):>{k}}" for v, k in zip(values, widths))

    print(f"{'policy':<{w}}" + "".join(f"{h:>{k}}" for (_, h, _), k in
                                       zip(TABLE_COLUMNS, widths)))
    for name, vals in _bound_rows(table):
        print(line(name, [vals.get(c, float("nan")) for c, _, _ in TABLE_COLUMNS]))
    for _, r in table.iterrows():
        print(line(r["policy"], [float(r[c]) for c, _, _ in TABLE_COLUMNS]))
    print(_bound_note(table, args))
    print("engines (exactly as each row ran; 'X's' = X's engine with the row's own "
          "decisions, --shared-engine):")
    for _, r in table.iterrows():
        print(f"  {r['policy']} [{r['engine_from']}]: {r['engine']}")
    rej = table[table["n_rejected"] > 0]
    for _, r in rej.iterrows():
        print(f"  {r['policy']}: {int(r['n_rejected'])} of {int(r['n_requests'])} requests "
              f"rejected by the engine ({r['rejection_reasons']})")
    m = args.metric
    print(f"\nrobustness: {m} over the cases (workload windows x loads {args.loads}) that "
          "every policy ran")
    for sk in skipped:
        print(f"  left out at {sk['workload']}, {load_name(args.load_unit, sk['load'])} "
              "(so this case is out "
              f"of the robustness view and plots): {sk['reason']}")
    print(f"{'policy':<{w}}{'cases':>6}{'mean':>10}{'std':>10}{'min':>10}{'max':>10}"
          f"{'ratio mean':>12}{'ratio max':>11}  worst case")
    for _, r in robust.iterrows():
        print(f"{r['policy']:<{w}}{int(r['n_cases']):>6}"
              + "".join(f"{fmt_num(r[f'{m}_{k}']):>10}" for k in ("mean", "std", "min", "max"))
              + f"{fmt_num(r['ratio_to_bound_mean']):>12}{fmt_num(r['ratio_to_bound_max']):>11}"
              f"  {r['worst_case']}")
    print(f"\nreport: {args.out}/ ({', '.join(Path(f).name for f in files)})")
    print(f"wall {wall:.1f} s ({n_cases} cases, simulation {sim_s:.1f} s)")


def _write_report(out: Path, table, runs, same, robust, note, args, cluster, loads,
                  skipped, run=None) -> list[str]:
    """Markdown, CSV (all runs) and PNG plots (aggregates over the common cases ``same``)."""
    from lpserve.evaluate.plots import (
        metric_label,
        plot_gap_to_bound,
        plot_latency_cdf,
        plot_latency_vs_load,
    )

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"--out {str(out)!r}: cannot create the report folder ({exc})") from None
    files = []
    flat = table.copy()
    flat.attrs = {}
    flat.to_csv(out / "gap_table.csv", index=False)
    runs.to_csv(out / "runs.csv", index=False)
    robust.to_csv(out / "robustness.csv", index=False)
    files += [str(out / n) for n in ("gap_table.csv", "runs.csv", "robustness.csv")]
    header = ["policy", "kind"] + [md for _, _, md in TABLE_COLUMNS]
    rows = [[name, "bound"] + [fmt_num(v.get(c, float("nan"))) for c, _, _ in TABLE_COLUMNS]
            for name, v in _bound_rows(table)]
    rows += [[r["policy"], r["kind"]] + [fmt_num(float(r[c])) for c, _, _ in TABLE_COLUMNS]
             for _, r in table.iterrows()]
    m = args.metric
    rrows = [[r["policy"], str(int(r["n_cases"]))]
             + [fmt_num(r[f"{m}_{k}"]) for k in ("mean", "std", "min", "max")]
             + [fmt_num(r["ratio_to_bound_mean"]), fmt_num(r["ratio_to_bound_max"]),
                r["worst_case"]] for _, r in robust.iterrows()]
    md = ["# lpserve gap report", "", *[f"- {x}" for x in _header(args, cluster, note)], "",
          "## Gap table", "", md_table(header, rows), _bound_note(table, args), "",
          "Policies (router / scheduler / evictor / the engine exactly as it ran; 'X's "
          "engine' = X's engine with the row's own decisions, --shared-engine):", "",
          *[f"- `{r['policy']}` ({r['kind']}, {r['engine_from']} engine): {r['description']}"
                             for _, r in table.iterrows()], "",
          f"## Robustness ({m} over workloads x loads {', '.join(f'{x:g}' for x in loads)})",
          "", "Over the cases every policy ran"
          + (" (left out: " + "; ".join(f"{k['workload']} at "
                                        f"{load_name(args.load_unit, k['load'])}: "
                                        f"{k['reason']}" for k in skipped) + ")"
             if skipped else "") + "; all runs are in `runs.csv`.", "",
          md_table(["policy", "cases", "mean", "std", "min", "max", "ratio mean",
                     "ratio max", "worst case"], rrows),
          *(["## Warnings", "", *[f"- {w}" for w in run.warnings], ""]
            if run is not None and run.warnings else []),
          "## Plots", "", "![latency CDF](latency_cdf.png)", "",
          "![latency vs load](latency_vs_load.png)", "", "![gap to bound](gap_to_bound.png)",
          ""]
    (out / "gap_table.md").write_text("\n".join(md))
    files.insert(0, str(out / "gap_table.md"))
    setup = cluster.describe()
    n_wl = same["workload"].nunique()
    figs = {
        "latency_cdf.png": plot_latency_cdf(
            table, ("ttft_s", "e2e_s"),
            title=f"Latency CDFs: {table.attrs['samples'].n_common:,} requests, {setup}, "
            f"{load_name(args.load_unit, args.load)}\n{rejected_title(table)}"),
        "latency_vs_load.png": plot_latency_vs_load(
            same, m, title=f"{metric_label(m).split(' (')[0].capitalize()} vs load\n{setup}; "
            f"band: min-max over {n_wl} workload(s)\n{rejected_title(same)}",
            x_label=load_label(args)),
        "gap_to_bound.png": plot_gap_to_bound(
            same, title=f"Gap to the lower bound ({m})\n{setup}; whiskers: "
            f"min-max over {same.groupby(['workload', 'load']).ngroups} case(s)\n"
            f"{rejected_title(same)}"),
    }
    for name, fig in figs.items():
        fig.savefig(out / name, dpi=110)
        files.append(str(out / name))
    return files


def _nest(row: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        d[k] = {q: float(row[f"{k}_{q}"]) for q in ("mean", "p50", "p90", "p99")}
    for k in ("throughput_rps", "goodput_rps", "prefix_hit_rate", "total_latency_s",
              "e2e_s_p99_over_p50", "ttft_s_p99_over_p50", "bound_value", "ratio_to_bound",
              "wall_s"):
        d[k] = float(row[k])
    for k in ("n_requests", "n_finished", "n_rejected", "n_unfinished", "preemptions"):
        d[k] = int(round(float(row[k])))
    d["bound_name"] = row["bound_name"]
    d.update(nest_run(row))
    return d


def _json(table, runs, robust, note, args, cluster, loads, policies, seeds, files, wall, sim_s):
    s = table.attrs["samples"]
    rows = [{"policy": r["policy"], "kind": r["kind"], "description": r["description"],
             "engine": r["engine"], "engine_from": r["engine_from"], **_nest(r)}
            for _, r in table.iterrows()]
    sweep = [{"workload": r["workload"], "load": float(r["load"]), "policy": r["policy"],
              **_nest(r)} for _, r in runs.iterrows()]
    return {
        "trace": args.trace or "azure-conv-10min", "workload": note,
        "cluster": cluster.as_dict(), "slo": {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot},
        "load": args.load, "loads": loads, "seeds": seeds, "metric": args.metric,
        "policies": policies,
        "bounds": {"n_requests": s.n_common, "values": s.bound_values},
        "table": rows, "robustness": robust.to_dict(orient="records"), "sweep": sweep,
        "report": {"dir": str(args.out), "files": files}, "sim_s": sim_s, "wall_s": wall,
    }


# ------------------------------------------------------------------------ optimality interval
