"""Progress of long simulations without touching the simulator (layer 5).

:func:`counting` wraps a policy's router in a :class:`CountingRouter` that reports how
many requests it routed after each decision. The simulator calls the router once per
batch of simultaneous arrivals, in arrival order, so the count is the share of the trace
that has arrived; what is left after the last arrival (draining the queues) is not
counted. The wrapper delegates ``reset`` and ``route`` unchanged, so a run with it gives
the same per-request results as one without.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from lpserve.policy import Router, RouterView


class CountingRouter(Router):
    """``inner`` that calls ``on_routed(n)`` after routing ``n`` requests."""

    def __init__(self, inner: Router, on_routed: Callable[[int], None]) -> None:
        self.inner = inner
        self.on_routed = on_routed
        self.name = inner.name
        self.meta = inner.meta
        self.reads_predictions = getattr(inner, "reads_predictions", False)

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """The inner router's reset, unchanged."""
        self.inner.reset(cluster, rng)

    def route(self, view: RouterView) -> np.ndarray:
        """The inner router's replica per arriving request ``(n,)``; then counts ``n``."""
        out = self.inner.route(view)
        self.on_routed(len(view))
        return out


def counting(policy: Any, on_routed: Callable[[int], None] | None) -> Any:
    """``policy`` with its (prefill / colocated) router counted; unchanged for ``None``."""
    if on_routed is None:
        return policy
    return policy.with_(router=CountingRouter(policy.router, on_routed), meta=policy.meta)


__all__ = ["CountingRouter", "counting"]
