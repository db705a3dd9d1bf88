"""``lpserve simulate``: run a policy on a trace and a cluster, print the metrics."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from lpserve.commands.common import (
    MIX_HELP,
    CLIError,
    add_json_flag,
    cluster_from_args,
    emit_json,
    fmt_num,
    int_at_least,
    positive_number,
)


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve simulate`` (simulate a registered policy on a trace) on the
    subcommand parsers ``sub``: its flags and its handler."""
    p = sub.add_parser(
        "simulate", help="simulate a serving policy on a trace",
        description="Simulate a registered policy (engine, scheduler, router) serving a "
        "trace on a cluster, and print latency, throughput and cache metrics.")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace file or bundled trace name (default: the bundled trace)")
    p.add_argument("--gpu", default="a100-80gb", help="catalog GPU (default a100-80gb)")
    p.add_argument("--llm", default="llama-2-7b", help="catalog LLM (default llama-2-7b)")
    p.add_argument("--tp", type=int_at_least(1), default=1, help="tensor-parallel degree per replica")
    p.add_argument("--replicas", type=int_at_least(1), default=None,
                   help="colocated replicas (default 1; not with --prefill/--decode-replicas)")
    p.add_argument("--mix", default=None, metavar="GPU:N[:TP],...", help=MIX_HELP)
    p.add_argument("--prefill-replicas", type=int_at_least(0), default=0,
                   help="prefill replicas (disaggregated; needs --decode-replicas)")
    p.add_argument("--decode-replicas", type=int_at_least(0), default=0, help="decode replicas")
    p.add_argument("--policy", default="vllm", help="registered policy name (default vllm), "
                   "or MODULE:ATTR for your own Policy (or a callable returning one)")
    p.add_argument("--rate-scale", type=positive_number(), default=1.0, metavar="X",
                   help="multiply the arrival rate by X (arrival times divided by X)")
    p.add_argument("--head", type=int_at_least(1), default=None, metavar="N",
                   help="simulate only the first N requests")
    p.add_argument("--horizon", type=positive_number(), default=None, metavar="SECONDS",
                   help="stop starting iterations after this simulated time")
    p.add_argument("--slo-ttft", type=positive_number(allow_inf=True), default=float("inf"), metavar="SECONDS")
    p.add_argument("--slo-tpot", type=positive_number(allow_inf=True), default=float("inf"), metavar="SECONDS")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the policy's randomness")
    p.add_argument("--utilization", type=positive_number(), default=None, metavar="U",
                   help="set the arrival rate to U x the cluster's fluid capacity estimate "
                   "(lpserve.evaluate.utilization) instead of --rate-scale")
    from lpserve.commands.runopts import add_engine_options, add_progress_options

    add_engine_options(p, scoped=False)
    add_progress_options(p)
    add_json_flag(p)
    p.set_defaults(func=_simulate)


