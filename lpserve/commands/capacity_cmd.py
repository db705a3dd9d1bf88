"""``lpserve capacity``: the highest load at which a policy meets p99 TTFT and TPOT SLOs."""
from __future__ import annotations

import argparse
from typing import Any

from lpserve.commands.common import (
    CLIError,
    add_json_flag,
    emit_json,
    fmt_num,
    int_at_least,
    positive_number,
)


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve capacity`` (the highest load that meets the p99 TTFT and TPOT SLOs)
    on the subcommand parsers ``sub``: its flags and its handler."""
    p = sub.add_parser(
        "capacity", help="find the highest load meeting p99 TTFT and TPOT SLOs",
        description="Bisect the arrival-rate multiplier of a trace for the highest load at "
        "which a policy keeps the p99 TTFT (over all requests; unfinished ones count as "
        "misses) and the p99 TPOT within the SLOs. Each replication (a window of the "
        "trace) is searched on its own; the result is their mean with a Student-t "
        "confidence interval, beside the predicted stability capacity "
        "(lpserve.evaluate.stability.predict_capacity).")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="trace file or bundled trace name (default: the bundled trace)")
    p.add_argument("--policy", default="vllm", help="registered policy name (default vllm)")
    p.add_argument("--gpu", default="a100-80gb", help="catalog GPU (default a100-80gb)")
    p.add_argument("--llm", default="llama-2-7b", help="catalog LLM (default llama-2-7b)")
    p.add_argument("--tp", type=int_at_least(1), default=1, help="tensor-parallel degree per replica")
    p.add_argument("--replicas", type=int_at_least(1), default=1, help="colocated replicas")
    p.add_argument("--slo-ttft", type=float, required=True, metavar="SECONDS",
                   help="p99 time-to-first-token objective")
    p.add_argument("--slo-tpot", type=float, required=True, metavar="SECONDS",
                   help="p99 time-per-output-token objective")
    p.add_argument("--replications", type=int, default=3, metavar="R",
                   help="split the trace into R consecutive windows, one search each "
                   "(default 3)")
    p.add_argument("--head", type=int_at_least(1), default=None, metavar="N",
                   help="use only the first N requests of the trace")
    p.add_argument("--start", type=float, default=1.0, metavar="X",
                   help="first load multiplier tried (default 1)")
    p.add_argument("--rel-tol", type=float, default=0.02,
                   help="stop bisecting when hi/lo <= 1 + rel-tol (default 0.02)")
    p.add_argument("--confidence", type=float, default=0.95,
                   help="level of the confidence interval (default 0.95)")
    p.add_argument("--drain", type=positive_number(), default=None, metavar="SECONDS",
                   help="horizon after the last arrival (default max(30, 10 x TTFT SLO))")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the policy's randomness")
    from lpserve.commands.runopts import add_engine_options

    add_engine_options(p, scoped=False)
    add_json_flag(p)
    p.set_defaults(func=_capacity)


def _capacity(args: argparse.Namespace) -> int:
    from lpserve.cluster import Cluster
    from lpserve.evaluate.capacity import capacity
    from lpserve.evaluate.stability import predict_capacity
    from lpserve.instance import SLO, Instance
    from lpserve.registry import policy_names
    from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

    if args.policy not in policy_names():
        raise CLIError(f"unknown policy {args.policy!r}; registered: "
                       f"{', '.join(policy_names())}")
    if args.replications < 1:
        raise CLIError(f"--replications must be >= 1, got {args.replications}")
    for name in ("slo_ttft", "slo_tpot", "rel_tol", "start"):
        if not getattr(args, name) > 0:
            raise CLIError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    trace = load_trace(args.trace or DEFAULT_TRACE)
    if args.head is not None:
        trace = trace.head(args.head)
    R = args.replications
    if len(trace) < 2 * R:
        raise CLIError(f"the trace has {len(trace)} requests: too few for {R} replications "
                       "(at least 2 each)")
    edges = [round(k * len(trace) / R) for k in range(R + 1)]
    cluster = Cluster(gpu=args.gpu, llm=args.llm, tp=args.tp, replicas=args.replicas)
    slo = SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)
    insts = [Instance(trace=trace.slice(edges[k], edges[k + 1]).rebased(), cluster=cluster,
                      slo=slo) for k in range(R)]
    policy, extra = _policy(args, trace)
    res = capacity(insts, policy, start=args.start, rel_tol=args.rel_tol,
                   confidence=args.confidence, drain_s=args.drain, seed=args.seed,
                   predictor=args.predictor)
    pred = predict_capacity(Instance(trace=trace, cluster=cluster, slo=slo), policy)
    out = res.as_dict()
    out.update(trace=str(args.trace or DEFAULT_TRACE), gpu=args.gpu, llm=args.llm,
               tp=args.tp, replicas=cluster.n_replicas, replications=R,
               trace_rate_rps=float(trace.rate_per_s), predicted=pred, **extra,
               rule="per-replication bisection on the rate multiplier; mean with a "
                    "two-sided Student-t interval")
    if args.json:
        emit_json(out)
        return 0
    lo, hi = res.ci
    print(f"policy {args.policy} on {cluster.n_replicas} x {args.gpu} / {args.llm} tp={args.tp}"
          f"   trace {out['trace']} ({len(trace):,} requests, {fmt_num(trace.rate_per_s)} "
          f"req/s), {R} replication(s)")
    for key in ("engine", "predictor"):
        if out.get(key):
            print(f"{key:<10} {out[key]}")
    print(f"SLO p99 TTFT <= {fmt_num(args.slo_ttft)} s, p99 TPOT <= {fmt_num(args.slo_tpot)} s")
    print(f"capacity   load x{fmt_num(res.load)}  ({fmt_num(res.rate_rps)} req/s)   "
          f"{int(args.confidence * 100)}% CI [{fmt_num(lo)}, {fmt_num(hi)}]   "
          f"min x{fmt_num(res.min_load)}  max x{fmt_num(res.max_load)}")
    print("per replication " + "  ".join(f"x{fmt_num(c)}" for c in res.per_replication)
          + f"   ({len(res.runs)} simulations, {fmt_num(res.wall_s)} s, "
            f"{res.monotone_violations} monotonicity violations)")
    print(f"predicted stability capacity {fmt_num(pred['rate_rps'])} req/s "
          f"(binding: {pred['binding']}; Nie-Si-Zhou memory term "
          f"{fmt_num(pred['mem_rps'])} req/s)")
    return 0


def _policy(args: argparse.Namespace, trace: Any) -> tuple[Any, dict[str, Any]]:
    """The policy with ``--engine`` applied, ``--predictor`` validated against it and the
    trace, and the engine and predictor fields of the output."""
    from lpserve.commands import runopts as ro
    from lpserve.evaluate.specs import apply_engine
    from lpserve.registry import make_policy

    overrides = ro.engine_mapping(args.engine, [args.policy])
    if any(isinstance(v, dict) for v in overrides.values()):
        raise CLIError("--engine of capacity takes KEY=VALUE (one policy), not "
                       "POLICY:KEY=VALUE")
    try:
        policy = apply_engine(make_policy(args.policy), overrides, where="--engine")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    pred = ro.predictor_spec(args.predictor)
    ro.check_predictions([args.policy], trace, pred)
    return policy, {"engine": overrides, "predictor": pred}
