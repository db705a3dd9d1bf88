"""How far online signals can take a KV evictor on the Mooncake slice: hindsight-tuned
time-to-live per reuse class.

A TTL policy keeps a block for ``T_c`` seconds after each touch, ``c`` its class at that
touch; a touch within ``T_c`` of the previous one is a hit. With the time-average
occupancy held to the capacity (the characteristic-time approximation of an LRU-like
cache of that size, Che et al. 2002), the best ``T_c`` per class are picked **with
hindsight** on the same trace (a Lagrangian sweep over a grid of TTLs: maximise
hits - lambda x occupancy per class, then the smallest lambda whose occupancy fits). Prefix
closure is ignored (a deep block can hit without its parents), which only helps. Classes
use signals an online evictor has: touches so far, whether the block is a prompt's
partial last block, its depth, and the share of the request's blocks already seen.

The printed figures bound what *that family* of evictors (recency plus class credit, as
the session, prefix, knapsack and GDSF rules are) can reach on this trace; it is not a
bound on every online algorithm. Compare with LRU, Belady and the online evictors of
``lpserve cache`` at the same capacity.

It also prints, for the blocks seen for the first time, how well each request-level
signal separates those that come back from those that do not (the area under the ROC
curve; 0.5 = no information).

Last, a learned predictor in the style of learning-relaxed-Belady caches (Song et al.,
NSDI 2020): gradient-boosted trees (scikit-learn) on twelve features an evictor has at a
block's touch (touches so far, the two previous gaps between touches, depth, prompt length
in blocks and tokens, blocks to the end of the prompt, partial last block, seen share and
seen blocks, time since the conversation's previous turn and its turn count) predict
"touched again within H seconds". Trained on the first half of the slice (by arrival),
its predicted-probability classes (x touches) get the hindsight-best TTL on the second
half, beside the same half's single TTL, touches-only classes and infinite cache. (Labels
of the first half's last H seconds look into the second half: optimistic, as a ceiling
may be. ``cache_learned_evictor.py`` runs the same classes as an online evictor.)

Run: ``python benchmarks/cache_online_ceiling.py [--capacity-blocks 5859]``.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

import lpserve as lp
from lpserve.evaluate.cache import cache_replay
from lpserve.opt import cache_flow as cf

SHARED = Path(os.environ.get("LPSERVE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
SLICE = SHARED / "traces" / "mooncake_fast25_conversation_first30min.jsonl.gz"
GRID_S = np.array([0, 5, 10, 20, 30, 45, 60, 75, 90, 105, 120, 150, 180, 210, 240, 300,
                   400, 500, 600, 900, 1200, 1800, 3600], float)


def load_slice() -> lp.Trace:
    """The shared Mooncake 30-minute slice, or the bundled 5-minute one without ../shared."""
    return lp.load_trace(SLICE) if SLICE.exists() else lp.bundled_trace("mooncake-conv-5min")


def access_features(trace: lp.Trace) -> dict[str, np.ndarray]:
    """Per block access (shape (A,)): time to the next touch of the same block (inf if
    none), touches before it, partial-last-block flag, depth, request's seen share."""
    acc = cf.block_accesses(trace)
    req = np.asarray(acc.request)
    key = np.asarray(acc.key)
    off = np.asarray(acc.offsets)
    t = np.asarray(trace.arrival_s)[req]
    n = key.size
    order = np.lexsort((np.arange(n), key))  # by key, then access order
    same = key[order][1:] == key[order][:-1]
    gap = np.full(n, np.inf)
    gap[order[:-1][same]] = t[order[1:][same]] - t[order[:-1][same]]
    touches = np.zeros(n, np.int64)
    run_start = np.r_[0, np.flatnonzero(~same) + 1]
    idx = np.arange(n) - np.repeat(run_start, np.diff(np.r_[run_start, n]))
    touches[order] = idx
    last = np.zeros(n, bool)
    last[off[1:] - 1] = True
    partial = (np.asarray(trace.prompt_tokens) % acc.block_tokens) != 0
    last &= partial[req]
    seen_share = np.bincount(req, weights=touches > 0, minlength=trace.n) / np.diff(off)
    return {"gap_s": gap, "touches": touches, "last": last, "depth": np.asarray(acc.depth),
            "seen_share": seen_share[req], "span_s": float(t.max() - t.min())}


