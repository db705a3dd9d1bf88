"""``lpserve cache``: hit rates of KV evictors and offline bounds on a block-id trace."""
from __future__ import annotations

import argparse
import time

from lpserve.commands.common import CLIError, add_json_flag, emit_json, int_at_least, name_list

DEFAULT_POLICIES = ("infinite", "lp", "lp-rounded", "foo-l", "belady", "belady-prefix", "lru",
                    "radix-lru", "lfu", "prefix-lru", "gdsf", "session", "lookahead",
                    "knapsack")


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve cache`` (KV prefix-cache hit rates of evictors and bounds on a trace)
    on the subcommand parsers ``sub``: its flags and its handler."""
    p = sub.add_parser(
        "cache", help="KV prefix-cache hit rates of evictors and bounds",
        description="Replay a trace with prefix block ids through KV-cache evictors and "
        "offline bounds (cold start, prefix-closed hits, capacity in blocks kept between "
        "requests). Hit rate = hit blocks / prompt blocks.")
    p.add_argument("--trace", default=None,
                   help="trace file or bundled trace name (default: mooncake-conv-5min)")
    p.add_argument("--capacity-blocks", type=int_at_least(1), required=True, metavar="N",
                   help="cache capacity in blocks")
    p.add_argument("--block-tokens", type=int_at_least(1), default=None,
                   help="tokens per block; must match the trace's block size (Mooncake: 512)")
    p.add_argument("--policies", type=name_list, default=",".join(DEFAULT_POLICIES),
                   help="comma-separated evictors and bounds (default: all)")
    add_json_flag(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from lpserve.evaluate.cache import policy_names
    from lpserve.opt import cache_flow as cf
    from lpserve.trace.loaders import load_trace

    trace = load_trace(args.trace or "mooncake-conv-5min")
    if args.block_tokens is not None and trace.has_blocks and \
            args.block_tokens != trace.block_tokens:
        raise CLIError(f"--block-tokens {args.block_tokens} does not match the trace's "
                       f"{trace.block_tokens}-token blocks")
    if args.capacity_blocks < 1:
        raise CLIError(f"--capacity-blocks must be >= 1, got {args.capacity_blocks}")
    names = list(args.policies)
    known = [*policy_names(), "foo-l"]
    bad = [x for x in names if x not in known]
    if bad:
        raise CLIError(f"unknown policies {bad}; known: {known}")
    acc = cf.block_accesses(trace)
    rows = _quiet(_rows, acc, names, args.capacity_blocks)
    out = {"trace": trace.name, "n_requests": len(trace), "accesses": acc.n_accesses,
           "block_tokens": trace.block_tokens, "capacity_blocks": args.capacity_blocks,
           "results": rows}
    if args.json:
        emit_json(out)
        return 0
    print(f"trace {trace.name}: {len(trace):,} requests, {acc.n_accesses:,} blocks of "
          f"{trace.block_tokens} tokens; capacity {args.capacity_blocks:,} blocks")
    print(f"{'policy':<15}{'hit rate':>10}{'tokens saved':>15}{'time':>9}")
    for d in rows:
        tok = d["prefill_tokens_saved"]
        print(f"{d['policy']:<15}{100 * d['hit_rate']:>9.2f}%"
              f"{(f'{tok:,}' if tok is not None else '-'):>15}{d['wall_s']:>8.2f}s")
    return 0


def _rows(acc, names: list[str], capacity_blocks: int) -> list[dict]:
    from lpserve.evaluate.cache import replay_accesses
    from lpserve.opt import cache_flow as cf

    rows = []
    for name in names:
        t0 = time.perf_counter()
        if name == "foo-l":  # prefix-unaware flow bound: FOO-L on the block sequence
            sol = cf.foo(acc.request, acc.key, [1] * acc.n_accesses, [1] * acc.n_accesses,
                         capacity_blocks)
            hits = acc.n_accesses - sol.info["compulsory_cost"] - sol.bound
            rows.append({"policy": name, "hit_rate": hits / acc.n_accesses, "hits": hits,
                         "prefill_tokens_saved": None, "wall_s": time.perf_counter() - t0})
            continue
        d = replay_accesses(acc, capacity_blocks, name).as_dict()
        d["wall_s"] = time.perf_counter() - t0
        rows.append(d)
    return rows


def _quiet(fn, *a):
    """Run ``fn`` with file descriptor 1 silenced (HiGHS prints a banner from C++)."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return fn(*a)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
