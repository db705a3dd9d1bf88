"""The optional rebalancing role of the policy contract (:mod:`lpserve.policy`).

A :class:`Rebalancer` in ``Policy.rebalancer`` is asked every ``period_s`` seconds of
simulated time with a :class:`RebalanceView` of one pool of replicas and returns live
migrations ``(request, destination)`` of decoding requests. The simulator's mechanics are
``models/simulator.md`` (24)–(25); policies are in :mod:`lpserve.policies.rebalancers`.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable

import numpy as np

from lpserve.policy import Meta, _Role

__all__ = ["RebalanceView", "Rebalancer"]


@dataclass(frozen=True, eq=False)
class RebalanceView:
    """A pool of replicas at one rebalancing point.

    Replica arrays, shape ``(n_replicas,)`` (int64): ``free_blocks`` (KV blocks free or
    evictable, minus the admission watermark; may be negative), ``total_blocks``,
    ``running`` and ``waiting`` (request counts), ``seats`` (room left in the running
    batch), ``waiting_blocks`` (tuple of int64 arrays: KV blocks each waiting request
    needs to be admitted, in queue order). Candidate arrays, shape ``(n,)``: the running
    requests in decode phase, the only ones that may migrate: ``request`` (trace index),
    ``replica`` (source), ``prompt_tokens``, ``generated_tokens``, ``context_tokens``
    (tokens whose KV would move), ``blocks`` (KV blocks held, taken on the destination),
    ``migration_s`` (transfer time of that KV over the source's link, s),
    ``predicted_lo``/``predicted_hi`` (or ``None``), ``output_tokens`` (clairvoyant
    policies only, else ``None``). ``decode_iteration_s(context_tokens)`` is the cost
    model's time (s) of one decode iteration over a batch with those contexts.
    """

    now_s: float
    block_tokens: int
    free_blocks: np.ndarray
    total_blocks: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    seats: np.ndarray
    waiting_blocks: tuple[np.ndarray, ...]
    request: np.ndarray
    replica: np.ndarray
    prompt_tokens: np.ndarray
    generated_tokens: np.ndarray
    context_tokens: np.ndarray
    blocks: np.ndarray
    migration_s: np.ndarray
    predicted_lo: np.ndarray | None
    predicted_hi: np.ndarray | None
    output_tokens: np.ndarray | None
    decode_iteration_s: Callable[[np.ndarray], float]

    @property
    def n_replicas(self) -> int:
        return int(self.free_blocks.shape[0])

    def __len__(self) -> int:
        return int(self.request.shape[0])


class Rebalancer(_Role):
    """Moves running (decoding) requests between replicas of one pool.

    ``period_s``: the simulator asks every ``period_s`` seconds of simulated time (never
    per iteration). ``migrate(view)`` returns ``(request, destination)`` rows; each
    request's KV is copied to the destination (``models/simulator.md``, migration).
    """

    period_s: float = 1.0
    meta: Meta = Meta(engines=("lpserve",))  # live migration exists in lpserve's simulator

    @abc.abstractmethod
    def migrate(self, view: RebalanceView) -> np.ndarray:
        """int64 array ``(n_moves, 2)`` of (request, destination replica) rows."""
