"""The KV-aware routers people deploy, with their documented rules and defaults.

Each reads only what the real router sees: the prefix-cache contents the engines report
through KV events (``RouterView.cached_tokens``, ``cached_blocks``) or the router's own
record of what it routed where, and queue and KV state. Every router first drops the
replicas that cannot hold the prompt (``RouterView.fits``; the engine would reject it
there) and picks among the others; when none can hold it, it picks the replica with the
largest capacity, whose engine then rejects the request with its reason.

* :class:`DynamoKV` -- NVIDIA Dynamo's KV router (``ai-dynamo/dynamo``,
  ``lib/llm/src/kv_router/scheduler.rs`` ``DefaultWorkerSelector`` and ``softmax_sample``,
  ``sequence.rs`` ``potential_blocks_and_tokens``; docs "KV Router", cost function).
* :class:`LlmdScheduler` -- llm-d's inference scheduler: filter, weighted scorers, max-score
  picker (``llm-d/llm-d`` guide ``precise-prefix-cache-aware`` scheduler values: precise
  prefix-cache 2, KV utilization 1, queue 1).
* :class:`SGLangCacheAware` -- the SGLang model gateway's ``cache_aware`` policy
  (``sgl-project/sglang``, ``sgl-model-gateway/src/policies/cache_aware.rs``; CLI defaults
  0.3 / 64 / 1.5, eviction every 120 s).

Preble's scheduler is in :mod:`lpserve.policies.routers_preble`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from lpserve.policy import Meta, Router, RouterView

__all__ = ["DynamoKV", "LlmdScheduler", "SGLangCacheAware", "feasible_or_largest"]


def feasible_or_largest(ok: np.ndarray, max_prompt_tokens: np.ndarray) -> np.ndarray:
    """The replicas a router may pick for one request: those that can hold it (``ok``,
    shape ``(R,)``), or, when none can, the one with the most room (its engine then
    rejects the request with the reason)."""
    if ok.any():
        return ok
    out = np.zeros_like(ok)
    out[int(np.argmax(max_prompt_tokens))] = True
    return out


def _require(view: RouterView, field: str, who: str) -> np.ndarray:
    v = getattr(view, field)
    if v is None:
        raise ValueError(f"router {who!r} reads RouterView.{field}, which this view does not "
                         "provide (the simulator fills it; pass it when building a view)")
    return v


class DynamoKV(Router):
    """NVIDIA Dynamo's KV router.

    For each worker ``m``: ``logit_m = overlap_score_weight x prefill_blocks_m +
    decode_blocks_m`` with ``prefill_blocks_m = (prefill tokens already pending on m +
    P - cached_m) / block_size`` (``cached_m``: the prompt's tokens cached on ``m``, from
    KV events) and ``decode_blocks_m`` = the blocks of the requests active on ``m`` plus
    the prompt's blocks not cached there. Lower is better. Temperature 0 picks the
    minimum, ties to the worker with the smallest prefix tree (fewest cached blocks), then
    the lowest index (Dynamo iterates a hash map there); a positive temperature samples
    ``softmax(-logit / ((max - min) x temperature))``. Requests routed in the same call
    count as active.

    Active blocks are read as the replica's KV blocks in use plus the blocks its pending
    prefill tokens will take (Dynamo counts a routed request's blocks from routing on;
    the engine allocates them as it prefills). Defaults are Dynamo's
    (``overlap_score_weight = 1``, ``router_temperature = 0``); the block size is the
    engine's KV block (``RouterView.block_tokens``).
    """

    name = "dynamo-kv"

    def __init__(self, overlap_score_weight: float = 1.0, temperature: float = 0.0) -> None:
        if not overlap_score_weight >= 0:
            raise ValueError(f"DynamoKV.overlap_score_weight must be >= 0, got "
                             f"{overlap_score_weight!r}")
        if not temperature >= 0:
            raise ValueError(f"DynamoKV.temperature must be >= 0, got {temperature!r}")
        self.overlap_score_weight = float(overlap_score_weight)
        self.temperature = float(temperature)
        self._rng: np.random.Generator | None = None
        if self.temperature > 0:
            self.meta = Meta(stochastic=True)

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Keep ``rng`` for the softmax sampling (temperature > 0)."""
        self._rng = rng

    def route(self, view: RouterView) -> np.ndarray:
        """One replica per arriving request, (n,) int64: the lowest logit
        ``overlap_score_weight x prefill blocks (pending plus this prompt's uncached) +
        decode blocks (active plus this prompt's new)`` over the replicas that can hold the
        prompt, ties to the fewest cached blocks (softmax-sampled when the temperature is
        positive); each choice adds its blocks for the next request of the call."""
        n = len(view)
        bs = float(view.block_tokens)
        hit = _require(view, "cached_tokens", self.name).astype(np.float64)
        pending = _require(view, "prefill_tokens", self.name).astype(np.float64).copy()
        tree = _require(view, "cached_blocks", self.name)
        active = view.used_blocks + np.ceil(pending / bs)
        P = view.prompt_tokens.astype(np.float64)
        fits = view.fits()
        out = np.empty(n, np.int64)
        for k in range(n):
            new_tokens = np.maximum(P[k] - hit[k], 0.0)
            new_blocks = np.maximum(np.ceil(P[k] / bs) - hit[k] / bs, 0.0)
            logit = (self.overlap_score_weight * (pending + new_tokens) / bs
                     + active + new_blocks)
            ok = feasible_or_largest(fits[k], view.max_prompt_tokens)
            logit = np.where(ok, logit, np.inf)
            if self.temperature == 0.0:
                cand = np.flatnonzero(logit == logit.min())
                c = int(cand[np.argmin(tree[cand])]) if cand.size > 1 else int(cand[0])
            else:
                c = self._sample(logit, ok)
            out[k] = c
            pending[c] += new_tokens[c]
            active[c] += new_blocks[c]
        return out

    def _sample(self, logit: np.ndarray, ok: np.ndarray) -> int:
        idx = np.flatnonzero(ok)
        v = logit[idx]
        span = float(v.max() - v.min())
        if span == 0.0:
            p = np.full(idx.size, 1.0 / idx.size)
        else:
            z = -(v / span) / self.temperature
            p = np.exp(z - z.max())
            p /= p.sum()
        return int(idx[min(int(np.searchsorted(np.cumsum(p), self._rng.random())),
                           idx.size - 1)])


