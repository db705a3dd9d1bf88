"""``lpserve cost``: iteration time of one batch under the calibrated GPU cost model."""
from __future__ import annotations

import argparse

from lpserve.commands.common import CLIError, add_json_flag, emit_json, fmt_num, int_at_least


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve cost`` (the cost model's iteration time of one batch on a GPU) on the
    subcommand parsers ``sub``: its flags and its handler."""
    p = sub.add_parser(
        "cost", help="iteration time of a batch on a GPU (cost model)",
        description="Print the time of one iteration of a prefill batch (--prefill N "
        "[--batch B]: B prompts of N tokens) or a decode batch (--decode-batch B --context C) "
        "on one replica, with its parts (linear, attention, communication, overhead) and "
        "whether each is compute- or memory-bound.")
    p.add_argument("--gpu", default="a100-80gb", help="catalog GPU (default a100-80gb)")
    p.add_argument("--llm", default="llama-2-7b", help="catalog LLM (default llama-2-7b)")
    p.add_argument("--tp", type=int_at_least(1), default=1, help="tensor-parallel degree 1/2/4/8")
    p.add_argument("--prefill", type=int, default=None, metavar="N",
                   help="tokens per prompt of a prefill batch")
    p.add_argument("--cached", type=int, default=0, metavar="P",
                   help="tokens of each prompt already in the KV cache (default 0)")
    p.add_argument("--batch", type=int, default=1, metavar="B", help="prompts in the prefill batch")
    p.add_argument("--decode-batch", type=int, default=None, metavar="B",
                   help="requests in a decode batch")
    p.add_argument("--context", type=int, default=None, metavar="C",
                   help="context tokens of each decode request")
    p.add_argument("--dtype", default=None, choices=["fp16", "bf16", "fp8"],
                   help="weight dtype (default: the catalog's)")
    p.add_argument("--engine", default=None, help="engine profile: vllm, trtllm, sglang or "
                   "kernels (default: the package's default calibration)")
    p.add_argument("--calibration", default=None, metavar="NAME|PATH",
                   help="a shipped calibration's name or a TOML file from `lpserve calibrate`")
    add_json_flag(p)
    p.set_defaults(func=_cost)


def _positive(name: str, value: int | None, minimum: int = 1) -> int:
    if value is None or value < minimum:
        raise CLIError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def _cost(args: argparse.Namespace) -> int:
    from lpserve.cost import cost_model

    if (args.prefill is None) == (args.decode_batch is None):
        raise CLIError("give either --prefill N [--batch B] or --decode-batch B --context C")
    kw = {"dtype": args.dtype} if args.dtype else {}
    if args.calibration:
        kw["calibration"] = args.calibration
    try:
        model = cost_model(gpu=args.gpu, llm=args.llm, tp=args.tp, engine=args.engine, **kw)
    except LookupError as exc:
        raise CLIError(str(exc)) from None
    if args.prefill is not None:
        n = _positive("--prefill", args.prefill)
        b = _positive("--batch", args.batch)
        cached = _positive("--cached", args.cached, 0)
        batch = {"prefill_tokens": [n] * b, "prefill_cached": [cached] * b, "decode_context": []}
        shape = {"phase": "prefill", "prefill_tokens": n, "prefill_cached": cached, "batch": b}
    else:
        b = _positive("--decode-batch", args.decode_batch)
        if args.context is None:
            raise CLIError("--decode-batch needs --context C")
        c = _positive("--context", args.context, 0)
        batch = {"prefill_tokens": [], "prefill_cached": [], "decode_context": [c] * b}
        shape = {"phase": "decode", "batch": b, "context": c}
    parts = model.breakdown(**batch)
    out = {"gpu": model.gpu.key, "llm": model.llm.key, "tp": model.tp, "dtype": model.dtype,
           "engine": model.engine, "calibration": model.calibration.get("name"), **shape, **parts}
    if args.json:
        emit_json(out)
        return 0
    print(f"{model.llm.key} on {model.gpu.key} x{model.tp} ({model.dtype}), engine "
          f"{model.engine}, calibration {out['calibration']}: {shape['phase']} batch of {b}")
    print(f"  iteration time   {fmt_num(parts['time_s'] * 1e3)} ms")
    for part, bound in (("linear", "linear_bound"), ("attention", "attention_bound"),
                        ("communication", "communication_bound"), ("overhead", None)):
        tag = f"  ({parts[bound]}-bound)" if bound and parts[bound] != "none" else ""
        print(f"  {part:<16} {fmt_num(parts[part + '_s'] * 1e3)} ms{tag}")
    print(f"  roofline bound   {fmt_num(parts['roofline_s'] * 1e3)} ms")
    return 0
