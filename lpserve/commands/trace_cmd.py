"""``lpserve trace stats``: summary statistics of a trace file or a bundled trace."""
from __future__ import annotations

import argparse

from lpserve.commands.common import add_json_flag, emit_json, fmt_num, int_at_least, positive_number


def register(sub: argparse._SubParsersAction) -> None:
    """Register ``lpserve trace`` (inspect request traces: ``trace stats``) on the subcommand
    parsers ``sub``: its flags and its handler."""
    p = sub.add_parser("trace", help="inspect request traces",
                       description="Inspect request traces.")
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)
    s = tsub.add_parser(
        "stats", help="summary statistics of a trace",
        description="Print request count, duration, arrival rate, token-length percentiles "
        "and, for traces with prefix block ids, distinct blocks and the infinite-cache "
        "prefix hit rate.")
    s.add_argument("path", nargs="?", default=None,
                   help="trace file (plain or .gz) or bundled trace name; default: the "
                   "bundled default trace")
    s.add_argument("--format", default="auto",
                   choices=["auto", "azure", "burstgpt", "mooncake", "lengths"],
                   help="trace format (default: detect from the header)")
    s.add_argument("--sort", action="store_true",
                   help="sort out-of-order arrivals instead of failing (count reported)")
    s.add_argument("--rate", type=positive_number(), default=None, metavar="REQ_PER_S",
                   help="for untimed length tables: Poisson arrival rate (default: all at 0)")
    s.add_argument("--seed", type=int_at_least(0), default=0, help="seed of generated arrivals")
    add_json_flag(s)
    s.set_defaults(func=_stats)


def _stats(args: argparse.Namespace) -> int:
    from lpserve.trace.loaders import DEFAULT_TRACE, load_trace

    path = args.path or DEFAULT_TRACE
    trace = load_trace(path, args.format, sort=args.sort, rate_per_s=args.rate,
                       seed=args.seed)
    st = trace.stats()
    st["path"] = str(path)
    st["format"] = trace.report.format
    st["load_report"] = trace.report.as_dict()
    if args.json:
        emit_json(st)
        return 0
    rep = trace.report
    print(f"trace      {path}  (format {rep.format})")
    print(f"requests   {st['n_requests']:,}   (rows read {rep.n_read:,}, dropped "
          f"{rep.n_dropped:,}, reordered {rep.n_reordered:,})")
    for reason, count in rep.dropped:
        print(f"  dropped  {count:,}  {reason}")
    for label in rep.labels:
        print(f"  {label[0]:<8} {label[1]}")
    print(f"duration   {fmt_num(st['duration_s'])} s")
    print(f"rate       {fmt_num(st['rate_per_s'])} req/s")
    if st.get("interarrival_cv") is not None:
        print(f"inter-arrival CV  {fmt_num(st['interarrival_cv'])}")
    print(f"{'tokens':<10} {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10} {'max':>10}")
    for key in ("prompt_tokens", "output_tokens"):
        d = st[key]
        print(f"{key.split('_')[0]:<10} " + " ".join(
            f"{fmt_num(d[k]):>10}" for k in ("mean", "p50", "p90", "p99", "max")))
    if "infinite_cache_hit_rate" in st:
        print(f"prefix blocks   {st['n_blocks']:,} in total, {st['distinct_blocks']:,} "
              f"distinct ({st['block_tokens']} tokens per block)")
        print(f"infinite-cache prefix hit rate  {100 * st['infinite_cache_hit_rate']:.2f} %")
    for k in ("distinct_session_id", "distinct_program_id", "distinct_tenant"):
        if k in st:
            print(f"{k.replace('distinct_', '').replace('_id', '')}s  {st[k]:,}")
    return 0
