"""Which decoding requests to migrate where: the rebalancing assignment MILP.

At one decision time, binary ``x[r, d]`` moves running request ``r`` from its replica to
replica ``d``; binary ``y[s, k]`` says the ``k``-th waiting request of replica ``s`` (in
queue order) fits once the blocks of the requests moved out of ``s`` are freed. The
objective is the expected latency reduction (request-seconds) minus the migration cost;
the equations are ``models/rebalancing.md`` (1)–(15), cited below. :func:`solve_rebalance`
solves it with HiGHS; :func:`brute_force_rebalance` enumerates small instances (the two
agree: ``proofs/rebalance-milp.md``).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from lpserve.opt.solution import Solution, Status, highs_model, highs_status
from lpserve.policies.rebalancers import NO_MOVES, check_period
from lpserve.policy import Rebalancer, RebalanceView

__all__ = ["AssignmentRebalancer", "RebalanceModel", "build_rebalance", "solve_rebalance",
           "brute_force_rebalance", "rebalance_objective"]


@dataclass(frozen=True, eq=False)
class RebalanceModel:
    """Data of ``models/rebalancing.md`` (1)–(15) for ``n`` candidates, ``R`` replicas.

    Attributes:
        source: int64 (n,) replica of each candidate (``s_r``).
        blocks: int64 (n,) KV blocks each candidate holds (``b_r``).
        cost_s: float64 (n,) migration cost of each candidate (``kappa_r``, (5)), in
            request-seconds.
        running: int64 (R,) decoding requests on each replica now (``n_d``).
        phi_s: float64 (N + 1,) convex decode cost ``Phi(0..N)`` of a replica running
            ``0..N`` requests (3), request-seconds; ``N >= running.sum()``.
        capacity_blocks: int64 (R,) blocks a replica may take in (``C_d``, (8)).
        seats: int64 (R,) requests a replica may take in (``Q_d``, (12)).
        deficit_blocks: per replica, int64 (K_s,) blocks that must be freed to admit its
            first ``k`` blocked waiting requests (``D_sk``, (6)), nondecreasing, > 0.
        wait_s: per replica, float64 (K_s,) wait saved by admitting the ``k``-th blocked
            request now (``w_sk``, (7)), >= 0.
    """

    source: np.ndarray
    blocks: np.ndarray
    cost_s: np.ndarray
    running: np.ndarray
    phi_s: np.ndarray
    capacity_blocks: np.ndarray
    seats: np.ndarray
    deficit_blocks: tuple[np.ndarray, ...]
    wait_s: tuple[np.ndarray, ...]

    @property
    def n_candidates(self) -> int:
        """Candidates ``n``."""
        return int(self.source.shape[0])

    @property
    def n_replicas(self) -> int:
        """Replicas ``R``."""
        return int(self.capacity_blocks.shape[0])

    def restrict(self, keep: np.ndarray) -> "RebalanceModel":
        """The same decision with only the candidates at positions ``keep``."""
        return RebalanceModel(self.source[keep], self.blocks[keep], self.cost_s[keep],
                              self.running, self.phi_s, self.capacity_blocks, self.seats,
                              self.deficit_blocks, self.wait_s)

    def __post_init__(self) -> None:
        n, R = self.n_candidates, self.n_replicas
        for k, shape in (("blocks", (n,)), ("cost_s", (n,)), ("running", (R,)),
                         ("seats", (R,))):
            v = getattr(self, k)
            if v.shape != shape or np.any(v < 0) or not np.all(np.isfinite(v)):
                raise ValueError(f"RebalanceModel.{k} must be {shape} finite non-negative "
                                 f"values, got {v!r}")
        if n and (self.source.min() < 0 or self.source.max() >= R):
            raise ValueError(f"RebalanceModel.source has a replica outside [0, {R}): "
                             f"{self.source!r}")
        if n and np.any(np.bincount(self.source, minlength=R) > self.running):
            raise ValueError("RebalanceModel.running must count at least the candidates of "
                             f"each replica, got {self.running!r}")
        N = int(self.running.sum())
        if self.phi_s.shape[0] < N + 1 or np.any(np.diff(self.phi_s, 2) < -1e-9):
            raise ValueError(f"RebalanceModel.phi_s must be convex with >= {N + 1} points "
                             f"(running.sum() + 1), got {self.phi_s!r}")
        if len(self.deficit_blocks) != R or len(self.wait_s) != R:
            raise ValueError(f"RebalanceModel.deficit_blocks and wait_s need {R} entries")
        for s in range(R):
            dk, wk = self.deficit_blocks[s], self.wait_s[s]
            if dk.shape != wk.shape or np.any(np.diff(dk) < 0) or np.any(dk <= 0) or \
                    np.any(wk < 0):
                raise ValueError(f"RebalanceModel: replica {s} needs positive nondecreasing "
                                 f"deficits and non-negative waits of one shape, got {dk!r}, "
                                 f"{wk!r}")


def build_rebalance(view: Any, *, default_remaining_tokens: float = 128.0,
                    cost_weight: float = 1.0) -> RebalanceModel:
    """The model of a :class:`~lpserve.policy.RebalanceView` (``models/rebalancing.md``).

    Remaining output tokens ``rho_r`` (1): true ones for a clairvoyant view, else the
    predicted interval's midpoint minus the generated tokens, else
    ``default_remaining_tokens``; at least 1. ``cost_weight`` (``lambda``) scales the
    migration cost (5).
    """
    if not default_remaining_tokens >= 1:
        raise ValueError(f"default_remaining_tokens must be >= 1, got "
                         f"{default_remaining_tokens!r}")
    if not cost_weight >= 0:
        raise ValueError(f"cost_weight must be >= 0, got {cost_weight!r}")
    R, n = view.n_replicas, len(view)
    src = np.asarray(view.replica, np.int64)
    ctx = np.asarray(view.context_tokens, np.int64)
    gen = np.asarray(view.generated_tokens, np.float64)
    if view.output_tokens is not None:
        rho = view.output_tokens - gen
    elif view.predicted_lo is not None:
        rho = 0.5 * (view.predicted_lo + view.predicted_hi) - gen
    else:
        rho = np.full(n, float(default_remaining_tokens))
    rho = np.maximum(rho, 1.0)                                                # (1)
    running = np.bincount(src, minlength=R).astype(np.int64)
    N = int(running.sum())
    c_bar = int(round(float(ctx.mean()))) if n else 0
    tau = np.array([view.decode_iteration_s(np.full(k, c_bar, np.int64))     # (2)
                    for k in range(N + 1)])
    phi = np.arange(N + 1) * (float(rho.mean()) if n else 0.0) * tau         # (3)
    if N >= 1:  # the convex majorant through Phi(0): increments made nondecreasing
        phi = np.concatenate([[phi[0]], phi[0] + np.cumsum(np.maximum.accumulate(
            np.diff(phi)))])
    blocks = np.asarray(view.blocks, np.int64)
    free = np.asarray(view.free_blocks, np.int64)
    deficits, waits = [], []
    for s in range(R):
        need = np.asarray(view.waiting_blocks[s], np.int64)
        dk = np.maximum(np.cumsum(need) - free[s], 0)                         # (6)
        dk = dk[dk > 0]
        # (7): the natural wait of the k-th blocked request, until completions on s
        # (each after rho_r iterations of tau(n_s)) free D_sk blocks
        mine = np.flatnonzero(src == s)
        order = mine[np.argsort(rho[mine], kind="stable")]
        t_done = rho[order] * tau[running[s]]
        freed = np.cumsum(blocks[order])
        pos = np.searchsorted(freed, dk, side="left")
        # never freed by the running requests alone: the last completion (a lower estimate)
        wk = t_done[np.minimum(pos, t_done.size - 1)] if t_done.size else np.zeros(dk.size)
        deficits.append(dk.astype(np.int64))
        waits.append(np.asarray(wk, np.float64).reshape(dk.shape))
    blocked = np.array([d.size for d in deficits], np.float64)
    cost = cost_weight * np.asarray(view.migration_s, np.float64) * (1.0 + blocked[src])  # (5)
    wait_total = np.array([int(np.sum(w)) for w in view.waiting_blocks], np.int64)
    cap = np.maximum(free - wait_total, 0)                                    # (8)
    seats = np.maximum(np.asarray(view.seats, np.int64), 0)
    return RebalanceModel(src, blocks, cost, running, phi, cap.astype(np.int64), seats,
                          tuple(deficits), tuple(waits))


def rebalance_objective(model: RebalanceModel, destination: np.ndarray) -> float:
    """Objective (9) of ``destination`` (int64 (n,), -1 = stay) with the best ``y`` and
    ``z_d = Phi(n'_d)`` for it, or ``-inf`` when it violates (10)–(12)."""
    dest = np.asarray(destination, np.int64)
    R = model.n_replicas
    moved = dest >= 0
    if np.any(dest[moved] == model.source[moved]) or np.any(dest >= R):
        return -math.inf
    inb = np.bincount(dest[moved], weights=model.blocks[moved], minlength=R)
    cnt = np.bincount(dest[moved], minlength=R)
    if np.any(inb > model.capacity_blocks) or np.any(cnt > model.seats):
        return -math.inf
    after = model.running + cnt - np.bincount(model.source[moved], minlength=R)     # (4)
    val = float(model.phi_s[model.running].sum() - model.phi_s[after].sum())
    val -= float(model.cost_s[moved].sum())
    out = np.bincount(model.source[moved], weights=model.blocks[moved], minlength=R)
    for s in range(R):  # the best y: every blocked request whose deficit is covered (13)
        k = int(np.searchsorted(model.deficit_blocks[s], out[s], side="right"))
        val += float(model.wait_s[s][:k].sum())
    return val


def brute_force_rebalance(model: RebalanceModel) -> tuple[float, np.ndarray]:
    """Optimum of (9)–(15) by enumerating every destination vector (``R^n`` of them;
    small instances only). Returns (objective, destination with -1 = stay)."""
    n, R = model.n_candidates, model.n_replicas
    if R ** n > 2_000_000:
        raise ValueError(f"brute force over {R}^{n} assignments is too large (n={n}, R={R})")
    best, arg = 0.0, np.full(n, -1, np.int64)
    choices = [[-1] + [d for d in range(R) if d != int(model.source[r])] for r in range(n)]
    for combo in itertools.product(*choices):
        v = rebalance_objective(model, np.array(combo, np.int64))
        if v > best + 1e-12:
            best, arg = v, np.array(combo, np.int64)
    return best, arg


def solve_rebalance(model: RebalanceModel, time_limit_s: float | None = None) -> Solution:
    """Solve (9)–(15) with HiGHS as a MILP (maximization: ``bound`` is an upper bound).
    ``primal["destination"]`` (int64 (n,), -1 = stay), ``primal["x"]``, ``primal["y"]``;
    the objective is in request-seconds."""
    t0 = time.perf_counter()
    n, R = model.n_candidates, model.n_replicas
    pairs = [(r, d) for r in range(n) for d in range(R) if d != int(model.source[r])]
    ys = [(s, k) for s in range(R) for k in range(model.deficit_blocks[s].size)]
    if not pairs:
        return Solution("rebalance", Status.OPTIMAL, 0.0, 0.0, time.perf_counter() - t0,
                        primal={"destination": np.full(n, -1, np.int64)},
                        objective_units="request-s")
    nx, ny = len(pairs), len(ys)
    # columns: x (nx), y (ny), z (R); minimize sum kappa x - sum w y + sum z - sum Phi(n_d)
    cost = np.concatenate([[model.cost_s[r] for r, _ in pairs],
                           [-model.wait_s[s][k] for s, k in ys], np.ones(R)])
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(entries: list[tuple[int, float]], lower: float, upper: float) -> None:
        r = len(lo)
        for c, v in entries:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lower)
        hi.append(upper)

    for r in range(n):                                                        # (10)
        add([(c, 1.0) for c, (r2, _) in enumerate(pairs) if r2 == r], -np.inf, 1.0)
    for d in range(R):                                                        # (11), (12)
        into = [c for c, (_, d2) in enumerate(pairs) if d2 == d]
        add([(c, float(model.blocks[pairs[c][0]])) for c in into], -np.inf,
            float(model.capacity_blocks[d]))
        add([(c, 1.0) for c in into], -np.inf, float(model.seats[d]))
    for j, (s, k) in enumerate(ys):                                           # (13)
        out = [(c, -float(model.blocks[r])) for c, (r, _) in enumerate(pairs)
               if int(model.source[r]) == s]
        add([(nx + j, float(model.deficit_blocks[s][k]))] + out, -np.inf, 0.0)
        if k > 0:                                                             # (14)
            add([(nx + j, 1.0), (nx + j - 1, -1.0)], -np.inf, 0.0)
    phi, N = model.phi_s, int(model.running.sum())
    for d in range(R):                                                        # (15)
        # n'_d = n_d + inflow - outflow (4); z_d >= Phi(k) + (Phi(k+1) - Phi(k)) (n'_d - k)
        flow = [(c, 1.0 if dd == d else 0.0) for c, (r, dd) in enumerate(pairs)]
        flow = [(c, v - (1.0 if int(model.source[pairs[c][0]]) == d else 0.0))
                for c, v in flow]
        flow = [(c, v) for c, v in flow if v != 0.0]
        for k in range(N):
            slope = float(phi[k + 1] - phi[k])
            rhs = float(phi[k]) + slope * (int(model.running[d]) - k)
            add([(nx + ny + d, 1.0)] + [(c, -slope * v) for c, v in flow], rhs, np.inf)
    ncol = nx + ny + R
    rows_a, cols_a, vals_a = np.array(rows), np.array(cols), np.array(vals)
    order = np.lexsort((rows_a, cols_a))
    start = np.searchsorted(cols_a[order], np.arange(ncol + 1))
    integer = np.r_[np.ones(nx + ny, bool), np.zeros(R, bool)]
    h = highs_model(col_cost=cost, col_lower=np.r_[np.zeros(nx + ny), np.full(R, -np.inf)],
                    col_upper=np.r_[np.ones(nx + ny), np.full(R, np.inf)],
                    row_lower=np.array(lo), row_upper=np.array(hi), a_start=start,
                    a_index=rows_a[order], a_value=vals_a[order], integer=integer,
                    time_limit_s=time_limit_s,
                    options={"mip_rel_gap": 0.0, "mip_abs_gap": 1e-9})
    h.run()
    status, obj, bound, text = highs_status(h, has_integers=True)
    base = float(phi[model.running].sum())
    primal: dict[str, np.ndarray] = {}
    if status in (Status.OPTIMAL, Status.FEASIBLE):
        v = np.asarray(h.getSolution().col_value)
        dest = np.full(n, -1, np.int64)
        for c, (r, d) in enumerate(pairs):
            if v[c] > 0.5:
                dest[r] = d
        primal = {"destination": dest, "x": np.round(v[:nx]), "y": np.round(v[nx:nx + ny])}
        # the objective of the decision returned, evaluated exactly (9): the solver's own
        # value carries its feasibility tolerances on the epigraph variables (~1e-6)
        exact = rebalance_objective(model, dest)
        if math.isfinite(exact):
            obj = base - exact
    return Solution("rebalance", status, base - obj if math.isfinite(obj) else obj,
                    base - bound if math.isfinite(bound) else bound, time.perf_counter() - t0,
                    primal=primal, message=text, objective_units="request-s",
                    info={"n_candidates": n, "n_replicas": R, "solver": "highs"})


