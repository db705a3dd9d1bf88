"""``lpserve calibrate``: fit the cost model to your own measurements and save it."""
from __future__ import annotations

import argparse

from lpserve.commands.common import CLIError, add_json_flag, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve calibrate`` (fit the cost model to measured iterations or vLLM
    benchmark results) on the subcommand parsers ``sub``: its flags and its handler."""
    p = sub.add_parser(
        "calibrate", help="fit the cost model to your measurements (CSV of iterations, vLLM "
        "benchmark JSON)",
        description="Fit the cost model's efficiencies and overheads to measurements of your "
        "own server: a CSV of iterations (time_ms or time_s; prefill_tokens, prefill_cached, "
        "decode_context as ';'-separated token counts; optional tp) and/or the JSON vLLM's "
        "serving benchmark writes (--save-result; per-request results with --save-detailed). "
        "Prints the fit error per phase before and after and the parameters that moved, and "
        "writes a TOML calibration that lp.cost_model(..., calibration=PATH) loads. With "
        "--serving it fits to serving-benchmark results instead (an inference-perf run "
        "folder, a serving-run table, a `vllm bench serve --save-result --save-detailed` "
        "JSON, or a per-request CSV with arrival_s, prompt_tokens, output_tokens, ttft_s, "
        "e2e_s and optionally ok): it rebuilds each stage's workload, simulates it and "
        "matches the measured mean E2E and inter-token latency, then the front end's "
        "latency to the mean TTFT and E2E.")
    p.add_argument("--csv", action="append", default=[], metavar="FILE",
                   help="CSV of iterations (repeatable)")
    p.add_argument("--vllm-json", action="append", default=[], metavar="FILE",
                   help="vLLM serving-benchmark result JSON (repeatable)")
    p.add_argument("--serving", action="append", default=[], metavar="PATH",
                   help="inference-perf run folder, serving-run JSON table, vllm bench serve "
                   "JSON or per-request CSV (repeatable)")
    p.add_argument("--max-num-batched-tokens", type=int, default=0, metavar="N",
                   help="with --serving on a vllm bench JSON or a CSV: the server's token "
                   "budget per iteration (default: vLLM's for the GPU)")
    p.add_argument("--max-num-seqs", type=int, default=0, metavar="N",
                   help="with --serving on a vllm bench JSON or a CSV: the server's "
                   "max_num_seqs (default: vLLM's for the GPU)")
    p.add_argument("--max-stage-s", type=float, default=120.0, metavar="S",
                   help="with --serving: simulate each stage's first S seconds while "
                   "fitting (default 120; 0 for whole stages)")
    p.add_argument("--gpu", required=True, help="catalog GPU the measurements ran on")
    p.add_argument("--llm", default=None, help="catalog LLM measured (required without "
                   "--serving, whose runs name it)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1; a CSV "
                   "'tp' column overrides it per row)")
    p.add_argument("--engine", default=None, help="engine measured (vllm, trtllm, sglang, "
                   "kernels): the profile the fit starts from and the saved entry states")
    p.add_argument("--fit", default=None, metavar="P1,P2",
                   help="parameters to fit (default: those the rows identify)")
    p.add_argument("--name", default=None, help="name of the saved calibration")
    p.add_argument("--out", default="lpserve-calibration.toml", metavar="PATH",
                   help="TOML file to write (default lpserve-calibration.toml)")
    add_json_flag(p)
    p.set_defaults(func=_calibrate)


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def _calibrate(args: argparse.Namespace) -> int:
    from lpserve.cost.fit import write_fitted
    from lpserve.cost.measure import (
        MeasurementError,
        calibrate_to,
        read_iterations_csv,
        read_vllm_benchmark_json,
    )

    if args.serving:
        if args.csv or args.vllm_json:
            raise CLIError("--serving fits by simulation; give it without --csv/--vllm-json")
        from lpserve.commands.calibrate_serving import calibrate_serving

        return calibrate_serving(args)
    if not args.csv and not args.vllm_json:
        raise CLIError("give measurements: --csv FILE and/or --vllm-json FILE, or --serving "
                       "PATH")
    if not args.llm:
        raise CLIError("--llm is required with --csv/--vllm-json")
    rows = []
    try:
        for f in args.csv:
            rows += read_iterations_csv(f, tp=args.tp)
        for f in args.vllm_json:
            rows += read_vllm_benchmark_json(f, tp=args.tp)
    except MeasurementError as exc:
        raise CLIError(str(exc)) from None
    params = tuple(s.strip() for s in args.fit.split(",") if s.strip()) if args.fit else None
    data = ", ".join(args.csv + args.vllm_json)
    try:
        out = calibrate_to(rows, args.gpu, args.llm, tp=args.tp, engine=args.engine,
                           parameters=params, name=args.name, data=data)
    except (KeyError, LookupError) as exc:
        raise CLIError(str(exc).strip("'\"")) from None
    write_fitted([out["entry"]], args.out)
    report = {"gpu": out["entry"]["gpu"], "llm": out["entry"]["llm"], "tp": args.tp,
              "engine": out["entry"]["engine"], "rows": len(rows), "saved": args.out,
              "before": out["before"], "after": out["after"],
              "moved": [{"parameter": k, "before": a, "after": b} for k, a, b in out["moved"]],
              "started_from": out["entry"]["provenance"]["started_from"]}
    if args.json:
        emit_json(report)
        return 0
    print(f"{len(rows)} measured iterations of {report['llm']} on {report['gpu']} "
          f"(engine {report['engine']}, starting from calibration {report['started_from']})")
    print(f"  {'phase':8s} {'rows':>5s}   {'median before':>13s} {'after':>7s}   "
          f"{'max before':>10s} {'after':>7s}")
    for phase, after in out["after"].items():
        before = out["before"][phase]
        print(f"  {phase:8s} {after['n']:5d}   {_pct(before['median_abs']):>13s} "
              f"{_pct(after['median_abs']):>7s}   {_pct(before['max_abs']):>10s} "
              f"{_pct(after['max_abs']):>7s}")
    print("  parameters that moved:")
    for k, a, b in out["moved"]:
        change = (b / a - 1) if a else float("inf") if b else 0.0
        print(f"    {k:22s} {a:12.6g} -> {b:12.6g}  ({100 * change:+.1f}%)")
    print(f"saved {args.out}; load it with lp.cost_model(gpu={report['gpu']!r}, "
          f"llm={report['llm']!r}, tp={args.tp}, calibration={args.out!r})")
    return 0
