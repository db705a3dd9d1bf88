"""``lpserve solve`` and ``lpserve bound``: run a formulation on an instance.

``lpserve solve NAME --instance PATH_OR_NAME [--time-limit S] [--json]`` prints status,
objective, bound, gap and wall time; ``lpserve bound NAME ...`` does the same for the
bound formulations (``schedule-lp``, ``schedule-area``, ``cost-bound``) and also accepts
any formulation, reporting its proven bound. ``--instance`` is a folder or
``instance.toml`` path, a name under ``instances/``, or ``bundled`` (the bundled trace on
``--replicas`` A100 replicas of Llama-2-7B).
"""
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
    """Register ``lpserve solve`` and ``lpserve bound`` (solve a formulation, or compute a
    lower bound, on an instance) on the subcommand parsers ``sub``: its flags and its
    handler."""
    for cmd, help_ in (("solve", "solve a formulation (offline optimum, routing LP) on an "
                                 "instance"),
                       ("bound", "compute a lower bound (LP relaxation, area or cost-model "
                                 "bound) on an instance")):
        p = sub.add_parser(cmd, help=help_, description=help_ + ". Formulations: "
                           "schedule-ip, schedule-lp, schedule-area, cost-bound, "
                           "routing-assignment, routing-fluid.")
        p.add_argument("name", help="formulation name")
        p.add_argument("--instance", required=True, metavar="PATH_OR_NAME",
                       help="instance folder / instance.toml, a name under instances/, "
                       "or 'bundled'")
        p.add_argument("--time-limit", type=positive_number(), default=None, metavar="S",
                       help="time limit in seconds for the whole command, from its start "
                       "(loading, build and solve; default: none)")
        p.add_argument("--replicas", type=int_at_least(1), default=4,
                       help="replicas for --instance bundled (default 4)")
        p.add_argument("--memory-tokens", type=int_at_least(1), default=None,
                       help="KV memory M for the round model when the instance has none")
        p.add_argument("--check", action="store_true",
                       help="also run the formulation's certify and compare with the "
                       "certified value recorded in instance.toml")
        add_json_flag(p)
        p.set_defaults(func=_run)


def _instance(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from lpserve.instance import load_instance

    if args.instance == "bundled":
        from lpserve.cluster import Cluster
        from lpserve.instance import Instance
        from lpserve.trace.loaders import bundled_trace

        if args.replicas < 1:
            raise CLIError(f"--replicas must be >= 1, got {args.replicas}")
        cl = Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=args.replicas)
        return Instance(trace=bundled_trace(), cluster=cl), {}
    return load_instance(args.instance)


def _run(args: argparse.Namespace) -> int:
    import math
    import time

    from lpserve.commands.common import process_age_s
    from lpserve.opt import FORMULATIONS, formulation, solve

    # --time-limit counts from the start of the process: imports and the instance too
    t0 = time.monotonic() - process_age_s()
    if args.name not in FORMULATIONS:
        raise CLIError(f"unknown formulation {args.name!r}; known: "
                       f"{', '.join(sorted(FORMULATIONS))}")
    if args.time_limit is not None and not (args.time_limit > 0
                                            and math.isfinite(args.time_limit)):
        raise CLIError(f"--time-limit must be a finite number of seconds > 0, got "
                       f"{args.time_limit}")
    if args.memory_tokens is not None and args.memory_tokens < 1:
        raise CLIError(f"--memory-tokens must be >= 1, got {args.memory_tokens}")
    inst, spec = _instance(args)
    opts: dict[str, Any] = {}
    if args.memory_tokens is not None:
        opts["memory_tokens"] = args.memory_tokens
    f = formulation(args.name)
    left = None if args.time_limit is None else max(args.time_limit - (time.monotonic() - t0),
                                                     1e-3)
    sol = solve(args.name, inst, time_limit_s=left, **opts)
    out = {k: v for k, v in sol.summary().items() if not isinstance(v, (dict, list))}
    out["command"] = args.command
    out["instance"] = args.instance
    certified = spec.get("optimal", {}).get(args.name)
    if certified is not None:
        out["certified"] = float(certified)
    if args.check:
        out["certify"] = f.certify(f.build(inst, **opts), sol)
        if certified is not None and sol.solved:
            out["matches_certified"] = abs(sol.objective - float(certified)) <= 1e-6 * max(
                1.0, abs(float(certified)))
    if args.json:
        emit_json(out)
    else:
        print(f"{args.name} on {args.instance}")
        print(f"status     {sol.status.value}   ({sol.message})" if sol.message
              else f"status     {sol.status.value}")
        u = sol.objective_units
        print(f"objective  {fmt_num(sol.objective)} {u}")
        print(f"bound      {fmt_num(sol.bound)} {u}")
        print(f"gap        {fmt_num(100 * sol.gap) if sol.gap == sol.gap else '-'} %")
        print(f"wall       {fmt_num(sol.wall_s)} s")
        if certified is not None:
            print(f"certified  {fmt_num(float(certified))} {u}")
        if "certify" in out:
            print("residuals  " + ", ".join(f"{k}={fmt_num(v)}" for k, v in out["certify"].items()))
    if args.check and out.get("matches_certified") is False:
        return 1
    return 0
