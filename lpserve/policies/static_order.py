"""Offline schedules as policies: a fixed priority per request and a fixed replica per request.

==================  =========================================================================
``StaticOrder``     rank = ``keys[request]``, a priority fixed before the run (lower first);
                    declares ``rank_key = "static"`` so the compiled replica loop orders by
                    the key array itself (``lpserve/sim/compiled.py``).
``StaticRoute``     replica = ``replicas[request]``, an assignment fixed before the run.
==================  =========================================================================

Both are offline (they see the whole instance through the arrays they are built with) and
are what :mod:`lpserve.opt.schedule_search` exports: a priority order found by search,
evaluated by the simulator. A key array must have one finite entry per request of the
instance it runs on; a mismatch raises :class:`~lpserve.policy.PolicyError` naming the sizes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.policy import Meta, PolicyError, Router, RouterView, Scheduler, SchedulerView

__all__ = ["StaticOrder", "StaticRoute", "order_keys"]


def order_keys(order: Any) -> np.ndarray:
    """Keys (float64, shape (n,)) that rank the requests in ``order`` (a permutation of
    ``0..n-1``, first = highest priority): ``keys[order[k]] = k``."""
    o = np.asarray(order, dtype=np.int64)
    n = o.size
    if n and (o.min() < 0 or o.max() >= n or np.unique(o).size != n):
        raise ValueError(f"order must be a permutation of 0..{n - 1}, got {o[:8].tolist()}...")
    keys = np.empty(n, np.float64)
    keys[o] = np.arange(n, dtype=np.float64)
    return keys


class StaticOrder(Scheduler):
    """Rank = ``keys[request]`` (lower runs first; ties by queue position, as every rank).

    Args:
        keys: one finite priority per request of the trace (shape (n,)).
        name: the scheduler's name in results.
    """

    rank_key = "static"
    meta = Meta(online=False)

    def __init__(self, keys: Any, name: str = "static-order") -> None:
        k = np.array(keys, dtype=np.float64).reshape(-1)
        if k.size and not np.all(np.isfinite(k)):
            bad = int(np.flatnonzero(~np.isfinite(k))[0])
            raise ValueError(f"StaticOrder: keys[{bad}] = {k[bad]!r} is not finite")
        k.setflags(write=False)
        self.keys = k
        self.name = str(name)

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Nothing to reset: the keys are fixed."""

    def check_size(self, n_requests: int) -> None:
        """Raise :class:`PolicyError` unless there is one key per request."""
        if self.keys.size != int(n_requests):
            raise PolicyError(f"StaticOrder {self.name!r} has {self.keys.size} keys, the trace "
                              f"has {int(n_requests)} requests")

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin (``lpserve/sim/_ranks.py``, kind ``static``): the keys after
        one unused slot (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        return "static", [0.0, *self.keys.tolist()], [0]

    def rank(self, view: SchedulerView) -> np.ndarray:
        """``keys[view.request]`` (float64, shape (len(view),))."""
        req = np.asarray(view.request, np.int64)
        if req.size and int(req.max()) >= self.keys.size:
            self.check_size(int(req.max()) + 1)
        return self.keys[req].copy()


class StaticRoute(Router):
    """Replica = ``replicas[request]``, fixed before the run.

    Args:
        replicas: replica index per request of the trace (int, shape (n,)).
        name: the router's name in results.
    """

    meta = Meta(online=False)

    def __init__(self, replicas: Any, name: str = "static-route") -> None:
        r = np.array(replicas, dtype=np.int64).reshape(-1)
        if r.size and r.min() < 0:
            raise ValueError(f"StaticRoute: replica indices must be >= 0, got {int(r.min())}")
        r.setflags(write=False)
        self.replicas = r
        self.name = str(name)

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Nothing to reset: the assignment is fixed."""

    def route(self, view: RouterView) -> np.ndarray:
        """``replicas[view.request]``; an index past the cluster raises PolicyError."""
        req = np.asarray(view.request, np.int64)
        if req.size and int(req.max()) >= self.replicas.size:
            raise PolicyError(f"StaticRoute {self.name!r} has {self.replicas.size} entries, "
                              f"request {int(req.max())} was routed")
        out = self.replicas[req].copy()
        if out.size and int(out.max()) >= view.n_replicas:
            raise PolicyError(f"StaticRoute {self.name!r} sends a request to replica "
                              f"{int(out.max())} of a {view.n_replicas}-replica pool")
        return out
