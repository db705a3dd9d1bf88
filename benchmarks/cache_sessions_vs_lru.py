"""Does a session-aware evictor ever lose to LRU? Replay hit rates on every trace with
prefix blocks the project ships or generates, at several capacities.

Traces: the shared Mooncake conversation 30-minute slice (when ``../shared`` is present)
and the bundled 5-minute Mooncake slice (no session ids, no wait kinds); the bundled
kv-cache-tester sessions composed at three Poisson session-start rates (seed 0); generated
chat sessions (``generate.sessions``, three seeds and think times; with and without wait
kinds: a tool call inside a session, a user turn after its last request); generated shared
prefixes (``generate.with_shared_prefixes`` on Poisson arrivals, no sessions); the traces
of the conformance instances with blocks (``lpserve.testing.conformance_instances``,
seeds 0-2). The shared kv-cache-tester streams are in ``cache_sessions.py``. Each evictor
runs with its defaults (no fitted prior: it learns from the trace as it goes).

Capacities: 1, 3, 10 and 30 % of the trace's distinct blocks (at least 8 blocks). For
each evictor it prints the smallest difference (evictor - LRU, percentage points of hit
rate) over the capacities, and the capacity where it occurs; a negative figure is a loss.

Run: ``python benchmarks/cache_sessions_vs_lru.py``.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import lpserve as lp
from lpserve.evaluate.cache import replay_accesses
from lpserve.opt import cache_flow as cf
from lpserve.policies.evictors_sessions import SESSION_SPECS
from lpserve.testing import conformance_instances
from lpserve.trace import Trace
from lpserve.trace import generate as g
from lpserve.trace.loaders import bundled_sessions
from lpserve.trace.sessions import compose

SHARED = Path(os.environ.get("LPSERVE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
MOONCAKE = SHARED / "traces" / "mooncake_fast25_conversation_first30min.jsonl.gz"
FRACTIONS = (0.01, 0.03, 0.10, 0.30)


def with_waits(tr: Trace) -> Trace:
    """``tr`` with wait kinds: a tool call inside a session, a user turn after its last
    request."""
    sid = np.asarray(tr.session_id)
    last = np.zeros(tr.n, bool)
    last[[int(np.flatnonzero(sid == s).max()) for s in np.unique(sid)]] = True
    return Trace.from_arrays(arrival_s=tr.arrival_s, prompt_tokens=tr.prompt_tokens,
                             output_tokens=tr.output_tokens, block_ids=tr.block_lists(),
                             block_tokens=tr.block_tokens, session_id=sid,
                             wait_kind=np.where(last, 1, 0), name=f"{tr.name}+waits")


def traces():
    """(label, trace) of every trace the check runs on."""
    if MOONCAKE.exists():
        yield "shared mooncake 30 min", lp.load_trace(MOONCAKE)
    yield "bundled mooncake 5 min", lp.bundled_trace("mooncake-conv-5min")
    for rate in (1 / 4, 1 / 30, 1 / 120):
        yield f"bundled sessions, starts {rate:.3g}/s", compose(bundled_sessions(),
                                                                rate_per_s=rate, seed=0)
    for seed, think in ((0, 2.0), (1, 10.0), (2, 60.0)):
        tr = g.sessions(60, session_arrivals=g.Poisson(0.5), turns=g.Uniform(2, 10),
                        first_prompt=g.Uniform(300, 3000), turn_prompt=g.Uniform(20, 400),
                        output=g.Uniform(10, 200), think_time_s=think, block_tokens=16,
                        seed=seed, name=f"chat seed {seed} think {think:g} s")
        yield tr.name, tr
        yield f"{tr.name} + wait kinds", with_waits(tr)
    base = g.synthetic(2000, arrivals=g.Poisson(20.0), prompt=g.Uniform(50, 500),
                       output=g.Uniform(10, 100), seed=0)
    yield "shared prefixes", g.with_shared_prefixes(
        base, [g.PrefixLevel(4, 512), g.PrefixLevel(16, 256)], share=0.8, seed=0)
    for seed in range(3):
        for name, inst in conformance_instances(seed).items():
            if inst.trace.has_blocks:
                yield f"conformance {name} seed {seed}", inst.trace


def main() -> None:
    names = list(SESSION_SPECS)
    print(f"{'trace':<38} {'accesses':>9} {'keys':>7} " + " ".join(f"{n:>22}" for n in names))
    worst = {n: (np.inf, "") for n in names}
    for label, tr in traces():
        acc = cf.block_accesses(tr)
        caps = sorted({max(8, int(f * acc.n_keys)) for f in FRACTIONS})
        lru = {C: replay_accesses(acc, C, "lru").hit_rate for C in caps}
        cells = []
        for n in names:
            d, at = min((100 * (replay_accesses(acc, C, n).hit_rate - lru[C]), C) for C in caps)
            cells.append(f"{d:+8.3f} pt at C={at:<6}")
            if d < worst[n][0]:
                worst[n] = (d, f"{label}, C={at}")
        print(f"{label:<38} {acc.n_accesses:9d} {acc.n_keys:7d} " + " ".join(
            f"{c:>22}" for c in cells), flush=True)
    print("\nworst difference to LRU over all traces and capacities:")
    for n, (d, where) in worst.items():
        print(f"  {n:<16} {d:+.3f} pt ({where})" + ("  LOSES" if d < 0 else ""))


if __name__ == "__main__":
    main()
