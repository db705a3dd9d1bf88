"""Where ttl-pin's difference to LRU comes from: the duel's choices or its switches.

For each trace and capacity of ``cache_sessions_vs_lru.py`` (and, with ``--sessions``, the
composed kv-cache-tester streams of ``cache_sessions.py`` at ``--rates`` and
``--capacities``, duel started from the fit stream) it replays ttl-pin with the duel's
record (``replay_session_hits(..., diag=)``) and prints, in percentage points of hit rate:

* ``T - L``: the pure ttl-pin shadow against the LRU shadow (= LRU) over the whole trace;
* ``choices``: what following the leaders would gain over LRU if the real cache held
  exactly what the leader holds, ``sum_r h_lead(r-1)(r) - hits(LRU)`` (models/kv-sessions.md
  (4b)): negative when a new leader stops leading after the switch;
* ``switches``: what the real cache's switches cost against that, ``hits(real) -
  sum_r h_lead(r-1)(r)`` (bounded by (4c));
* the number of leader changes and the blocks the new leader held that the real cache did
  not, summed over the changes (``sum E_s``).

``real - LRU = choices + switches``. Run: ``python benchmarks/cache_duel_diagnosis.py
[--sessions] [--rates 0.0166667,0.05] [--capacities 20000,40000]``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cache_sessions as CS
import cache_sessions_vs_lru as V

from lpserve.opt import cache_flow as cf
from lpserve.policies import _evict_kernels as EK
from lpserve.policies.evictors_sessions import (
    SESSION_SPECS,
    fit_duel_state,
    fit_wait_stats,
    replay_session_hits,
)
from lpserve.trace.sessions import compose, split


def row(label: str, acc, C: int, spec) -> None:
    """Print the split of ttl-pin's difference to LRU on ``acc`` at ``C`` blocks."""
    d = np.zeros((acc.n_requests, 4), np.int64)
    real = replay_session_hits(acc, C, spec, diag=d).sum()
    lru = EK.lru_replay(acc.offsets, acc.key, acc.n_keys, C).sum()
    lead0 = spec.duel_start[0] if spec.duel_start is not None else 0
    prev = np.r_[lead0, d[:-1, 2]].astype(bool)
    lead = np.where(prev, d[:, 1], d[:, 0]).sum()
    sw = d[:, 3] >= 0
    pt = 100.0 / max(acc.n_accesses, 1)
    print(f"{label:<44} {C:>6} {pt * (d[:, 1].sum() - lru):+8.3f} {pt * (real - lru):+8.3f} "
          f"{pt * (lead - lru):+8.3f} {pt * (real - lead):+8.3f} {int(sw.sum()):>5} "
          f"{int(d[sw, 3].sum()):>8}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", action="store_true")
    ap.add_argument("--rates", default="0.0166667,0.05")
    ap.add_argument("--capacities", default="2500,5000,10000,20000,40000")
    ap.add_argument("--horizon-s", type=float, default=5400.0)
    a = ap.parse_args()
    print(f"{'trace':<44} {'C':>6} {'T - L':>8} {'real-L':>8} {'choices':>8} {'switches':>8} "
          f"{'n sw':>5} {'sum E_s':>8}")
    if a.sessions:
        S = CS.load_sessions()
        fit, held = split(S, 0.5, seed=0)
        for rate in (float(x) for x in a.rates.split(",")):
            facc = cf.block_accesses(compose(fit, rate_per_s=rate, seed=1,
                                             horizon_s=a.horizon_s, name="fit"))
            spec = SESSION_SPECS["ttl-pin"].with_(prior=fit_wait_stats(facc))
            acc = cf.block_accesses(compose(held, rate_per_s=rate, seed=2,
                                            horizon_s=a.horizon_s, name="held-out"))
            for C in (int(c) for c in a.capacities.split(",")):
                start = fit_duel_state(facc, C, spec)
                row(f"held-out, starts {rate:.4g}/s (fit leader {int(start[0])})", acc, C,
                    spec.with_(duel_start=start))
                row(f"held-out, starts {rate:.4g}/s, cold duel", acc, C, spec)
        return
    for label, tr in V.traces():
        acc = cf.block_accesses(tr)
        for C in sorted({max(8, int(f * acc.n_keys)) for f in V.FRACTIONS}):
            row(label, acc, C, SESSION_SPECS["ttl-pin"])


if __name__ == "__main__":
    main()