def _minmax_high(x: np.ndarray) -> np.ndarray:
    """``(x - min) / (max - min)``; 1 everywhere when all are equal."""
    lo, hi = float(x.min()), float(x.max())
    return np.ones_like(x, dtype=np.float64) if hi == lo else (x - lo) / (hi - lo)


class LlmdScheduler(Router):
    """llm-d's inference scheduler: filter, score, pick.

    Scores, each in [0, 1], summed with weights; the max-score picker takes the highest
    (ties at random, as its shuffle does):

    * ``precise-prefix-cache-scorer`` (``prefix_weight``): the prompt's cached blocks on
      each replica from KV events, min-max normalized over the replicas that hold any
      (all equal: 1; replicas without any: 0);
    * ``kv-cache-utilization-scorer`` (``kv_weight``): ``1 - used_blocks / total_blocks``;
    * ``queue-scorer`` (``queue_weight``): ``(max - q) / (max - min)`` of the waiting
      queue (all equal: 1);
    * ``running-requests`` (``running_weight``, 0 by default): the same of the running
      batch; ``session-affinity`` (``session_weight``, 0 by default): 1 on the replica
      that served the request's session last.

    Defaults are the weights of llm-d's precise-prefix-cache-aware guide (2, 1, 1).
    Requests routed in the same call count in the queue of the replica they joined.
    """

    name = "llm-d"
    meta = Meta(stochastic=True)

    def __init__(self, prefix_weight: float = 2.0, kv_weight: float = 1.0,
                 queue_weight: float = 1.0, running_weight: float = 0.0,
                 session_weight: float = 0.0) -> None:
        w = (prefix_weight, kv_weight, queue_weight, running_weight, session_weight)
        if not all(x >= 0 for x in w):
            raise ValueError(f"LlmdScheduler weights must be >= 0, got {w}")
        (self.prefix_weight, self.kv_weight, self.queue_weight, self.running_weight,
         self.session_weight) = (float(x) for x in w)
        self._rng: np.random.Generator | None = None
        self._session: dict[int, int] = {}

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Keep ``rng`` (uniform choice among equal top scores) and forget the session
        affinity map."""
        self._rng = rng
        self._session = {}

    def route(self, view: RouterView) -> np.ndarray:
        """One replica per arriving request, (n,) int64: the highest weighted sum of the
        scorers (prefix, KV utilization, queue, running, session affinity) over the replicas
        that can hold the prompt; each choice updates the queue and KV of the next."""
        n, R = len(view), view.n_replicas
        bs = float(view.block_tokens)
        hit = _require(view, "cached_tokens", self.name)
        queue = view.waiting.astype(np.float64).copy()
        run = view.running.astype(np.float64)
        used = view.used_blocks.astype(np.float64).copy()
        total = np.maximum(view.total_blocks, 1).astype(np.float64)
        fits = view.fits()
        sess = view.session_id
        P = view.prompt_tokens
        out = np.empty(n, np.int64)
        for k in range(n):
            blocks = hit[k] // int(bs)
            pre = np.zeros(R)
            held = blocks > 0
            if held.any():
                pre[held] = _minmax_high(blocks[held].astype(np.float64))
            score = (self.prefix_weight * pre + self.kv_weight * (1.0 - used / total)
                     + self.queue_weight * _minmax_high(-queue))
            if self.running_weight:
                score += self.running_weight * _minmax_high(-run)
            s = int(sess[k])
            if self.session_weight and s >= 0 and s in self._session:
                score[self._session[s]] += self.session_weight
            ok = feasible_or_largest(fits[k], view.max_prompt_tokens)
            score = np.where(ok, score, -np.inf)
            best = np.flatnonzero(score == score.max())
            c = int(best[self._rng.integers(best.size)]) if best.size > 1 else int(best[0])
            out[k] = c
            queue[c] += 1
            used[c] += max(np.ceil(P[k] / bs) - blocks[c], 0)
            if s >= 0:
                self._session[s] = c
        return out


class SGLangCacheAware(Router):
    """The SGLang model gateway's ``cache_aware`` policy.

    The router keeps an approximate prefix tree per worker from the requests it routed
    there (the prompt's ``block_keys``; SGLang's tree holds request text) with LRU
    eviction down to ``max_tree_tokens`` every ``eviction_interval_s`` (simulated time).
    With per-worker load ``L`` = outstanding requests (plus those routed in the same
    call): when ``max L - min L > balance_abs_threshold`` and ``max L >
    balance_rel_threshold x min L`` it routes to the least-loaded worker; otherwise to
    the worker with the longest matched prefix if ``matched / prompt blocks >
    cache_threshold`` (ties: least loaded), else to the least-loaded worker (as the code
    does; its header comment says "smallest tree"). Either way the prompt is inserted into
    the chosen worker's tree. Defaults are the gateway CLI's (0.3, 64, 1.5, 120 s,
    67,108,864 characters, taken here as 16,777,216 tokens at 4 characters a token).
    """

    name = "sglang-cache-aware"

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, eviction_interval_s: float = 120.0,
                 max_tree_tokens: int = 1 << 24) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"SGLangCacheAware.cache_threshold must be in [0, 1], got "
                             f"{cache_threshold!r}")
        if not eviction_interval_s > 0 or not max_tree_tokens >= 1:
            raise ValueError("SGLangCacheAware: eviction_interval_s must be > 0 and "
                             f"max_tree_tokens >= 1, got {eviction_interval_s!r}, "
                             f"{max_tree_tokens!r}")
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.eviction_interval_s = float(eviction_interval_s)
        self.max_tree_tokens = int(max_tree_tokens)
        self._trees: list[OrderedDict] = []
        self._next_evict_s = self.eviction_interval_s

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget the approximate per-replica trees and restart the eviction clock."""
        self._trees = []
        self._next_evict_s = self.eviction_interval_s

    def _evict(self, key_tokens: int) -> None:
        cap = max(1, self.max_tree_tokens // max(key_tokens, 1))
        for tree in self._trees:
            while len(tree) > cap:
                tree.popitem(last=False)

    def route(self, view: RouterView) -> np.ndarray:
        """One replica per arriving request, (n,) int64, over the replicas that can hold
        the prompt: the fewest outstanding requests when the load is imbalanced (both
        thresholds exceeded) or no tree matches more than ``cache_threshold`` of the
        prompt's blocks; else the longest match (ties to the least loaded). The prompt's
        blocks then join the chosen replica's tree."""
        R, n = view.n_replicas, len(view)
        if len(self._trees) != R:
            self._trees = [OrderedDict() for _ in range(R)]
        while view.now_s >= self._next_evict_s:
            self._evict(view.key_tokens)
            self._next_evict_s += self.eviction_interval_s
        load = view.outstanding.astype(np.int64).copy()
        fits = view.fits()
        keys_all = view.block_keys
        out = np.empty(n, np.int64)
        for k in range(n):
            ok = feasible_or_largest(fits[k], view.max_prompt_tokens)
            cand = np.flatnonzero(ok)
            lc = load[cand]
            least = int(cand[np.argmin(lc)])
            lo, hi = int(lc.min()), int(lc.max())
            imbalanced = (hi - lo > self.balance_abs_threshold
                          and hi > self.balance_rel_threshold * lo)
            keys = keys_all[k].tolist() if k < len(keys_all) else []
            choice = least
            if not imbalanced and keys:
                match = np.zeros(R, np.int64)
                for r in cand.tolist():
                    tree, m = self._trees[r], 0
                    for h in keys:
                        if h not in tree:
                            break
                        m += 1
                    match[r] = m
                best = int(match.max())
                if best / len(keys) > self.cache_threshold:
                    top = np.flatnonzero((match == best) & ok)
                    choice = int(top[np.argmin(load[top])])
            tree = self._trees[choice]
            for h in keys:
                tree[h] = None
                tree.move_to_end(h)
            out[k] = choice
            load[choice] += 1
        return out
