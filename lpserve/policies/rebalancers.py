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
``AssignmentRebalancer``      the MILP of ``models/rebalancing.md`` solved with HiGHS
                              (:mod:`lpserve.opt.rebalance`).
============================  =========================================================

Registered as ``rebalance-llumnix`` and ``rebalance-lp``: the ``vllm`` engine behind a
round-robin router with the rebalancer (``period_s``, router and engine fields are
keyword arguments).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.policy import Policy
from lpserve.rebalancer import Rebalancer, RebalanceView

__all__ = ["NoMigration", "LlumnixFreeness", "AssignmentRebalancer", "rebalanced"]

_NONE = np.zeros((0, 2), np.int64)


def _period(period_s: float) -> float:
    p = float(period_s)
    if not p > 0:
        raise ValueError(f"period_s must be > 0, got {period_s!r}")
    return p


class NoMigration(Rebalancer):
    """Never migrates."""

    name = "none"

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = _period(period_s)

    def migrate(self, view: RebalanceView) -> np.ndarray:
        return _NONE.copy()


class LlumnixFreeness(Rebalancer):
    """Freeness heuristic (see the module table); at most ``max_moves`` per decision."""

    name = "llumnix"

    def __init__(self, period_s: float = 0.5, threshold_blocks: float = 64.0,
                 source_below_blocks: float = 32.0, max_moves: int = 4) -> None:
        self.period_s = _period(period_s)
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


class AssignmentRebalancer(Rebalancer):
    """Solves ``models/rebalancing.md`` (9)–(15) at every decision; migrates the moves of
    the optimum when its value exceeds ``min_gain_s`` request-seconds.

    ``info``: the last solve's status, objective and wall time (for inspection).
    ``time_limit_s`` (default ``None``: solve to optimality) makes decisions depend on the
    machine's speed when it binds, so runs are reproducible only without it.
    """

    name = "assignment-lp"

    def __init__(self, period_s: float = 0.5, cost_weight: float = 1.0,
                 min_gain_s: float = 0.0, default_remaining_tokens: float = 128.0,
                 max_candidates: int = 64, time_limit_s: float | None = None) -> None:
        self.period_s = _period(period_s)
        if not isinstance(max_candidates, int) or max_candidates < 1:
            raise ValueError(f"max_candidates must be a positive integer, got "
                             f"{max_candidates!r}")
        if not cost_weight >= 0:
            raise ValueError(f"cost_weight must be >= 0, got {cost_weight!r}")
        if not default_remaining_tokens >= 1:
            raise ValueError(f"default_remaining_tokens must be >= 1, got "
                             f"{default_remaining_tokens!r}")
        self.cost_weight = float(cost_weight)
        self.min_gain_s = float(min_gain_s)
        self.default_remaining_tokens = float(default_remaining_tokens)
        self.max_candidates = max_candidates
        if time_limit_s is not None and not time_limit_s > 0:
            raise ValueError(f"time_limit_s must be None or > 0, got {time_limit_s!r}")
        self.time_limit_s = time_limit_s
        self.info: dict[str, Any] = {}

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        self.info = {}

    def migrate(self, view: RebalanceView) -> np.ndarray:
        from lpserve.opt.rebalance import build_rebalance, solve_rebalance

        if view.n_replicas < 2:
            return _NONE.copy()
        model = build_rebalance(view, default_remaining_tokens=self.default_remaining_tokens,
                                cost_weight=self.cost_weight)
        keep = self._candidates(model)
        if keep.size == 0:
            return _NONE.copy()
        sub = _restrict(model, keep)
        sol = solve_rebalance(sub, time_limit_s=self.time_limit_s)
        self.info = {"status": str(sol.status), "objective": sol.objective,
                     "wall_s": sol.wall_s, "candidates": int(keep.size)}
        if not sol.solved or not sol.objective > self.min_gain_s:
            return _NONE.copy()
        dest = sol.primal["destination"]
        rows = [(int(view.request[keep[r]]), int(d)) for r, d in enumerate(dest.tolist())
                if d >= 0]
        return np.array(rows, np.int64).reshape(-1, 2)

    def _candidates(self, model: Any) -> np.ndarray:
        """Candidates that can matter: on a replica with blocked waiting requests or with
        more decoding requests than the least loaded replica plus one; about
        ``max_candidates`` of them (an equal share per replica)."""
        n, R = model.n_candidates, model.n_replicas
        if n == 0:
            return np.zeros(0, np.int64)
        blocked = np.array([model.deficit_blocks[s].size > 0 for s in range(R)])
        heavy = model.running > model.running.min() + 1
        idx = np.flatnonzero((blocked | heavy)[model.source])
        if idx.size > self.max_candidates:
            # per replica an equal share: half its smallest requests (cheap copies that
            # rebalance counts), half its largest (few copies that free many blocks)
            share = max(self.max_candidates // R, 2)
            keep = []
            for s in range(R):
                mine = idx[model.source[idx] == s]
                mine = mine[np.lexsort((mine, model.blocks[mine]))]
                keep.extend(mine[:share // 2].tolist() + mine[share // 2:][-(share - share // 2):]
                            .tolist() if mine.size > share else mine.tolist())
            idx = np.unique(np.array(keep, np.int64))
        return idx.astype(np.int64)


def _restrict(model: Any, keep: np.ndarray) -> Any:
    from lpserve.opt.rebalance import RebalanceModel

    return RebalanceModel(model.source[keep], model.blocks[keep], model.cost_s[keep],
                          model.running, model.phi_s, model.capacity_blocks, model.seats,
                          model.deficit_blocks, model.wait_s)


_KINDS = {"none": NoMigration, "llumnix": LlumnixFreeness, "lp": AssignmentRebalancer}
_KNOBS = {"period_s", "threshold_blocks", "source_below_blocks", "max_moves", "cost_weight",
          "min_gain_s", "default_remaining_tokens", "max_candidates", "time_limit_s"}


def rebalanced(kind: str):
    """Factory of the ``vllm`` engine behind round robin with the ``kind`` rebalancer."""
    if kind not in _KINDS:
        raise KeyError(f"unknown rebalancer {kind!r}; known: {', '.join(_KINDS)}")

    def factory(**params: Any) -> Policy:
        from lpserve.policies.baselines import engine_policy

        knobs = {k: params.pop(k) for k in list(params) if k in _KNOBS}
        params.setdefault("name", f"rebalance-{kind}")
        pol = engine_policy("vllm", **params)
        return pol.with_(rebalancer=_KINDS[kind](**knobs), meta=None)

    factory.__name__ = f"rebalance_{kind}"
    return factory