def online_features(trace: lp.Trace, f: dict[str, np.ndarray]) -> np.ndarray:
    """Features known at each block access (shape (A, 12)); NaN where undefined."""
    acc = cf.block_accesses(trace)
    req = np.asarray(acc.request)
    key = np.asarray(acc.key)
    t = np.asarray(trace.arrival_s)[req]
    n = key.size
    order = np.lexsort((np.arange(n), key))
    same = key[order][1:] == key[order][:-1]
    prev_t = np.full(n, np.nan)
    prev_t[order[1:][same]] = t[order[:-1][same]]
    gap1 = t - prev_t
    gap2 = np.full(n, np.nan)
    gap2[order[1:][same]] = gap1[order[:-1][same]]
    n_blocks = np.diff(np.asarray(acc.offsets))[req].astype(float)
    depth = f["depth"].astype(float)
    seen = f["touches"] > 0
    seen_blocks = np.bincount(req, weights=seen, minlength=trace.n)[req]
    last_turn = np.full(trace.n, -np.inf)
    np.maximum.at(last_turn, req, np.where(seen, prev_t, -np.inf))
    turn_gap = np.where(np.isfinite(last_turn[req]), t - last_turn[req], np.nan)
    turns = np.zeros(trace.n)
    np.maximum.at(turns, req, f["touches"].astype(float))
    return np.column_stack([f["touches"], gap1, gap2, depth, n_blocks, n_blocks - depth,
                            f["last"], f["seen_share"], seen_blocks, turn_gap, turns[req],
                            np.asarray(trace.prompt_tokens, float)[req]])


