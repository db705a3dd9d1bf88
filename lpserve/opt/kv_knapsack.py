"""The per-decision KV retention knapsack (``models/kv-knapsack.md`` (1)-(4)).

At an eviction decision, over cached blocks ``i = 0..m-1`` (a forest: ``parent[i]`` is the
cached block before ``i`` in its prefix chain, -1 for a root), keep the set of maximal
expected value within ``capacity_blocks``:

    max sum_i v_i y_i   s.t.   sum_i y_i <= W,   y_i <= y_parent(i),   y in {0,1}

``v_i`` = expected future hits x recompute seconds (:func:`block_values`). Unit weights, so
the exact tree-knapsack DP (:func:`knapsack_dp`) is O(m W); :func:`knapsack_lp` solves the
LP relaxation with HiGHS and returns a :class:`~lpserve.opt.solution.Solution`
(LP >= DP optimum >= rounded set: ``proofs/kv-knapsack-lp.md``).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from lpserve.opt.solution import Solution, Status, highs_model, highs_status


def _check(parent: Any, value: Any, capacity_blocks: Any) -> tuple[np.ndarray, np.ndarray, int]:
    par = np.asarray(parent, np.int64)
    val = np.asarray(value, np.float64)
    if par.shape != val.shape or par.ndim != 1:
        raise ValueError(f"parent and value must be 1-D of one length, got {par.shape} and "
                         f"{val.shape}")
    if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, (int, np.integer)) \
            or capacity_blocks < 0:
        raise ValueError(f"capacity_blocks must be an integer >= 0, got {capacity_blocks!r}")
    m = par.size
    bad = (par < -1) | (par >= np.arange(m))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"parent[{i}] = {par[i]} must be -1 or an earlier block index")
    if not np.all(np.isfinite(val)):
        raise ValueError("value must be finite")
    return par, val, int(capacity_blocks)


def block_values(reuse_prob: Any, recompute_s: Any) -> np.ndarray:
    """Expected value of keeping each block: ``P(reuse) x recompute seconds``
    (``models/kv-knapsack.md`` (2)); shapes ``(m,)``."""
    p = np.asarray(reuse_prob, np.float64)
    c = np.asarray(recompute_s, np.float64)
    if np.any((p < 0) | (p > 1)):
        raise ValueError("reuse_prob must lie in [0, 1]")
    return p * c


def knapsack_dp(parent: Any, value: Any, capacity_blocks: int) -> tuple[float, np.ndarray]:
    """Exact tree knapsack by DP over subtrees (``models/kv-knapsack.md`` (4)).

    ``parent`` (m,) int, earlier index or -1; ``value`` (m,) float. Returns the optimal
    value and the kept mask (m,) bool. O(m W) time.
    """
    par, val, W = _check(parent, value, capacity_blocks)
    m = par.size
    children: list[list[int]] = [[] for _ in range(m)]
    roots = []
    for i in range(m):
        (children[par[i]] if par[i] >= 0 else roots).append(i)
    NEG = -np.inf
    best: list[np.ndarray] = [np.empty(0)] * m  # best[i][w]: i kept, w blocks in subtree
    choice: list[list[np.ndarray]] = [[] for _ in range(m)]
    for i in range(m - 1, -1, -1):  # children have larger indices than parents
        cur = np.array([NEG, val[i]]) if W >= 1 else np.array([NEG])
        picks = []
        for c in children[i]:
            bc = np.concatenate([[0.0], best[c]])  # w=0: child dropped
            size = min(cur.size + bc.size - 1, W + 1)
            new = np.full(size, NEG)
            arg = np.zeros(size, np.int64)
            for w in range(cur.size):
                if cur[w] == NEG:
                    continue
                kmax = min(bc.size - 1, W - w)
                cand = cur[w] + bc[:kmax + 1]
                tgt = slice(w, w + kmax + 1)
                better = cand > new[tgt]
                new[tgt] = np.where(better, cand, new[tgt])
                arg[tgt] = np.where(better, np.arange(kmax + 1), arg[tgt])
            picks.append(arg)
            cur = new
        best[i] = cur[1:] if cur.size > 1 else np.empty(0)  # index w-1 for w >= 1
        choice[i] = picks
    # forest: knapsack over roots
    tot = np.array([0.0])
    rpicks = []
    for rt in roots:
        bc = np.concatenate([[0.0], best[rt]])
        size = min(tot.size + bc.size - 1, W + 1)
        new = np.full(size, NEG)
        arg = np.zeros(size, np.int64)
        for w in range(tot.size):
            if tot[w] == NEG:
                continue
            kmax = min(bc.size - 1, W - w)
            cand = tot[w] + bc[:kmax + 1]
            tgt = slice(w, w + kmax + 1)
            better = cand > new[tgt]
            new[tgt] = np.where(better, cand, new[tgt])
            arg[tgt] = np.where(better, np.arange(kmax + 1), arg[tgt])
        rpicks.append(arg)
        tot = new
    w_best = int(np.argmax(tot))
    opt = float(tot[w_best])
    kept = np.zeros(m, bool)

    def unwind(i: int, w: int) -> None:  # node i kept with w blocks in its subtree
        kept[i] = True
        for c, arg in zip(reversed(children[i]), reversed(choice[i])):
            k = int(arg[w])
            w -= k
            if k:
                unwind(c, k)

    w = w_best
    for rt, arg in zip(reversed(roots), reversed(rpicks)):
        k = int(arg[w])
        w -= k
        if k:
            unwind(rt, k)
    return opt, kept


def knapsack_lp(parent: Any, value: Any, capacity_blocks: int) -> Solution:
    """LP relaxation of the retention knapsack with HiGHS (``models/kv-knapsack.md`` (5)).

    Minimizes the value given up, ``sum v - sum v y``; ``bound`` is the LP optimum (a lower
    bound on the value the best integral set gives up), ``objective`` the value given up by
    the feasible set ``y >= 1 - 1e-9`` (rounded down, closed under parents).
    ``primal["y"]`` (m,) the LP solution, ``primal["kept"]`` the rounded set.
    """
    from scipy import sparse

    t0 = time.perf_counter()
    par, val, W = _check(parent, value, capacity_blocks)
    m = par.size
    ch = np.flatnonzero(par >= 0)
    rows = np.concatenate([np.zeros(m, np.int64), 1 + np.arange(ch.size),
                           1 + np.arange(ch.size)])
    cols = np.concatenate([np.arange(m), ch, par[ch]])
    vals = np.concatenate([np.ones(m), np.ones(ch.size), -np.ones(ch.size)])
    A = sparse.csc_matrix((vals, (rows, cols)), shape=(1 + ch.size, m))
    A.sort_indices()
    total = float(val.sum())
    try:
        h = highs_model(col_cost=-val, col_lower=np.zeros(m), col_upper=np.ones(m),
                        row_lower=np.full(1 + ch.size, -np.inf),
                        row_upper=np.concatenate([[float(W)], np.zeros(ch.size)]),
                        a_start=A.indptr, a_index=A.indices, a_value=A.data)
        h.run()
        status, obj, _, msg = highs_status(h, has_integers=False)
    except Exception as exc:  # solver failure is a status
        return Solution("kv-knapsack-lp", Status.ERROR, wall_s=time.perf_counter() - t0,
                        message=f"{type(exc).__name__}: {exc}")
    if status != Status.OPTIMAL:
        return Solution("kv-knapsack-lp", status, wall_s=time.perf_counter() - t0, message=msg)
    y = np.clip(np.asarray(h.getSolution().col_value), 0.0, 1.0)
    kept = y >= 1 - 1e-9
    for i in range(m):  # closure: a child of a dropped parent is dropped
        if par[i] >= 0 and not kept[par[i]]:
            kept[i] = False
    return Solution("kv-knapsack-lp", Status.OPTIMAL, objective=total - float(val[kept].sum()),
                    bound=total + obj, wall_s=time.perf_counter() - t0,
                    primal={"y": y, "kept": kept}, message=msg, objective_units="value",
                    info={"value_lp": -obj, "value_rounded": float(val[kept].sum())})
