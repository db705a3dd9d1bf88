"""A learned online KV evictor on the Mooncake slice: what the learned reuse classes of
``cache_online_ceiling.py`` give when their TTLs are fitted on the past, not the answer.

Replay (one cache of ``--capacity-blocks`` blocks, prefix-closed hits: a request hits the
longest run of its leading blocks that are cached; every block it touches is then
cached) in two halves split at the slice's middle arrival time:

1. first half: LRU (evict the least recently touched block);
2. second half: each touched block gets an expiry time ``now + TTL[class]`` and the block
   with the earliest expiry is evicted. Classes and TTLs are fitted **once, at the split,
   on the first half only**, with labels an online system has by then (an access counts
   only if ``H`` seconds have passed since it, or its next touch already happened):

   - ``touches``: class = touches so far (0-4+);
   - ``learned``: gradient-boosted trees (scikit-learn) on the twelve online features of
     ``cache_online_ceiling.online_features`` predict "touched again within H s"; class =
     decile of the predicted probability x touches.

   TTLs per class come from the same Lagrangian as the ceiling benchmark (maximise hits -
   lambda x occupancy over a TTL grid up to H, the smallest lambda whose mean occupancy
   fits the capacity), with occupancy measured on the first half.

It prints the hit rate over the second half's accesses for LRU, both learned policies and,
for reference, the package's knapsack-index evictor and Belady over the same accesses,
and checks the harness against the package's LRU replay over the whole slice.

Run: ``python benchmarks/cache_learned_evictor.py [--capacity-blocks 5859] [--horizon-s 300]``.
"""
from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cache_online_ceiling as ceiling

from lpserve.evaluate.cache import cache_replay
from lpserve.opt import cache_flow as cf


def replay(acc: cf.BlockAccesses, arrival_s: np.ndarray, capacity: int,
           expiry_s: np.ndarray | None) -> np.ndarray:
    """Hits per request. ``expiry_s`` (per access; None: LRU throughout) is the eviction
    priority given at that touch; NaN entries fall back to LRU order (touch time)."""
    off, key, depth = np.asarray(acc.offsets), np.asarray(acc.key), np.asarray(acc.depth)
    prio: dict[int, float] = {}
    heap: list[tuple[float, int]] = []
    hits = np.zeros(len(off) - 1, np.int64)
    for r in range(len(off) - 1):
        a0, a1 = off[r], off[r + 1]
        j = a0
        while j < a1 and key[j] in prio:
            j += 1
        hits[r] = j - a0
        for a in range(a0, a1):
            e = np.nan if expiry_s is None else expiry_s[a]
            # LRU order: older first; within a request the deepest block first
            p = arrival_s[r] - 1e-6 * depth[a] / (1 + depth[a]) if np.isnan(e) else e
            prio[int(key[a])] = p
            heapq.heappush(heap, (p, int(key[a])))
        while len(prio) > capacity:
            p, k = heapq.heappop(heap)
            if prio.get(k) == p:
                del prio[k]
    return hits


def fit_ttl(cls: np.ndarray, gap: np.ndarray, known: np.ndarray, span_s: float,
            capacity: float, horizon_s: float) -> np.ndarray:
    """TTL per class from the first half: hits and occupancy over a grid up to the horizon,
    the Lagrangian choice whose mean occupancy fits ``capacity`` (rounded down)."""
    grid = ceiling.GRID_S[ceiling.GRID_S <= horizon_s]
    k = int(cls.max()) + 1
    g = np.where(known & (gap <= horizon_s), gap, np.inf)  # unknown or beyond H: a miss
    H, O = ceiling.ttl_table(cls, g, grid, span_s)
    best = np.zeros(k, np.int64)
    for lam in np.geomspace(1e6, 1e-2, 2000):  # from strict to loose
        pick = (H - lam * O).argmax(1)
        if O[np.arange(k), pick].sum() > capacity:
            break
        best = pick
    return grid[best]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacity-blocks", type=int, default=5859)
    ap.add_argument("--horizon-s", type=float, default=300.0)
    a = ap.parse_args()
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier
    except ImportError as e:  # the 'bench' extra
        raise SystemExit("this benchmark needs scikit-learn: pip install -e '.[bench]'") from e

    tr = ceiling.load_slice()
    C, Hs = a.capacity_blocks, a.horizon_s
    acc = cf.block_accesses(tr)
    arrival = np.asarray(tr.arrival_s, float)
    req = np.asarray(acc.request)
    t = arrival[req]
    f = ceiling.access_features(tr)
    X = ceiling.online_features(tr, f)
    split_s = float(np.median(arrival))
    first = t < split_s
    second_req = arrival >= split_s
    # labels known at the split: H seconds have passed, or the next touch already happened
    known = first & ((t + Hs <= split_s) | (t + f["gap_s"] <= split_s))
    y = f["gap_s"] <= Hs
    span = split_s - float(arrival.min())
    tc = np.minimum(f["touches"], 4)

    lru = replay(acc, arrival, C, None)
    check = cache_replay(tr, C, "lru").hit_rate
    n_second = int(np.diff(np.asarray(acc.offsets))[second_req].sum())

    def second_half(hits: np.ndarray) -> float:
        return float(hits[second_req].sum()) / n_second

    print(f"{tr.name}: {acc.n_accesses} block accesses, capacity {C} blocks, split at "
          f"{split_s:.0f} s; second half {n_second} accesses; H = {Hs:.0f} s")
    print(f"  harness check, LRU over the whole slice: {100 * lru.sum() / acc.n_accesses:.2f} % "
          f"(package replay {100 * check:.2f} %)")
    print(f"  LRU throughout                   second half {100 * second_half(lru):6.2f} %")
    model = HistGradientBoostingClassifier(max_iter=200, random_state=0)
    model.fit(X[known], y[known])
    prob = model.predict_proba(X)[:, 1]
    # deciles from the first half's predictions, applied to every access
    edges = np.quantile(prob[first], np.linspace(0, 1, 11)[1:-1])
    learned = np.digitize(prob, edges) * 5 + tc
    for name, cls in (("touches (online TTLs)", tc), ("learned (online TTLs)", learned)):
        ttl = fit_ttl(cls[first], f["gap_s"][first], known[first], span, C, Hs)
        expiry = np.where(first, np.nan, t + ttl[cls])
        hits = replay(acc, arrival, C, expiry)
        print(f"  {name:<32} second half {100 * second_half(hits):6.2f} %   "
              f"(whole slice {100 * hits.sum() / acc.n_accesses:.2f} %)")
    for name in ("knapsack", "belady"):
        res = cache_replay(tr, C, name)
        print(f"  package replay: {name:<16} second half {100 * second_half(res.hits_per_request):6.2f} %"
              f"   (whole slice {100 * res.hit_rate:.2f} %)")


if __name__ == "__main__":
    main()
