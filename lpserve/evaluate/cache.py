"""Fast KV prefix-cache replay: hit rates of evictors and bounds on a block-id trace.

Semantics (``models/kv-caching-flow.md`` section 1, the Mooncake setting): cold start;
requests in trace order; a request hits on the longest leading run of its prefix blocks in
the cache; after it is served all its blocks are in the cache and the evictor keeps at most
``capacity_blocks`` until the next request. Hit rate = hit blocks / prompt blocks.

``cache_replay(trace, capacity_blocks=5859, policy="lru")`` runs one evictor in numba
(>= 1 M block accesses per second), independently of the full simulator. Policy names:
``"lru"`` and every name of :data:`lpserve.policies.evictors_kv.SPECS`, the offline
``"belady"`` (farthest next use, shallow first) and ``"belady-prefix"`` (deepest first), the
bounds ``"infinite"`` (no capacity limit), ``"lp"`` (prefix LP upper bound) and
``"lp-rounded"`` (its rounded feasible schedule).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lpserve.opt import cache_flow as cf
from lpserve.opt import cache_segments as cs
from lpserve.trace import Trace

BOUNDS = ("infinite", "lp", "lp-rounded", "belady-prefix")


@dataclass(frozen=True, eq=False)
class CacheReplayResult:
    """Outcome of one replay.

    Attributes:
        policy, capacity_blocks: what ran.
        hits: prefix-hit blocks; accesses: prompt blocks in the trace.
        hit_rate: hits / accesses (block-weighted, the reference's metric).
        prefill_tokens_saved: prompt tokens in hit blocks (a partial last block counts its
            tokens); token_hit_rate: that over all prompt tokens.
        recompute_s_saved: prefill seconds saved by the hits when a cost model was given
            (``models/kv-caching-flow.md`` (10)), else NaN.
        hits_per_request: int64 (n,) prefix-hit blocks per request.
        wall_s: seconds of the replay itself (not the trace preparation).
    """

    policy: str
    capacity_blocks: int
    hits: int
    accesses: int
    hit_rate: float
    prefill_tokens_saved: int
    token_hit_rate: float
    recompute_s_saved: float
    wall_s: float
    hits_per_request: np.ndarray = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every scalar field (``hits_per_request`` is left out);
        ``recompute_s_saved`` and ``wall_s`` in seconds."""
        return {"policy": self.policy, "capacity_blocks": self.capacity_blocks,
                "hits": self.hits, "accesses": self.accesses, "hit_rate": self.hit_rate,
                "prefill_tokens_saved": self.prefill_tokens_saved,
                "token_hit_rate": self.token_hit_rate,
                "recompute_s_saved": self.recompute_s_saved, "wall_s": self.wall_s}


def policy_names() -> list[str]:
    """Every name :func:`cache_replay` accepts."""
    from lpserve.policies.evictors_kv import OFFLINE_SPECS, SPECS

    return list(dict.fromkeys(["lru", *SPECS, *OFFLINE_SPECS, *BOUNDS]))


def _result(acc: cf.BlockAccesses, policy: str, C: int, hits_req: np.ndarray,
            wall_s: float) -> CacheReplayResult:
    hits_req = np.asarray(hits_req, np.int64)
    mask = np.zeros(acc.n_accesses, bool)
    starts = acc.offsets[:-1]
    idx = np.repeat(starts, hits_req) + (np.arange(int(hits_req.sum()))
                                         - np.repeat(np.cumsum(hits_req) - hits_req, hits_req))
    mask[idx] = True
    tokens_saved = int(acc.tokens[mask].sum())
    total_tokens = max(int(acc.tokens.sum()), 1)
    weighted = bool(acc.info.get("cost_weighted"))
    A = acc.n_accesses
    return CacheReplayResult(
        policy=policy, capacity_blocks=C, hits=int(hits_req.sum()), accesses=A,
        hit_rate=float(hits_req.sum()) / A if A else float("nan"),
        prefill_tokens_saved=tokens_saved, token_hit_rate=tokens_saved / total_tokens,
        recompute_s_saved=float(acc.value_s[mask].sum()) if weighted else float("nan"),
        wall_s=wall_s, hits_per_request=hits_req)


def replay_accesses(acc: cf.BlockAccesses, capacity_blocks: int, policy: str = "lru",
                    **overrides: Any) -> CacheReplayResult:
    """:func:`cache_replay` on prepared :class:`~lpserve.opt.cache_flow.BlockAccesses`
    (prepare once, replay many evictors). ``overrides`` change the evictor's spec fields
    (e.g. ``credit_s``)."""
    from lpserve.policies.evictors_kv import replay_hits, spec

    C = cf.check_capacity(capacity_blocks)
    t0 = time.perf_counter()
    if policy == "infinite":
        hits = cf.prefix_hits_from_mask(acc, acc.prev >= 0)
    elif policy in ("lp", "lp-rounded"):
        # the bound on block hits is solved on segments (the same optimum, far fewer columns)
        segs = policy == "lp" and not acc.info.get("cost_weighted")
        model = cs.build_segments(acc, C) if segs else cf.build(acc, C)
        sol = cf.solve(model)
        if not sol.solved:
            raise RuntimeError(f"prefix LP did not solve: {sol.status} ({sol.message})")
        if policy == "lp":  # fractional: report the bound as a hit count
            hits = (cs.block_hits(model.acc, sol.primal["hits"]) if segs
                    else sol.primal["hits"])
            res = _result(acc, policy, C, hits, time.perf_counter() - t0)
            h = float(sol.info["value_lp"]) if segs else float(np.sum(sol.primal["h"]))
            return CacheReplayResult(**{**res.__dict__, "hits": int(round(h)),
                                        "hit_rate": h / max(acc.n_accesses, 1)})
        hits = sol.primal["hits"]
    elif policy == "belady-prefix":  # cf.belady(acc, C, tie="deep") by the numba kernel
        from lpserve.policies.evictors_kv import OFFLINE_SPECS
        hits = replay_hits(acc, C, OFFLINE_SPECS["belady-prefix"])
    else:
        hits = replay_hits(acc, C, spec(policy, **overrides))
    return _result(acc, policy, C, hits, time.perf_counter() - t0)


def cache_replay(trace: Trace, capacity_blocks: int = 5859, policy: str = "lru", *,
                 cost: Any = None, **overrides: Any) -> CacheReplayResult:
    """Hit rate of one evictor (or bound) on ``trace``'s prefix blocks.

    Args:
        trace: a :class:`~lpserve.trace.Trace` with block ids (``block_flat``); block lists
            must be hash chains (a :class:`~lpserve.opt.cache_flow.ChainError` names the
            first bad request).
        capacity_blocks: blocks kept between requests (>= 1).
        policy: see :func:`policy_names`.
        cost: an ``lpserve.cost`` model; fills ``recompute_s_saved`` and weights ``gdsf``.
    """
    C = cf.check_capacity(capacity_blocks)
    if policy not in policy_names():
        raise KeyError(f"unknown cache policy {policy!r}; known: {policy_names()}")
    acc = cf.block_accesses(trace, cost=cost)
    return replay_accesses(acc, C, policy, **overrides)
