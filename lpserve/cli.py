"""The ``lpserve`` command line.

Each sub-command lives in its own module under :mod:`lpserve.commands` and exposes
``register(subparsers)``. Every command accepts ``--json`` and then prints exactly one
JSON object on stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys

# one module per top-level sub-command, in the order ``--help`` lists them
COMMAND_MODULES: tuple[str, ...] = (
    "lpserve.commands.trace_cmd",
    "lpserve.commands.cost_cmd",
    "lpserve.commands.calibrate_cmd",
    "lpserve.commands.cache_cmd",
    "lpserve.commands.sweep_cmd",
    "lpserve.commands.solve_cmd",
    "lpserve.commands.simulate_cmd",
    "lpserve.commands.gap_cmd",
    "lpserve.commands.capacity_cmd",
    "lpserve.commands.list_cmd",
    "lpserve.commands.compile_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The ``lpserve`` argument parser: ``--version`` and one subcommand per module of
    ``COMMAND_MODULES`` (each adds itself with its ``register``)."""
    parser = argparse.ArgumentParser(
        prog="lpserve",
        description="Principled LLM-serving policies: traces, GPU cost model, simulator, "
        "offline optima and bounds.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit code:
    0 on success, 2 on a bad argument or a user error (one line on stderr, see
    :func:`lpserve.commands.common.run_command`; with ``--json`` also a JSON object with
    its ``error`` on stdout) and when no command is given."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    want_json = "--json" in argv
    err = io.StringIO()
    try:  # a bad argument: argparse names the flag on stderr; exit code 2, also in-process
        with contextlib.redirect_stderr(err) if want_json else contextlib.nullcontext():
            args = parser.parse_args(argv)
    except SystemExit as exc:
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 2
        if want_json:  # the promised JSON object as well, naming what argparse refused
            text = err.getvalue()
            sys.stderr.write(text)
            if code:
                lines = text.strip().splitlines()
                print(json.dumps({"error": "ArgumentError: "
                                           + (lines[-1] if lines else "bad arguments")[:500]}))
        return code
    if args.version:
        from importlib.metadata import version

        print(version("lpserve"))
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from lpserve.commands.common import run_command

    return run_command(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
