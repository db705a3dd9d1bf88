"""The prefix LP on segments: the same bound as :func:`lpserve.opt.cache_flow.build` for
block hits, with one column per run of blocks that are always accessed together
(``models/kv-caching-flow.md`` (11)-(12), ``proofs/kv-prefix-lp-segments.md``).

A block whose access count equals its parent's is accessed by exactly the requests that
access its parent (a block is always preceded by its parent), so a chain splits into
*segments*: maximal runs of blocks with one access set. Every request touches a segment
whole. In the segment LP a column is the kept fraction of one segment interval and counts
``w`` blocks (the segment's length) in capacity and objective. For block hits (unit
values) its optimum equals the block LP's: a block solution averaged over each segment's
blocks stays feasible with the same value, and a segment solution copied to its blocks is
one. Agentic sessions, where every request re-sends its whole history and adds a few
blocks, have one segment per request and session, instead of one column per block.
"""
from __future__ import annotations

import time

import numpy as np

from lpserve.opt import cache_flow as cf

__all__ = ["block_hits", "build_segments", "lp_hit_rate", "segment_accesses"]


def segment_accesses(acc: cf.BlockAccesses) -> tuple[cf.BlockAccesses, np.ndarray]:
    """``(seg, w)``: the accesses of ``acc`` with each segment as one "block" (``seg``, a
    :class:`~lpserve.opt.cache_flow.BlockAccesses` whose ``value_s`` and ``tokens`` are the
    segment's sums) and the blocks per segment access ``w`` (int64, seg.n_accesses,)."""
    count = np.bincount(acc.key, minlength=acc.n_keys)
    start = (acc.depth == 0) | (count[acc.key] != count[np.maximum(acc.parent, 0)])
    # segment id of every access: a running count of starts, then dense per key chain
    first = np.flatnonzero(start)
    run = np.cumsum(start) - 1  # index into `first` of each access's segment start
    seg_key_of_start = acc.key[first]
    _, seg_id = np.unique(seg_key_of_start, return_inverse=True)
    seg_of = seg_id.reshape(-1)[run]
    keep = start  # one access per segment access
    req = acc.request[keep]
    n = acc.n_requests
    offs = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(req, minlength=n), out=offs[1:])
    lengths = np.diff(np.append(first, acc.n_accesses))
    w = lengths.astype(np.int64)
    key = seg_of[keep].astype(np.int64)
    depth = np.arange(key.size) - offs[req]
    parent = np.where(depth > 0, np.roll(key, 1), -1)
    order = np.argsort(key, kind="stable")
    ks = key[order]
    same = np.zeros(key.size, bool)
    same[1:] = ks[1:] == ks[:-1]
    prev = np.full(key.size, -1, np.int64)
    nxt = np.full(key.size, key.size, np.int64)
    prev[order[1:][same[1:]]] = order[:-1][same[1:]]
    nxt[order[:-1][same[1:]]] = order[1:][same[1:]]
    csum_v = np.concatenate([[0.0], np.cumsum(acc.value_s)])
    csum_t = np.concatenate([[0], np.cumsum(acc.tokens)])
    ends = first + lengths
    seg = cf.BlockAccesses(
        offsets=offs, key=key, parent=parent, depth=depth, request=req,
        tokens=(csum_t[ends] - csum_t[first]).astype(np.int64), prev=prev, next=nxt,
        value_s=csum_v[ends] - csum_v[first], arrival_s=acc.arrival_s,
        n_keys=int(seg_id.max(initial=-1)) + 1, block_tokens=acc.block_tokens,
        name=f"{acc.name} (segments)", digest=acc.digest,
        info={**acc.info, "segments_of": acc.n_keys})
    return seg, w


def build_segments(acc: cf.BlockAccesses, capacity_blocks: int) -> cf.PrefixLP:
    """The prefix LP (``models/kv-caching-flow.md`` (6)-(9)) on the segments of ``acc``:
    node rows count ``w`` blocks per kept segment interval; objective = blocks hit.
    Refuses cost-weighted accesses (the equality with the block LP needs unit values)."""
    from scipy import sparse

    if acc.info.get("cost_weighted"):
        raise ValueError("build_segments: the segment LP equals the block LP for unit "
                         "values only; use cache_flow.build for recompute-weighted hits")
    t0 = time.perf_counter()
    C = cf.check_capacity(capacity_blocks)
    seg, w = segment_accesses(acc)
    n = seg.n_requests
    J = np.flatnonzero(seg.prev >= 0)
    start = seg.request[seg.prev[J]]
    end = seg.request[J]
    nj, ng = J.size, max(n - 1, 0)
    col_of = np.full(seg.n_accesses, -1, np.int64)
    col_of[J] = ng + np.arange(nj)
    wj = w[J].astype(np.float64)
    rows = [np.arange(ng), np.arange(1, n), start, end]
    cols = [np.arange(ng), np.arange(ng), col_of[J], col_of[J]]
    vals = [np.ones(ng), -np.ones(ng), -wj, wj]
    P = J[seg.depth[J] > 0]
    pr = n + np.arange(P.size)
    rows += [pr, pr]
    cols += [col_of[P], col_of[P - 1]]
    vals += [np.ones(P.size), -np.ones(P.size)]
    if P.size and np.any(col_of[P - 1] < 0):
        raise cf.ChainError(f"{acc.name}: a reused segment's parent has no earlier use")
    A = sparse.csc_matrix((np.concatenate(vals), (np.concatenate(rows),
                                                  np.concatenate(cols))),
                          shape=(n + P.size, ng + nj))
    A.sort_indices()
    seg_unit = cf.BlockAccesses(**{**seg.__dict__, "value_s": w.astype(np.float64)})
    return cf.PrefixLP(acc=seg_unit, capacity_blocks=C, access=J, start=start, end=end,
                       col_cost=np.concatenate([np.zeros(ng), -wj]),
                       col_upper=np.concatenate([np.full(ng, float(C)), np.ones(nj)]),
                       row_lower=np.concatenate([np.zeros(n), np.full(P.size, -np.inf)]),
                       row_upper=np.zeros(n + P.size), a_start=A.indptr, a_index=A.indices,
                       a_value=A.data, n_gap=ng, build_s=time.perf_counter() - t0)


def lp_hit_rate(acc: cf.BlockAccesses, capacity_blocks: int, *,
                time_limit_s: float | None = None) -> tuple[float, dict]:
    """The prefix-LP upper bound on the block hit rate of any schedule with
    ``capacity_blocks`` blocks, solved on segments; ``(hit rate, info)`` with the
    solver's status, columns, rows and seconds."""
    model = build_segments(acc, capacity_blocks)
    sol = cf.solve(model, time_limit_s=time_limit_s)
    if not sol.solved:
        raise RuntimeError(f"segment prefix LP did not solve: {sol.status} ({sol.message})")
    info = {"status": str(sol.status), "columns": int(model.col_cost.size),
            "rows": int(model.row_lower.size), "wall_s": sol.wall_s,
            "value_lp": sol.info["value_lp"]}
    return sol.info["value_lp"] / max(acc.n_accesses, 1), info


def block_hits(seg: cf.BlockAccesses, hits: np.ndarray) -> np.ndarray:
    """Prefix hits per request in blocks (int64 (n,)) from hits in leading segments of the
    unit-valued segment accesses ``seg`` of :func:`build_segments` (``value_s`` = blocks
    per segment access)."""
    hits = np.asarray(hits, np.int64)
    csum = np.concatenate([[0], np.cumsum(np.rint(seg.value_s).astype(np.int64))])
    return csum[seg.offsets[:-1] + hits] - csum[seg.offsets[:-1]]
