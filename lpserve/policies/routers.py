"""Routers: round robin, random, least outstanding requests, least KV load, power of two
choices, prefix affinity with load-balance thresholds (SGLang's ``cache_aware``), and
Autellix's program-aware load balancer."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from lpserve.policy import Meta, RoundRobin, Router, RouterView

__all__ = ["RoundRobin", "RandomRouter", "LeastOutstanding", "LeastKVLoad", "PowerOfTwo",
           "PrefixAffinity", "ProgramAffinity"]


class RandomRouter(Router):
    """Uniformly random replica (from the ``rng`` given to ``reset``)."""

    name = "random"
    meta = Meta(stochastic=True)

    def __init__(self) -> None:
        self._rng: np.random.Generator | None = None

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Take ``rng`` as the router's only source of randomness."""
        self._rng = rng

    def route(self, view: RouterView) -> np.ndarray:
        """A replica drawn uniformly from ``[0, n_replicas)`` for each arriving request,
        int64 ``(n_arriving,)``."""
        return self._rng.integers(0, view.n_replicas, size=len(view)).astype(np.int64)


def _argmin_sequential(load: np.ndarray, n: int, add: np.ndarray | None = None) -> np.ndarray:
    """Route ``n`` requests one after another to the least-loaded replica (ties: lowest
    index), counting each routed request as one unit of load (or ``add[k]`` units)."""
    load = load.astype(np.float64).copy()
    out = np.empty(n, np.int64)
    for k in range(n):
        r = int(np.argmin(load))
        out[k] = r
        load[r] += 1.0 if add is None else add[k]
    return out


class LeastOutstanding(Router):
    """Join the replica with the fewest outstanding (routed, unfinished) requests."""

    name = "least-outstanding"

    def route(self, view: RouterView) -> np.ndarray:
        """Each arriving request, in order, to the replica with the fewest outstanding
        requests (ties: lowest index); a request routed in this call counts as one more
        outstanding. int64 ``(n_arriving,)``."""
        return _argmin_sequential(view.outstanding, len(view))


class LeastKVLoad(Router):
    """Join the replica with the lowest share of KV blocks in use."""

    name = "least-kv"

    def route(self, view: RouterView) -> np.ndarray:
        """Each arriving request, in order, to the replica with the lowest
        ``used_blocks / total_blocks`` (ties: lowest index); a request routed in this call adds
        its prompt's blocks, divided by the mean replica size, to its replica's share. int64
        ``(n_arriving,)``."""
        total = np.maximum(view.total_blocks, 1).astype(float)
        # a request routed in the same call counts with its prompt's blocks
        add = np.ceil(view.prompt_tokens / view.block_tokens) / total.mean()
        return _argmin_sequential(view.used_blocks / total, len(view), add)


class PowerOfTwo(Router):
    """Sample two distinct replicas, join the one with fewer outstanding requests."""

    name = "power-of-two"
    meta = Meta(stochastic=True)

    def __init__(self) -> None:
        self._rng: np.random.Generator | None = None

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Take ``rng`` as the router's only source of randomness."""
        self._rng = rng

    def route(self, view: RouterView) -> np.ndarray:
        """For each arriving request, two distinct replicas drawn uniformly; the one with
        fewer outstanding requests (ties: lower index) wins and counts one more. With one replica,
        replica 0. int64 ``(n_arriving,)``."""
        R = view.n_replicas
        load = view.outstanding.astype(np.int64).copy()
        out = np.empty(len(view), np.int64)
        for k in range(len(view)):
            if R == 1:
                out[k] = 0
            else:
                a, b = self._rng.choice(R, size=2, replace=False)
                out[k] = a if (load[a], a) <= (load[b], b) else b
            load[out[k]] += 1
        return out


class PrefixAffinity(Router):
    """SGLang's cache-aware router over prefix-block hashes.

    Per replica the router remembers the block hashes it routed there (an approximate
    radix tree, LRU-bounded to ``max_tree_blocks``). If load is imbalanced —
    ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min`` on
    outstanding requests — it joins the least-loaded replica; otherwise the replica with
    the longest matched prefix if ``matched / total blocks > cache_threshold``, else the
    least-loaded one. Defaults are SGLang's (0.3, 64, 1.5).
    """

    name = "prefix-affinity"

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, max_tree_blocks: int = 1 << 20) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"PrefixAffinity.cache_threshold must be in [0, 1], got "
                             f"{cache_threshold}")
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.max_tree_blocks = int(max_tree_blocks)
        self._trees: list[OrderedDict] = []

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget every replica's remembered prefix-block hashes."""
        self._trees = []

    def route(self, view: RouterView) -> np.ndarray:
        """Replica per arriving request, int64 ``(n_arriving,)``, decided in order (the
        rule of the class docstring); the chosen replica remembers the request's block hashes
        (most recent last, oldest dropped past ``max_tree_blocks``) and counts one more
        outstanding request."""
        R = view.n_replicas
        if len(self._trees) != R:
            self._trees = [OrderedDict() for _ in range(R)]
        load = view.outstanding.astype(np.int64).copy()
        out = np.empty(len(view), np.int64)
        for k, keys in enumerate(view.block_keys):
            lo, hi = int(load.min()), int(load.max())
            least = int(np.argmin(load))
            imbalanced = (hi - lo > self.balance_abs_threshold
                          and hi > self.balance_rel_threshold * lo)
            choice = least
            if not imbalanced and keys.size:
                match = np.zeros(R, np.int64)
                for r, tree in enumerate(self._trees):
                    m = 0
                    for h in keys.tolist():
                        if h not in tree:
                            break
                        m += 1
                    match[r] = m
                best = int(np.argmax(match))
                if match[best] / keys.size > self.cache_threshold:
                    choice = best
            tree = self._trees[choice]
            for h in keys.tolist():
                tree[h] = None
                tree.move_to_end(h)
            while len(tree) > self.max_tree_blocks:
                tree.popitem(last=False)
            out[k] = choice
            load[choice] += 1
        return out


class ProgramAffinity(Router):
    """Autellix's multi-engine load balancer (Algorithm 2): a call of at most
    ``long_tokens`` prompt tokens goes to the least-used engine (the fewest outstanding
    calls), since short calls share little more than a system prompt, which every engine
    holds; a longer call goes to its program's engine (KV locality), or, for a program
    that has none yet, to the least-used engine, which becomes the program's. Calls
    outside programs (``program_id`` -1 or none) are short calls."""

    name = "autellix-lb"

    def __init__(self, long_tokens: int = 2048) -> None:
        if not (isinstance(long_tokens, (int, np.integer)) and long_tokens >= 1):
            raise ValueError(f"autellix-lb: long_tokens must be an integer >= 1, got "
                             f"{long_tokens!r}")
        self.long_tokens = int(long_tokens)
        self._engine: dict[int, int] = {}

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget every program's engine (``cluster`` and ``rng`` unused)."""
        self._engine = {}

    def route(self, view: RouterView) -> np.ndarray:
        """Engine index per request of ``view``, shape ``(len(view),)``: the least-used
        engine (outstanding calls, counting the calls routed in this batch) for calls of
        at most ``long_tokens`` prompt tokens, the program's engine for longer ones."""
        load = view.outstanding.astype(np.float64).copy()
        pids = view.program_id
        out = np.empty(len(view), np.int64)
        for k, p in enumerate(view.prompt_tokens.tolist()):
            pid = -1 if pids is None else int(pids[k])
            r = int(np.argmin(load))
            if p > self.long_tokens and pid >= 0:
                r = self._engine.setdefault(pid, r)
            out[k] = r
            load[r] += 1.0
        return out
