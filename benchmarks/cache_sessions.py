"""KV hit rates on composed agentic coding sessions: LRU, the session-aware evictors,
Belady, the prefix LP and the hindsight TTL ceiling.

Composition (``lpserve.trace.sessions``): the kv-cache-tester sessions of
``../shared/traces/kv_cache_tester_sessions_part1.jsonl.gz`` (the bundled 43-session slice
without ``../shared``) are split at random (seed 0) into a fit half and a held-out half.
For each session-start rate, the fit half is placed on one clock by Poisson session starts
(seed 1) and the held-out half by Poisson starts at the same rate (seed 2); each keeps its
own gaps, and only requests of the first ``--horizon-s`` seconds are kept. The
session-aware evictors start from the wait statistics of the fit stream
(``fit_wait_stats``) and keep learning online; ttl-pin's duel (``models/kv-sessions.md``
(4b)) also starts from the state it ends in on the fit stream at the same capacity
(``fit_duel_state``: leader and evidence), and ``ttl-pin cold`` is the same evictor with
its duel started from nothing (LRU leading). Every figure is on the held-out stream.

Per capacity it prints the hit rate (blocks of 64 tokens found in the cache / blocks
sent) of: LRU; the earlier knapsack and session evictors; ttl-pin, reuse-decay, tail-lru
and return-knapsack; Belady (farthest next use, shallow first) and Belady-prefix (deepest
first); the prefix-LP upper bound (on segments); the infinite cache; the hindsight-best
TTL per wait kind (``cache_online_ceiling.best_ttl``: occupancy held to the capacity,
prefix closure ignored, tuned on the held-out stream itself). ``LRU/B`` is LRU over the
better Belady; ``closed`` is the share of the LRU-to-Belady gap ttl-pin closes
(ttl-pin, fixed before the held-out run, is the evictor the target is checked on).

First it runs the evictors on the Mooncake conversation slice (see :func:`mooncake`).

Run: ``python benchmarks/cache_sessions.py [--rates 0.0166667,0.05] [--horizon-s 5400]
[--capacities 2500,5000,10000,20000,40000] [--no-lp] [--json PATH] [--mooncake-only]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cache_online_ceiling as ceiling

from lpserve.evaluate.cache import replay_accesses
from lpserve.opt import cache_flow as cf
from lpserve.opt import cache_segments as cs
from lpserve.policies.evictors_sessions import SESSION_SPECS, fit_duel_state, fit_wait_stats
from lpserve.trace.loaders import bundled_sessions, read_sessions
from lpserve.trace.sessions import compose, split

SHARED = Path(os.environ.get("LPSERVE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
SESSIONS = SHARED / "traces" / "kv_cache_tester_sessions_part1.jsonl.gz"
ONLINE = ("lru", "knapsack", "session", "ttl-pin", "ttl-pin cold",
          *[p for p in SESSION_SPECS if p != "ttl-pin"])


def load_sessions():
    """The shared sessions file, or the bundled slice without ../shared."""
    return read_sessions(SESSIONS) if SESSIONS.exists() else bundled_sessions()


def ttl_ceiling(tr, capacity: int) -> float:
    """Hindsight-best TTL per wait kind of the block's last toucher (block-level gaps)."""
    f = ceiling.access_features(tr)
    acc = cf.block_accesses(tr)
    cls = np.asarray(tr.wait_kind)[np.asarray(acc.request)] + 1
    return ceiling.best_ttl(cls, f["gap_s"], f["span_s"], capacity)[0]