def _simulate(args: argparse.Namespace) -> int:
    from lpserve.cluster import Cluster
    from lpserve.instance import SLO, Instance
    from lpserve.registry import policy_names
    from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

    if args.policy not in policy_names() and ":" not in args.policy:
        raise CLIError(f"unknown policy {args.policy!r}; registered: "
                       f"{', '.join(policy_names())} (or MODULE:ATTR for your own)")
    if args.utilization is not None and args.rate_scale != 1.0:
        raise CLIError("--utilization replaces --rate-scale (give one), got "
                       f"--utilization {args.utilization} --rate-scale {args.rate_scale}")
    trace = load_trace(args.trace or DEFAULT_TRACE)
    if args.head is not None:
        trace = trace.head(args.head)
    if args.rate_scale != 1.0:
        trace = trace.scale_rate(args.rate_scale)
    if len(trace) == 0:
        raise CLIError("the trace has no requests")
    disagg = args.prefill_replicas > 0 or args.decode_replicas > 0
    if disagg and args.replicas is not None:
        raise CLIError(f"--replicas {args.replicas} conflicts with --prefill-replicas "
                       f"{args.prefill_replicas} / --decode-replicas {args.decode_replicas}: "
                       "a disaggregated cluster has prefill and decode replicas only; give "
                       "--replicas or the pair")
    if disagg and not (args.prefill_replicas > 0 and args.decode_replicas > 0):
        raise CLIError(f"--prefill-replicas {args.prefill_replicas} and --decode-replicas "
                       f"{args.decode_replicas}: a disaggregated cluster needs both >= 1")
    if disagg and args.mix:
        raise CLIError("--mix (heterogeneous replicas) is colocated only; drop "
                       "--prefill-replicas/--decode-replicas")
    if args.mix and args.replicas is not None:
        raise CLIError(f"--replicas {args.replicas} conflicts with --mix {args.mix!r}: the "
                       "groups give the replica counts")
    if disagg:
        cluster = Cluster(gpu=args.gpu, llm=args.llm, tp=args.tp, replicas=1,
                          prefill_replicas=args.prefill_replicas,
                          decode_replicas=args.decode_replicas)
    else:
        if args.replicas is None:
            args.replicas = 1
        cluster = cluster_from_args(args)
    inst = Instance(trace=trace, cluster=cluster,
                    slo=SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot),
                    horizon_s=args.horizon)
    inst, policy, extra = _prepare(args, inst)
    res = _run(args, inst, policy)
    s = res.summary()
    s.update(policy=args.policy, trace=str(args.trace or DEFAULT_TRACE), gpu=args.gpu,
             llm=args.llm, tp=args.tp, replicas=cluster.n_replicas, cluster=cluster.as_dict(),
             seed=args.seed, digest=res.digest(), **extra)
    if res.stats["offload"]:  # CPU KV offload (models/simulator.md (35))
        s["offload"] = res.stats["offload"]
    if args.json:
        emit_json(s)
        return 0
    load = ("no arrival rate, so no utilisation" if s["utilization"] is None else
            f"utilisation {s['utilization']:.3g} of the fluid capacity "
            f"{s['capacity_rps']:.3g} req/s")
    print(f"policy {args.policy} on {cluster.describe()}"
          f"   trace {s['trace']} (rate x{s['rate_scale']:.4g}, {load})")
    for key in ("engine", "predictor"):
        if s.get(key):
            print(f"{key:<10} {s[key]}")
    print(f"requests   {s['n_requests']:,}  finished {s['n_finished']:,}  rejected "
          f"{s['n_rejected']:,}  unfinished {s['n_unfinished']:,}  preemptions "
          f"{s['preemptions']:,}")
    for reason, count in s["reasons"].items():
        print(f"  {reason:<28} {count:,}")
    print(f"{'metric':<10} {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10}")
    for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        d = s[key]
        print(f"{key:<10} " + " ".join(f"{fmt_num(d[q]):>10}" for q in
                                       ("mean", "p50", "p90", "p99")))
    print(f"throughput {fmt_num(s['throughput_rps'])} req/s   goodput "
          f"{fmt_num(s['goodput_rps'])} req/s   prefix hit rate "
          f"{fmt_num(s['prefix_hit_rate'])}   KV utilization {fmt_num(s['kv_utilization'])}")
    if "offload" in s:
        o = s["offload"]
        print(f"CPU KV offload: {o['tier_blocks']:,} host blocks; {o['hit_tokens']:,} prompt "
              f"tokens found there, {o['loaded_blocks']:,} blocks loaded in "
              f"{fmt_num(o['load_s'])} s; {o['stored_blocks']:,} stored, "
              f"{o['dropped_blocks']:,} dropped")
    print(f"wall       {fmt_num(s['wall_s'])} s")
    for w in s["warnings"]:
        print(f"WARNING: {w}")
    return 0


def _prepare(args: argparse.Namespace, inst: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The instance at its load (``--utilization``), the policy with ``--engine``, and the
    capacity, engine and predictor fields of the output."""
    from lpserve.commands import runopts as ro
    from lpserve.evaluate.specs import apply_engine
    from lpserve.evaluate.utilization import fluid_capacity
    from lpserve.registry import check_predictions, policy_from_spec, policy_names

    scale = args.rate_scale
    if args.utilization is not None:  # a load needs the capacity: its errors are the user's
        try:
            scale = fluid_capacity(inst).load_for(args.utilization)
        except ValueError as exc:
            raise CLIError(f"--utilization {args.utilization}: {exc}") from None
        inst = inst.with_(trace=inst.trace.scale_rate(scale))
        args.rate_scale = scale
    # the utilisation is reported when the trace has an arrival rate (two or more requests
    # over a positive duration); a trace without one still simulates, its utilisation None
    rate = inst.trace.rate_per_s if len(inst.trace) >= 2 else float("nan")
    cap = fluid_capacity(inst) if rate > 0 else None
    overrides = ro.engine_mapping(args.engine, [args.policy])
    if any(isinstance(v, dict) for v in overrides.values()):
        raise CLIError("--engine of simulate takes KEY=VALUE (one policy), not POLICY:KEY=VALUE")
    try:
        policy = apply_engine(policy_from_spec(args.policy), overrides, where="--engine")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    pred = ro.predictor_spec(args.predictor)
    if args.policy in policy_names():
        ro.check_predictions([args.policy], inst.trace, pred)
    else:  # a user's policy: its own meta says whether it reads predictions
        check_predictions(inst, policy, pred is not None)
    ro.warn([w for w in [ro.context_warning(inst.trace, args.llm)] if w],
            quiet=args.json)
    return inst, policy, {"rate_scale": float(scale),
                          "utilization": None if cap is None else cap.utilization(1.0),
                          "capacity_rps": None if cap is None else cap.capacity_rps,
                          "capacity": None if cap is None else cap.as_dict(),
                          "engine": overrides, "predictor": pred}


def _run(args: argparse.Namespace, inst: Any, policy: Any) -> Any:
    """The simulation, with a progress bar of routed requests on a terminal."""
    from lpserve.commands.runopts import Reporter
    from lpserve.evaluate.progress import counting
    from lpserve.registry import simulate

    rep = Reporter(len(inst.trace), 1, f"simulate {args.policy}",
                   quiet=args.json or args.quiet or not sys.stderr.isatty())
    try:
        return simulate(inst, counting(policy, rep.on_requests if rep.bar else None),
                        seed=args.seed, predictor=args.predictor)
    finally:
        rep.close()
