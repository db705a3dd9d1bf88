"""``lpserve list gpus|llms|policies|formulations|traces|engine|engine-profiles|predictors``:
the names every other command accepts, with what each one is."""
from __future__ import annotations

import argparse
from typing import Any, Callable

from lpserve.commands.common import add_json_flag, emit_json, fmt_num

WHAT = ("gpus", "llms", "policies", "formulations", "traces", "engine", "engine-profiles",
        "predictors")


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve list`` (the names other commands accept) on the subcommand
    parsers ``sub``: its argument and its handler."""
    p = sub.add_parser(
        "list", help="the names other commands accept (GPUs, LLMs, policies, ...)",
        description="List catalog GPUs (memory, bandwidth, FLOP/s), LLMs (shape, context "
        "length), registered policies (kind, engine, what they read), formulations, "
        "bundled traces, the EngineConfig parameters --engine sets, the cost model's "
        "engine profiles (calibrations: engine, era, data, date, fitted terms), and the "
        "predictors "
        "--predictor names. Registered policies set their own engine parameters "
        "(`lpserve list policies` shows batching and token budget, and which of them the "
        "engine sets by the cluster's GPU).")
    p.add_argument("what", choices=WHAT, help="what to list")
    add_json_flag(p)
    p.set_defaults(func=_list)


def _gpus() -> list[dict[str, Any]]:
    from lpserve.cost.catalog import get_gpu, gpu_names

    return [{"name": k, "memory_gib": g.memory_gib, "bf16_tflops": g.bf16_tflops,
             "fp8_tflops": g.fp8_tflops, "hbm_gbps": g.hbm_gbps, "nvlink_gbps": g.nvlink_gbps,
             "pcie_gbps": g.pcie_gbps, "description": g.name}
            for k in gpu_names() for g in [get_gpu(k)]]


def _llms() -> list[dict[str, Any]]:
    from lpserve.cost.catalog import get_llm, llm_names

    out = []
    for k in llm_names():
        m = get_llm(k)
        out.append({"name": k, "params_b": m.n_params / 1e9, "layers": m.layers,
                    "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
                    "experts": m.experts, "dtype": m.dtype,
                    "max_context": m.max_context,
                    "kv_kib_per_token": m.layers * m.kv_elems_per_token_layer
                    * m.kv_dtype_bytes / 1024, "source": m.source})
    return out


def _policies() -> list[dict[str, Any]]:
    from lpserve.evaluate.lineup import BASELINES, SOLVED_POLICIES, describe_policy
    from lpserve.registry import engine_note, make_policy, policy_names

    def engine_cells(pol: Any) -> dict[str, Any]:
        # fields the engine sets by the cluster's GPU when a run starts (Policy.bind); the
        # values shown are its fallback for an unknown device
        e, hd = pol.engine, pol.hardware_defaults
        return {"batching": e.batching, "chunked_prefill": bool(e.chunked_prefill),
                "max_num_batched_tokens": e.max_num_batched_tokens,
                "set_by_gpu": ",".join(sorted(hd.fields)) if hd is not None else None}

    out = []
    for name in policy_names():
        pol = make_policy(name)
        note = engine_note(name)
        out.append({"name": name,
                    "kind": "baseline" if name in BASELINES else
                    ("principled" if pol.meta.claims else "other"),
                    "clairvoyant": bool(pol.meta.clairvoyant),
                    "reads_predictions": bool(pol.reads_predictions), **engine_cells(pol),
                    "claims": len(pol.meta.claims),
                    "engine": "vllm's" if note is None else "own",
                    "description": describe_policy(pol)
                    + (f". Engine not vllm's: {note}" if note else "")})
    solved_engine = engine_cells(make_policy("vllm"))  # solved_policy's engine
    for name, text in SOLVED_POLICIES.items():
        out.append({"name": name, "kind": "principled (solved on the instance)",
                    "clairvoyant": False, "reads_predictions": False, **solved_engine,
                    "claims": 0, "engine": "vllm's", "description": text})
    return out


def _formulations() -> list[dict[str, Any]]:
    from lpserve.opt import FORMULATIONS, formulation

    out = []
    for name in sorted(FORMULATIONS):
        f = formulation(name)
        out.append({"name": name, "bound": bool(f.is_bound),
                    "exports": f.export is not None,
                    "module": FORMULATIONS[name].split(":")[0]})
    return out


def _traces() -> list[dict[str, Any]]:
    from lpserve.trace.loaders import BUNDLED, FORMATS, load_trace

    out = []
    for name, (_, fmt, desc) in BUNDLED.items():
        tr = load_trace(name)
        out.append({"name": name, "format": fmt, "n_requests": len(tr),
                    "duration_s": tr.duration_s, "rate_per_s": tr.rate_per_s,
                    "prompt_tokens_max": int(tr.prompt_tokens.max()),
                    "prefix_blocks": bool(tr.has_blocks),
                    "predictions": tr.predicted_lo is not None, "description": desc})
    out.append({"name": "(a file)", "format": "|".join(FORMATS), "n_requests": None,
                "duration_s": None, "rate_per_s": None, "prompt_tokens_max": None,
                "prefix_blocks": None, "predictions": None,
                "description": "any trace file of these formats (plain or .gz), by path"})
    return out


def _engine() -> list[dict[str, Any]]:
    from dataclasses import fields

    from lpserve.policy import EngineConfig
    from lpserve.policy.engine import ENGINE_TEXT_FIELDS

    out = []
    for f in fields(EngineConfig):
        kind = ENGINE_TEXT_FIELDS.get(f.name)
        out.append({"name": f.name, "EngineConfig default": f.default,
                    "values": "|".join(kind) if isinstance(kind, tuple) else
                    (kind or "object (Python only)")})
    return out


def _engine_profiles() -> list[dict[str, Any]]:
    from lpserve.cost.calibration import calibrations, era_of

    out = []
    for e in calibrations():
        pv = e.get("provenance", {})
        out.append({"name": e["name"], "engine": e["engine"], "gpu": e["gpu"],
                    "llm": e["llm"], "era": era_of(e), "date": pv.get("date"),
                    "median_abs_error": pv.get("median_abs_error"),
                    "fitted": ", ".join(pv.get("fitted", [])),
                    "frontend_latency_s": float(e.get("frontend_latency_s", 0.0)),
                    "source": f"{pv.get('data', '')}: {pv.get('note', '')}"})
    return out


def _predictors() -> list[dict[str, Any]]:
    from lpserve.policies.predictors import PREDICTORS, predictor_parameters

    return [{"name": name, "clairvoyant": bool(cls.meta.clairvoyant),
             "parameters": predictor_parameters(name),
             "description": " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
             .replace("``", "")}
            for name, cls in PREDICTORS.items()]


LISTS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "gpus": _gpus, "llms": _llms, "policies": _policies, "formulations": _formulations,
    "traces": _traces, "engine": _engine, "engine-profiles": _engine_profiles,
    "predictors": _predictors}


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return fmt_num(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items()) or "-"
    return str(v)


def _list(args: argparse.Namespace) -> int:
    rows = LISTS[args.what]()
    if args.json:
        emit_json({"what": args.what, "items": rows})
        return 0
    cols = list(rows[0])
    last = cols[-1] if cols[-1] in ("description", "source") else None
    head = [c for c in cols if c != last]
    cells = [[_cell(r[c]) for c in head] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(head)]
    print("  ".join(f"{c:<{w}}" for c, w in zip(head, widths)) + (f"  {last}" if last else ""))
    for r, cs in zip(rows, cells):
        print("  ".join(f"{c:<{w}}" for c, w in zip(cs, widths))
              + (f"  {_cell(r[last])}" if last else ""))
    return 0