def run(rate: float, fit, held, horizon_s: float, capacities: list[int], lp: bool) -> list:
    t0 = time.perf_counter()
    fit_tr = compose(fit, rate_per_s=rate, seed=1, horizon_s=horizon_s, name="fit")
    fit_acc = cf.block_accesses(fit_tr)
    prior = fit_wait_stats(fit_acc)
    tr = compose(held, rate_per_s=rate, seed=2, horizon_s=horizon_s, name="held-out")
    acc = cf.block_accesses(tr)
    inf = replay_accesses(acc, 1, "infinite").hit_rate
    print(f"\nsession starts {rate:.5g}/s over {horizon_s:g} s: fit stream {fit_tr.n} requests "
          f"(prior from {int(prior.n_waits.sum())} ended waits), held-out stream {tr.n} "
          f"requests of {len(np.unique(tr.session_id))} sessions, {acc.n_accesses} block "
          f"accesses; infinite cache {100 * inf:.2f} %")
    head = (f"{'C':>6} " + " ".join(f"{p[:9]:>9}" for p in ONLINE)
            + f" {'belady':>7} {'bel-pre':>7} {'LP':>7} {'TTLceil':>7} {'LRU/B':>6} "
            f"{'closed':>6} fit-stream leader")
    print(head)
    rows = []
    for C in capacities:
        start = fit_duel_state(fit_acc, C, SESSION_SPECS["ttl-pin"].with_(prior=prior))
        r = {p: replay_accesses(acc, C, p, **({"prior": prior} if p in SESSION_SPECS else {}))
             .hit_rate for p in ONLINE if p not in ("ttl-pin", "ttl-pin cold")}
        r["ttl-pin"] = replay_accesses(acc, C, "ttl-pin", prior=prior,
                                       duel_start=start).hit_rate
        r["ttl-pin cold"] = replay_accesses(acc, C, "ttl-pin", prior=prior).hit_rate
        r["fit_leader"] = "ttl-pin" if start[0] else "lru"
        r["belady"] = replay_accesses(acc, C, "belady").hit_rate
        r["belady-prefix"] = replay_accesses(acc, C, "belady-prefix").hit_rate
        r["lp"] = cs.lp_hit_rate(acc, C)[0] if lp else float("nan")
        r["ttl-ceiling"] = ttl_ceiling(tr, C)
        best_off = max(r["belady"], r["belady-prefix"])
        r["lru_over_belady"] = r["lru"] / best_off
        r["closed"] = (r["ttl-pin"] - r["lru"]) / (best_off - r["lru"])
        r.update(capacity=C, rate_per_s=rate)
        rows.append(r)
        print(f"{C:>6} " + " ".join(f"{100 * r[p]:9.2f}" for p in ONLINE)
              + f" {100 * r['belady']:7.2f} {100 * r['belady-prefix']:7.2f} "
              f"{100 * r['lp']:7.2f} {100 * r['ttl-ceiling']:7.2f} "
              f"{100 * r['lru_over_belady']:5.1f}% {100 * r['closed']:5.1f}% {r['fit_leader']}",
              flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="0.0166667,0.05")
    ap.add_argument("--horizon-s", type=float, default=5400.0)
    ap.add_argument("--capacities", default="2500,5000,10000,20000,40000")
    ap.add_argument("--no-lp", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--mooncake-only", action="store_true")
    a = ap.parse_args()
    mooncake()
    if a.mooncake_only:
        return
    S = load_sessions()
    fit, held = split(S, 0.5, seed=0)
    print(f"{S.report.source}: {S.n_sessions} sessions ({fit.n_sessions} fit, "
          f"{held.n_sessions} held out), {S.n_requests} requests")
    rows = []
    for rate in (float(x) for x in a.rates.split(",")):
        rows += run(rate, fit, held, a.horizon_s, [int(c) for c in a.capacities.split(",")],
                    not a.no_lp)
    ok = [r for r in rows if r["lru_over_belady"] <= 0.6]
    print(f"\ncapacities with LRU <= 60 % of Belady: {len(ok)}; ttl-pin closes >= half the "
          f"gap at {sum(r['closed'] >= 0.5 for r in ok)} of them; ttl-pin >= LRU at "
          f"{sum(r['ttl-pin'] >= r['lru'] for r in rows)} of {len(rows)} capacities (cold duel: "
          f"{sum(r['ttl-pin cold'] >= r['lru'] for r in rows)})")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


def mooncake(capacity: int = 5859) -> None:
    """The Mooncake slice: no session ids or wait kinds. Without threads the session-aware
    evictors act as group LRU (LRU that drops the deepest block of the least recent request
    first; LRU's kernel breaks that tie otherwise, a few hits apart); with threads inferred online (a request continues the
    most recent earlier request that shares at least its first two blocks, the multi-turn
    pattern of the slice's README) they can pin, with one wait class."""
    tr = ceiling.load_slice()
    acc = cf.block_accesses(tr)
    last: dict[tuple[int, int], int] = {}
    thread = np.arange(tr.n)
    for r in range(tr.n):  # online: only earlier requests are looked at
        b = tr.blocks(r)
        if b.size >= 2 and (int(b[0]), int(b[1])) in last:
            thread[r] = thread[last[(int(b[0]), int(b[1]))]]
        if b.size >= 2:
            last[(int(b[0]), int(b[1]))] = r
    from lpserve.trace import Trace

    inferred = Trace.from_arrays(arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                                 output_tokens=tr.output_tokens, block_ids=tr.block_lists(),
                                 block_tokens=tr.block_tokens, session_id=thread,
                                 name=f"{tr.name}+threads")
    iacc = cf.block_accesses(inferred)
    f = ceiling.access_features(tr)
    one = ceiling.best_ttl(np.zeros(acc.n_accesses, np.int64), f["gap_s"], f["span_s"],
                           capacity)[0]
    print(f"\n{tr.name}: {acc.n_accesses} block accesses, capacity {capacity}; "
          f"{len(np.unique(thread))} inferred threads")
    for p in ("lru", "knapsack", *SESSION_SPECS):
        plain = replay_accesses(acc, capacity, p).hit_rate
        thr = replay_accesses(iacc, capacity, p).hit_rate
        print(f"  {p:<16} {100 * plain:6.2f} %   with inferred threads {100 * thr:6.2f} %")
    for p in ("belady", "belady-prefix"):
        print(f"  {p:<16} {100 * replay_accesses(acc, capacity, p).hit_rate:6.2f} %")
    print(f"  hindsight-best single TTL (the TTL family with one class) {100 * one:6.2f} %")


if __name__ == "__main__":
    main()