# ===================================================================================== the policy
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
        self.period_s = check_period(period_s)
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
        """Clear :attr:`info` (the last decision's solver status, objective and time)."""
        self.info = {}

    def migrate(self, view: RebalanceView) -> np.ndarray:
        """``(request, destination)`` rows, int64 ``(n_moves, 2)``, of the MILP of
        ``models/rebalancing.md`` over about ``max_candidates`` candidates (those on replicas
        with blocked waiting requests or more than one decoding request above the least loaded);
        no moves with fewer than two replicas, when the solve fails, or when its gain (s) is not
        above ``min_gain_s``. Records the solve in :attr:`info`."""
        if view.n_replicas < 2:
            return NO_MOVES.copy()
        model = build_rebalance(view, default_remaining_tokens=self.default_remaining_tokens,
                                cost_weight=self.cost_weight)
        keep = self._candidates(model)
        if keep.size == 0:
            return NO_MOVES.copy()
        sub = model.restrict(keep)
        sol = solve_rebalance(sub, time_limit_s=self.time_limit_s)
        self.info = {"status": str(sol.status), "objective": sol.objective,
                     "wall_s": sol.wall_s, "candidates": int(keep.size)}
        if not sol.solved or not sol.objective > self.min_gain_s:
            return NO_MOVES.copy()
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
