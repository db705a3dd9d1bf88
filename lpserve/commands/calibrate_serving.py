"""``lpserve calibrate --serving``: fit the cost model to serving-benchmark results by
simulating the benchmark's own workload (:mod:`lpserve.evaluate.serving_fit`)."""
from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np

from lpserve.commands.common import CLIError, emit_json


def _json_kind(path: Path) -> str:
    """``"bench"`` for a ``vllm bench serve`` result (it has ``input_lens``), else
    ``"table"`` (a serving-run table)."""
    from lpserve.trace.serving_runs import read_json

    doc = read_json(path)
    return "bench" if isinstance(doc, dict) and "input_lens" in doc else "table"


def _stages(args: argparse.Namespace) -> list[Any]:
    """The measured stages of every ``--serving`` path (errors name the path)."""
    from lpserve.trace import TraceError
    from lpserve.trace.serving_requests import load_request_csv, load_vllm_bench_serve
    from lpserve.trace.serving_runs import load_inference_perf, load_serving_runs

    gpu = args.gpu
    for flag, v in (("--max-num-batched-tokens", args.max_num_batched_tokens),
                    ("--max-num-seqs", args.max_num_seqs)):
        if v < 0:
            raise CLIError(f"{flag} must be >= 1 (or 0: vLLM's default for the GPU), got {v}")
    server = {"max_num_batched_tokens": args.max_num_batched_tokens,
              "max_num_seqs": args.max_num_seqs}
    out = []
    try:
        for p in args.serving:
            path = Path(p)
            if path.is_dir():
                out += load_inference_perf(path, gpu=gpu)
            elif path.suffix == ".json" and _json_kind(path) == "bench":
                out += load_vllm_bench_serve(path, gpu=gpu, llm=args.llm, tp=args.tp,
                                             **server)
            elif path.suffix == ".json":
                out += load_serving_runs(path)
            elif path.suffix == ".csv":
                if not args.llm:
                    raise CLIError(f"--serving {p!r}: a per-request CSV needs --llm (the "
                                   "catalog LLM served)")
                out += load_request_csv(path, gpu=gpu, llm=args.llm, tp=args.tp, **server)
            else:
                raise CLIError(f"--serving {p!r}: give an inference-perf run folder "
                               "(exp-config.yaml, results/), a serving-run table or a "
                               "`vllm bench serve --save-detailed` result (.json), or a "
                               "per-request CSV (.csv)")
    except TraceError as exc:
        raise CLIError(str(exc)) from None
    if not out:
        raise CLIError("--serving: no stage found")
    return out


def calibrate_serving(args: argparse.Namespace) -> int:
    """Fit, print the error per figure before and after, write the TOML entry."""
    from lpserve.cost.fit import write_fitted
    from lpserve.evaluate.serving_fit import SERVING_PARAMETERS, fit_serving

    stages = _stages(args)
    llms = sorted({s.llm for s in stages})
    if args.llm and llms != [args.llm]:
        raise CLIError(f"--llm {args.llm!r} but the runs served {', '.join(llms)}")
    params = tuple(s.strip() for s in args.fit.split(",") if s.strip()) if args.fit else \
        SERVING_PARAMETERS
    engine = args.engine or "vllm"
    try:
        fit = fit_serving(stages, params=params, engine=engine,
                          max_stage_s=args.max_stage_s or None)
    except (KeyError, LookupError, ValueError) as exc:
        raise CLIError(str(exc).strip("'\"")) from None
    from lpserve.cost import cost_model

    st0 = stages[0]
    base = cost_model(gpu=st0.gpu, llm=st0.llm, tp=st0.tp, engine=engine)
    err = fit.errors()
    apes = fit.abs_errors()
    entry = {"name": args.name or f"user-serving-{args.gpu}-{llms[0]}", "gpu": args.gpu,
             "llm": llms[0] if len(llms) == 1 else "*", "engine": engine,
             **{k: float(v) for k, v in base.values.items()}, **fit.values,
             "provenance": {
                 "data": ", ".join(args.serving), "date": dt.date.today().isoformat(),
                 "rows": len(stages), "fitted": list(fit.values),
                 "started_from": str(base.calibration.get("name")),
                 "note": "fitted by simulating each stage and matching "
                         + ", ".join(fit.figures),
                 "median_abs_error": float(np.median(apes)),
                 "max_abs_error": float(np.max(apes))}}
    write_fitted([entry], args.out)
    report = {"gpu": args.gpu, "llm": entry["llm"], "engine": engine, "stages": len(stages),
              "saved": args.out, "before": err["before"], "after": err["after"],
              "fitted": {k: {"before": fit.start[k], "after": v} for k, v in fit.values.items()},
              "simulations": fit.evaluations}
    if args.json:
        emit_json(report)
        return 0
    print(f"{len(stages)} measured stages of {entry['llm']} on {args.gpu} (engine {engine}, "
          f"starting from calibration {entry['provenance']['started_from']}; "
          f"{fit.evaluations} simulations)")
    print(f"  {'figure':12s} {'MAPE before':>12s} {'after':>8s}")
    for k, v in err["after"].items():
        print(f"  {k:12s} {err['before'][k]:11.1f}% {v:7.1f}%")
    print("  fitted parameters:")
    for k, v in fit.values.items():
        print(f"    {k:22s} {fit.start[k]:12.6g} -> {v:12.6g}")
    print(f"saved {args.out}; load it with lp.cost_model(gpu={args.gpu!r}, "
          f"llm={entry['llm']!r}, tp={st0.tp}, calibration={args.out!r})")
    return 0
