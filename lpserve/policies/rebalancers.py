"""Rebalancers: live migration of decoding requests between replicas of one pool.

============================  =========================================================
``NoMigration``               never migrates (the baseline; equal to no rebalancer).
``LlumnixFreeness``           Llumnix (Sun et al., OSDI 2024): per replica, freeness
                              ``F = (M - sum V) / B`` (free KV blocks minus the virtual
                              usage of the queue's head, per running request); while the
                              gap between the lowest- and highest-freeness replicas
                              exceeds ``threshold_blocks`` and the lowest is below
                              ``source_below_blocks``, move the source's request with the
                              fewest KV blocks (cheapest copy) to the highest.
============================  =========================================================

The optimizing rebalancer (the MILP of ``models/rebalancing.md``) is
:class:`lpserve.opt.rebalance.AssignmentRebalancer`. Registered as ``rebalance-llumnix``
and ``rebalance-lp`` (:mod:`lpserve.registry`): the ``vllm-v0`` engine behind a round-robin
router with the rebalancer (``period_s``, router and engine fields are keyword
arguments).
"""
from __future__ import annotations

import numpy as np

from lpserve.policy import Rebalancer, RebalanceView

__all__ = ["NO_MOVES", "LlumnixFreeness", "NoMigration", "check_period"]

#: ``migrate()``'s answer for no move (copy it before returning: arrays are mutable).
NO_MOVES = np.zeros((0, 2), np.int64)


def check_period(period_s: float) -> float:
    """``period_s`` as a float > 0 (seconds between rebalancing decisions)."""
    p = float(period_s)
    if not p > 0:
        raise ValueError(f"period_s must be > 0, got {period_s!r}")
    return p


class NoMigration(Rebalancer):
    """Never migrates."""

    name = "none"

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = check_period(period_s)

    def migrate(self, view: RebalanceView) -> np.ndarray:
        """No moves: an empty int64 ``(0, 2)`` array."""
        return NO_MOVES.copy()


class LlumnixFreeness(Rebalancer):
    """Freeness heuristic (see the module table); at most ``max_moves`` per decision."""

    name = "llumnix"

    def __init__(self, period_s: float = 0.5, threshold_blocks: float = 64.0,
                 source_below_blocks: float = 32.0, max_moves: int = 4) -> None:
        self.period_s = check_period(period_s)
        if not threshold_blocks >= 0:
            raise ValueError(f"threshold_blocks must be >= 0, got {threshold_blocks!r}")
        if not isinstance(max_moves, int) or max_moves < 1:
            raise ValueError(f"max_moves must be a positive integer, got {max_moves!r}")
        self.threshold_blocks = float(threshold_blocks)
        self.source_below_blocks = float(source_below_blocks)
        self.max_moves = max_moves

    def freeness(self, view: RebalanceView, free: np.ndarray,
                 running: np.ndarray) -> np.ndarray:
        """``F_d = (free_d - head_d) / max(running_d, 1)`` in blocks per request, where
        ``head_d`` is the KV need of the first waiting request (Llumnix's virtual usage)."""
        head = np.array([w[0] if w.size else 0 for w in view.waiting_blocks], np.float64)
        return (free - head) / np.maximum(running, 1)

    def migrate(self, view: RebalanceView) -> np.ndarray:
        """Up to ``max_moves`` ``(request, destination)`` rows, int64 ``(n_moves, 2)``:
        each from the lowest-freeness replica (the source's request with the fewest KV blocks,
        ties by request id) to the highest, while the freeness gap exceeds ``threshold_blocks``,
        the source is below ``source_below_blocks``, and the destination has a free seat and
        room for the blocks now. Freeness is updated after each move as if the copy had landed
        (the source's blocks are freed only then, so they never count as room)."""
        free = view.free_blocks.astype(np.float64)   # for freeness: after the copies land
        room = view.free_blocks.astype(np.float64)   # for capacity: blocks free now
        running = view.running.astype(np.float64)
        seats = view.seats.copy()
        moved: set[int] = set()
        out = []
        for _ in range(self.max_moves):
            F = self.freeness(view, free, running)
            s, d = int(np.argmin(F)), int(np.argmax(F))
            if F[d] - F[s] <= self.threshold_blocks or F[s] >= self.source_below_blocks:
                break
            cand = [k for k in np.flatnonzero(view.replica == s).tolist()
                    if int(view.request[k]) not in moved and view.blocks[k] <= room[d]]
            if not cand or seats[d] < 1:
                break
            k = min(cand, key=lambda k: (int(view.blocks[k]), int(view.request[k])))
            i, b = int(view.request[k]), float(view.blocks[k])
            out.append((i, d))
            moved.add(i)
            free[d] -= b
            room[d] -= b
            free[s] += b  # freed once the copy lands, not before
            running[d] += 1
            running[s] -= 1
            seats[d] -= 1
        return np.array(out, np.int64).reshape(-1, 2)