def learned_ceiling(trace: lp.Trace, f: dict[str, np.ndarray], capacity: float,
                    horizons_s: tuple[float, ...] = (120.0, 300.0, 600.0)) -> None:
    """Print the learned-predictor ceiling on the second half (see the module docstring)."""
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier
        from sklearn.metrics import roc_auc_score
    except ImportError as e:  # the 'bench' extra
        raise SystemExit("the learned-predictor ceiling needs scikit-learn: "
                         "pip install -e '.[bench]'") from e
    X = online_features(trace, f)
    gap = f["gap_s"]
    t = np.asarray(trace.arrival_s)[np.asarray(cf.block_accesses(trace).request)]
    train = t <= np.median(t)
    g2, tc = gap[~train], np.minimum(f["touches"], 4)[~train]
    span = float(t[~train].max() - t[~train].min())
    new = f["touches"][~train] == 0
    print(f"learned predictor (trained on the first {100 * train.mean():.0f} % of accesses), "
          f"hindsight-best TTL on the rest ({int((~train).sum())} accesses):")
    print(f"  infinite cache {100 * np.isfinite(g2).mean():6.2f} %")
    for name, cls in (("one TTL for all", np.zeros(g2.size, np.int64)), ("touches (0-4+)", tc)):
        print(f"  {name:<44} hit {100 * best_ttl(cls, g2, span, capacity)[0]:6.2f} %")
    for h in horizons_s:
        y = gap <= h
        model = HistGradientBoostingClassifier(max_iter=200, random_state=0)
        prob = model.fit(X[train], y[train]).predict_proba(X[~train])[:, 1]
        auc_all = roc_auc_score(y[~train], prob)
        auc_new = roc_auc_score(y[~train][new], prob[new])
        decile = np.minimum(np.argsort(np.argsort(prob)) * 10 // prob.size, 9)
        _, cls = np.unique(decile * 5 + tc, return_inverse=True)
        hit = best_ttl(cls, g2, span, capacity)[0]
        print(f"  back within {h:4.0f} s: AUC {auc_all:.3f} (new blocks {auc_new:.3f}); "
              f"deciles x touches ({int(cls.max()) + 1} classes) hit {100 * hit:6.2f} %")


def ttl_table(cls: np.ndarray, gap: np.ndarray, grid_s: np.ndarray, span_s: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per class (rows) and TTL of ``grid_s`` (columns): hits (next gap <= TTL) and mean
    occupancy in blocks (sum of min(gap, TTL) over the span)."""
    k = int(cls.max()) + 1
    H = np.zeros((k, grid_s.size))
    O = np.zeros((k, grid_s.size))
    for c in range(k):
        g = gap[cls == c]
        H[c] = (g[None, :] <= grid_s[:, None]).sum(1)
        O[c] = np.minimum(g[None, :], grid_s[:, None]).sum(1) / span_s
    return H, O


def best_ttl(cls: np.ndarray, gap: np.ndarray, span_s: float, capacity: float
             ) -> tuple[float, float]:
    """Hit rate and occupancy of the hindsight-best TTL per class at mean occupancy <=
    ``capacity``, interpolating between the two Lagrangian points around it."""
    k = int(cls.max()) + 1
    H, O = ttl_table(cls, gap, GRID_S, span_s)
    pts = []
    for lam in np.geomspace(1e-2, 1e6, 2000):
        pick = (H - lam * O).argmax(1)
        pts.append((O[np.arange(k), pick].sum(), H[np.arange(k), pick].sum()))
    pts = sorted(set(pts))
    below = max((p for p in pts if p[0] <= capacity), key=lambda p: p[1])
    above = [p for p in pts if p[0] > capacity]
    if not above:
        return below[1] / gap.size, below[0]
    hi = min(above, key=lambda p: p[0])
    w = (capacity - below[0]) / (hi[0] - below[0])
    return (below[1] + w * (hi[1] - below[1])) / gap.size, capacity


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacity-blocks", type=int, default=5859)
    a = ap.parse_args()
    tr = load_slice()
    f = access_features(tr)
    gap, C = f["gap_s"], a.capacity_blocks
    tc = np.minimum(f["touches"], 4)
    depth_b = np.digitize(f["depth"], [1, 4, 16, 64])
    share_b = np.digitize(f["seen_share"], [0.1, 0.5, 0.9])
    families = {
        "one TTL for all (LRU-like)": np.zeros(gap.size, np.int64),
        "touches (0-4+)": tc,
        "touches x partial last block": tc * 2 + f["last"],
        "touches x last x depth (5 bins)": (tc * 2 + f["last"]) * 5 + depth_b,
        "touches x last x depth x seen share (4 bins)":
            ((tc * 2 + f["last"]) * 5 + depth_b) * 4 + share_b,
    }
    print(f"{tr.name}: {gap.size} block accesses, capacity {C} blocks; "
          f"infinite cache {100 * np.isfinite(gap).mean():.2f} %")
    for name in ("lru", "belady", "knapsack", "session", "gdsf"):
        print(f"  replay {name:<10} {100 * cache_replay(tr, C, name).hit_rate:6.2f} %")
    # does anything known online tell which new blocks come back? (AUC 0.5: nothing)
    from scipy.stats import mannwhitneyu

    acc_req = np.asarray(cf.block_accesses(tr).request)
    new = (f["touches"] == 0) & ~f["last"]
    back = np.isfinite(gap)[new]
    print(f"new full blocks: {int(new.sum())}, {100 * back.mean():.1f} % come back; AUC of "
          f"each signal for 'comes back' (0.5 = no information):")
    for name, x in (("prompt tokens", tr.prompt_tokens[acc_req]),
                    ("output tokens", tr.output_tokens[acc_req]),
                    ("share of the request already seen", f["seen_share"]),
                    ("depth", f["depth"])):
        u = mannwhitneyu(np.asarray(x, float)[new][back],
                         np.asarray(x, float)[new][~back]).statistic
        print(f"  {name:<36} {u / (back.sum() * (~back).sum()):.3f}")
    print("hindsight-best TTL per class (occupancy <= capacity):")
    for name, cls in families.items():
        _, cls = np.unique(cls, return_inverse=True)
        h, occ = best_ttl(cls, gap, f["span_s"], C)
        print(f"  {name:<46} {int(cls.max()) + 1:4d} classes  hit {100 * h:6.2f} %")
    learned_ceiling(tr, f, C)


if __name__ == "__main__":
    main()
