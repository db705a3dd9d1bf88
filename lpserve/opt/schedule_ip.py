"""Hindsight-optimal scheduling IP of Jaillet et al. (arXiv 2502.07115) and its LP relaxation.

Time-indexed model (``models/schedule-ip.md``): binary ``x[i, k]`` = request ``i`` starts
in round ``k``; it then holds ``s_i + (r - k)`` KV tokens in rounds ``r = k+1 .. k+o_i`` and
completes in round ``k + o_i``. Minimize total latency sum_i (k_i + o_i - a_i) subject to
one start per request (2) and memory ``M`` in every round (3).

Start rounds are restricted to a window ``a_i .. a_i + W`` where ``W`` is the total wait of
the MC-SF schedule (``models/schedule-ip.md`` (6)): every optimal schedule lies inside, so
the IP stays exact. The LP relaxation (``schedule-lp``, ``models/lower-bounds.md`` (1))
may cap the window to bound its size; starts beyond the cap are then represented by one
"late" column per request that costs the least latency a late start can have and uses no
memory, which keeps it a relaxation.

Public: :func:`build`, :func:`build_problem`, :func:`solve`, :func:`certify`,
:func:`export`, and the formulation objects :data:`SCHEDULE_IP`, :data:`SCHEDULE_LP`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lpserve.opt.budget import Deadline, TimeLimitReached, as_deadline, run_highs
from lpserve.opt.exact import KVProblem, total_latency
from lpserve.opt.solution import Formulation, Solution, Status, highs_status
from lpserve.policy import Meta, Scheduler


@dataclass(frozen=True, eq=False)
class ScheduleModel:
    """A built time-indexed model (arrays describe the HiGHS columns and rows).

    Attributes:
        problem: the :class:`KVProblem`.
        relax: LP relaxation (True) or IP (False).
        window_rounds: W_i, last allowed start is ``a_i + W_i``, shape (n,).
        overflow: True when the LP has a "late" column per request.
        col_request: request of each column, int64 (n_col,).
        col_start: start round of each column (-1 for a late column), int64 (n_col,).
        col_cost: latency (rounds) of each column, float64 (n_col,).
        a_start, a_index, a_value: the CSC constraint matrix.
        row_round: round of each memory row (rows ``n ..``), int64 (n_mem_rows,).
        sym_pairs: (i, j) pairs of identical requests ordered ``k_i <= k_j`` (IP only).
        too_large: columns the IP would need when above ``max_columns`` (0 if built).
        incumbent: MC-SF start rounds (None if infeasible).
        digest: instance digest ("" for raw arrays).
        build_s: seconds spent building.
        area_bound: the closed-form area bound (``models/lower-bounds.md`` (4)), always
            known, the bound of last resort at a time limit (NaN when infeasible).
    """

    problem: KVProblem
    relax: bool
    window_rounds: np.ndarray
    overflow: bool
    col_request: np.ndarray
    col_start: np.ndarray
    col_cost: np.ndarray
    a_start: np.ndarray
    a_index: np.ndarray
    a_value: np.ndarray
    row_round: np.ndarray
    sym_pairs: np.ndarray
    incumbent: np.ndarray | None
    digest: str = ""
    build_s: float = 0.0
    name: str = "schedule-ip"
    infeasible: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    too_large: int = 0
    area_bound: float = math.nan


def build(instance: Any, *, memory_tokens: int | None = None, round_s: float = 1.0,
          relax: bool = False, max_columns: int | None = None,
          deadline: Deadline | None = None) -> ScheduleModel:
    """Build the IP (or, with ``relax``, its LP relaxation) for an :class:`~lpserve.Instance`.

    Args:
        instance: trace + cost; ``memory_tokens`` defaults to its ``UnitRoundCost``.
        memory_tokens: M, KV capacity in tokens.
        round_s: seconds per round (arrivals are rounded up to a round boundary).
        relax: build the LP relaxation.
        max_columns: LP: cap the window so that about ``max_columns`` start columns are
            built (late columns keep it a relaxation); ``None``: full window. IP: the
            largest model built (default 2,000,000 columns); a larger IP is not built and
            ``solve`` returns ``FEASIBLE`` with the greedy incumbent and the area bound.
        deadline: a :class:`~lpserve.opt.budget.Deadline` (``lp.solve`` passes the one of
            its ``time_limit_s``); past it the build raises
            :class:`~lpserve.opt.budget.TimeLimitReached` with ``partial`` holding the
            incumbent found so far (or None) and the area bound.
    """
    problem = KVProblem.from_instance(instance, memory_tokens=memory_tokens, round_s=round_s)
    return build_problem(problem, relax=relax, max_columns=max_columns,
                         digest=instance.digest(), deadline=deadline)


def build_problem(problem: KVProblem, *, relax: bool = False, max_columns: int | None = None,
                  digest: str = "", deadline: Deadline | None = None) -> ScheduleModel:
    """Build from a :class:`KVProblem` directly (see :func:`build`)."""
    deadline = deadline if deadline is not None else Deadline()
    area = math.nan if problem.oversized().size or problem.n == 0 else _area(problem)
    try:
        return _build(problem, relax, max_columns, digest, deadline, area)
    except TimeLimitReached as exc:
        exc.partial.setdefault("incumbent", None)
        exc.partial["area_bound"] = area
        raise


def _area(problem: KVProblem) -> float:
    from lpserve.opt.lower_bounds import area_bound

    return float(area_bound(problem))


def _build(problem: KVProblem, relax: bool, max_columns: int | None, digest: str,
           deadline: Deadline, area: float) -> ScheduleModel:
    from lpserve.opt.lower_bounds import area_bound
    from lpserve.opt.mcsf_ref import best_memory_safe_schedule

    t0 = time.perf_counter()
    name = "schedule-lp" if relax else "schedule-ip"
    n = problem.n
    empty_i = np.zeros(0, np.int64)
    bad = problem.oversized()
    if bad.size or n == 0:
        return ScheduleModel(problem, relax, empty_i, False, empty_i, empty_i,
                             np.zeros(0), np.zeros(1, np.int64), empty_i, np.zeros(0),
                             empty_i, np.zeros((0, 2), np.int64), None, digest,
                             time.perf_counter() - t0, name, bad)
    a, s, o = problem.arrival_round, problem.prompt_tokens, problem.output_tokens
    M = problem.memory_tokens
    incumbent = best_memory_safe_schedule(problem, deadline=deadline)
    found = {"incumbent": incumbent}
    ub = int(total_latency(problem, incumbent))
    w_total = ub - int(o.sum())                                      # (6)
    window = np.full(n, w_total, dtype=np.int64)
    if not relax and n <= 200:
        # (6'): lat_i <= UB - (bound on the others' total latency)
        for i in range(n):
            deadline.check("sizing the start windows", found)
            keep = np.arange(n) != i
            others = KVProblem.from_arrays(a[keep], s[keep], o[keep], M)
            window[i] = max(0, min(w_total, ub - int(o[i]) - int(area_bound(others))))
    if not relax and int((window + 1).sum()) > (max_columns or 2_000_000):
        return ScheduleModel(problem, relax, window, False, empty_i, empty_i, np.zeros(0),
                             np.zeros(1, np.int64), empty_i, np.zeros(0), empty_i,
                             np.zeros((0, 2), np.int64), incumbent, digest,
                             time.perf_counter() - t0, name, empty_i,
                             too_large=int((window + 1).sum()), area_bound=area)
    overflow = False
    if relax and max_columns is not None:
        cap = max(0, int(max_columns) // n - 1)
        if cap < w_total:
            window[:] = cap
            overflow = True
    # memory rows: rounds 1 .. max(a + W + o); drop rows whose largest possible load <= M
    T = int((a + window + o).max())
    maxload = np.zeros(T + 2, dtype=np.int64)
    for i in range(n):
        deadline.check("finding the memory rows", found)
        r = np.arange(a[i] + 1, a[i] + window[i] + o[i] + 1)
        k_min = np.maximum(a[i], r - o[i])                 # earliest start active at r
        maxload[r] += s[i] + r - k_min
    row_round = np.flatnonzero(maxload > M).astype(np.int64)
    round_to_row = np.full(T + 2, -1, dtype=np.int64)
    round_to_row[row_round] = n + np.arange(row_round.size)
    starts, idx, val, creq, cstart, ccost = [], [], [], [], [], []
    for i in range(n):
        deadline.check("building the start columns", found)
        K = np.arange(a[i], a[i] + window[i] + 1, dtype=np.int64)
        rr = K[:, None] + 1 + np.arange(o[i])[None, :]
        rows = round_to_row[rr]
        coef = np.broadcast_to(s[i] + 1 + np.arange(o[i]), rr.shape)
        keep = rows >= 0
        cnt = 1 + keep.sum(axis=1)
        # column entries: assignment row i, then its kept memory rows
        col_rows = np.full((K.size, o[i] + 1), -1, dtype=np.int64)
        col_vals = np.zeros((K.size, o[i] + 1))
        col_rows[:, 0] = i
        col_vals[:, 0] = 1.0
        col_rows[:, 1:] = rows
        col_vals[:, 1:] = coef
        m = np.concatenate([np.ones((K.size, 1), bool), keep], axis=1)
        idx.append(col_rows[m])
        val.append(col_vals[m])
        starts.append(cnt)
        creq.append(np.full(K.size, i, np.int64))
        cstart.append(K)
        ccost.append((K + o[i] - a[i]).astype(np.float64))                 # (1)
        if overflow:
            idx.append(np.array([i], np.int64))
            val.append(np.array([1.0]))
            starts.append(np.array([1]))
            creq.append(np.array([i], np.int64))
            cstart.append(np.array([-1], np.int64))
            ccost.append(np.array([float(window[i] + 1 + o[i])]))             # (8)
    counts = np.concatenate(starts)
    a_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    sym = []
    if not relax:
        key = {}
        for i in np.lexsort((o, s, a)):
            kk = (int(a[i]), int(s[i]), int(o[i]))
            if kk in key:
                sym.append((key[kk], int(i)))
            key[kk] = int(i)
    return ScheduleModel(
        problem=problem, relax=relax, window_rounds=window, overflow=overflow,
        col_request=np.concatenate(creq), col_start=np.concatenate(cstart),
        col_cost=np.concatenate(ccost), a_start=a_start, a_index=np.concatenate(idx),
        a_value=np.concatenate(val), row_round=row_round,
        sym_pairs=np.asarray(sym, dtype=np.int64).reshape(-1, 2), incumbent=incumbent,
        digest=digest, build_s=time.perf_counter() - t0, name=name, area_bound=area)


def _infeasible_solution(model: ScheduleModel) -> Solution:
    p = model.problem
    i = int(model.infeasible[0])
    msg = (f"request {i} (arrival_round={int(p.arrival_round[i])}, prompt_tokens="
           f"{int(p.prompt_tokens[i])}, output_tokens={int(p.output_tokens[i])}) needs "
           f"{int(p.peak_tokens()[i])} tokens > memory_tokens {p.memory_tokens}")
    if model.infeasible.size > 1:
        msg += f" (and {model.infeasible.size - 1} more: {model.infeasible[1:6].tolist()})"
    return Solution(model.name, Status.INFEASIBLE, wall_s=model.build_s, digest=model.digest,
                    message=msg, objective_units="rounds",
                    primal={"infeasible_requests": model.infeasible.copy()})


def solve(model: ScheduleModel, solver: str = "highs", time_limit_s: float | None = None,
          seed: int = 0, deadline: Deadline | None = None) -> Solution:
    """Solve with HiGHS. IP: ``OPTIMAL`` with start rounds, or ``FEASIBLE`` (incumbent +
    bound) at the time limit. LP: ``OPTIMAL`` with the bound and the duals of the memory
    rows (``dual["memory"]``, >= 0, per round in ``primal["row_round"]``), or ``LIMIT``
    at the time limit.

    ``time_limit_s`` bounds this call; ``deadline`` (from ``lp.solve``, covering the
    build too) wins over it. At the limit the IP keeps the greedy incumbent unless HiGHS
    found better, and the bound is the larger of HiGHS's MIP bound and the area bound;
    the LP reports the area bound (a bound on the same optimum).
    """
    if solver != "highs":
        raise ValueError(f"solver must be 'highs', got {solver!r}")
    deadline = as_deadline(deadline, time_limit_s)
    if model.infeasible.size:
        return _infeasible_solution(model)
    p = model.problem
    if model.too_large:
        return at_limit(model.name, model.incumbent, p, model.area_bound, model.build_s,
                        model.digest, f"IP not built: it needs {model.too_large} columns > "
                        "max_columns; incumbent = best greedy schedule, bound = area bound "
                        "(use schedule-lp for a tighter bound)",
                        info={"n_columns": model.too_large}, status=Status.FEASIBLE)
    if p.n == 0:
        return Solution(model.name, Status.OPTIMAL, 0.0, 0.0, model.build_s, model.digest,
                        primal={"start_round": np.zeros(0, np.int64)}, objective_units="rounds")
    t0 = time.perf_counter()
    n, n_mem, n_col = p.n, model.row_round.size, model.col_cost.size
    info = {"n_columns": int(n_col), "n_memory_rows": int(n_mem),
            "window_rounds": int(model.window_rounds.max()), "overflow": model.overflow}
    if deadline.expired():
        return at_limit(model.name, model.incumbent if not model.relax else None, p,
                        model.area_bound, model.build_s + time.perf_counter() - t0,
                        model.digest, "time limit reached before the solver started",
                        info=info)
    highs = dict(col_cost=model.col_cost, col_lower=np.zeros(n_col), col_upper=np.ones(n_col),
                 integer=not model.relax, **_rows(model))
    # integer objective: a gap below one round proves optimality; HiGHS presolve costs
    # more than it saves on these time-indexed rows (measured 2-3x slower)
    opts = {} if model.relax else {"mip_abs_gap": 1.0 - 1e-6, "mip_rel_gap": 0.0,
                                   "presolve": "off"}
    start = None
    if not model.relax and model.incumbent is not None:
        start = (model.col_start == model.incumbent[model.col_request]).astype(np.float64)
    run = run_highs(highs, deadline=deadline, start=start, seed=seed, options=opts)
    status, obj, bound, text = highs_status(run, has_integers=not model.relax)
    wall = model.build_s + time.perf_counter() - t0
    info["solver_status"] = text
    if not model.relax:
        info["mip_nodes"] = run.mip_nodes
    if status not in (Status.OPTIMAL, Status.FEASIBLE):
        if status == Status.LIMIT:
            mip = math.ceil(bound - 1e-6) if math.isfinite(bound) else math.nan
            return at_limit(model.name, None if model.relax else model.incumbent, p,
                            _best(model.area_bound, mip), wall, model.digest, text,
                            info=info)
        return Solution(model.name, status, obj, bound, wall, model.digest,
                        {"row_round": model.row_round.copy()}, message=text,
                        objective_units="rounds", info=info)
    primal: dict[str, np.ndarray] = {"row_round": model.row_round.copy()}
    dual: dict[str, np.ndarray] = {}
    x = run.col_value[:n_col]
    if model.relax:
        on = model.col_start >= 0
        primal["x"] = x
        primal["mean_start_round"] = np.bincount(
            model.col_request[on], weights=x[on] * model.col_start[on], minlength=n)
        primal["late_mass"] = np.bincount(model.col_request[~on], weights=x[~on],
                                          minlength=n)
        rd = run.row_dual
        dual["assign"] = rd[:n].copy()
        dual["memory"] = -rd[n:n + n_mem]           # price of one token in each round
    else:
        k = np.full(n, -1, np.int64)
        chosen = np.flatnonzero(x > 0.5)
        k[model.col_request[chosen]] = model.col_start[chosen]
        primal["start_round"] = k
        primal["completion_round"] = k + p.output_tokens
        obj = float(total_latency(p, k))
        if math.isfinite(bound):
            bound = float(math.ceil(bound - 1e-6))     # integer objective
        if status == Status.OPTIMAL:
            bound = obj
        else:  # the area bound may be the better one early in the search
            bound = _best(bound, model.area_bound)
    return Solution(model.name, status, obj, bound, wall, model.digest, primal, dual,
                    message=text, objective_units="rounds", info=info)


def _best(*bounds: float) -> float:
    """The largest finite lower bound of ``bounds`` (NaN when none is finite)."""
    ok = [float(b) for b in bounds if b is not None and math.isfinite(b)]
    return max(ok) if ok else math.nan


def at_limit(name: str, incumbent: np.ndarray | None, problem: KVProblem, bound: float,
             wall_s: float, digest: str, message: str, *, info: dict | None = None,
             status: Status | None = None) -> Solution:
    """The answer at a time limit: ``FEASIBLE`` with ``incumbent`` (start rounds, shape
    (n,)) when there is one, else ``LIMIT``; ``bound`` is the best bound known (rounds)."""
    info = dict(info or {})
    if incumbent is None:
        return Solution(name, status or Status.LIMIT, math.nan, float(bound), wall_s, digest,
                        message=message, objective_units="rounds", info=info)
    k = np.asarray(incumbent, np.int64)
    obj = float(total_latency(problem, k))
    return Solution(name, status or Status.FEASIBLE, obj, float(bound), wall_s, digest,
                    {"start_round": k.copy(), "completion_round": k + problem.output_tokens},
                    message=message, objective_units="rounds", info=info)


def limit_solution(name: str, instance: Any, options: dict[str, Any],
                   exc: TimeLimitReached, wall_s: float) -> Solution:
    """``lp.solve``'s answer when the budget ran out inside :func:`build`: the greedy
    incumbent found so far (schedule-ip only) and the area bound (computed here when the
    build had not got to it)."""
    part = exc.partial
    bound = part.get("area_bound", math.nan)
    p = KVProblem.from_instance(instance, memory_tokens=options.get("memory_tokens"),
                                round_s=options.get("round_s", 1.0))
    if "area_bound" not in part and not p.oversized().size and p.n:
        bound = _area(p)
    inc = None if name == "schedule-lp" else part.get("incumbent")
    return at_limit(name, inc, p, bound, wall_s, instance.digest(),
                    f"time limit reached while {exc.stage}; "
                    + ("incumbent = best greedy schedule so far, " if inc is not None else "")
                    + "bound = area bound")


def _rows(model: ScheduleModel) -> dict[str, np.ndarray]:
    """Row bounds and the CSC matrix of the HiGHS model: assignment rows (2), memory rows
    (3) and, for the IP, the symmetry rows (7) ``sum_k k x[i,k] - sum_k k x[j,k] <= 0``
    for identical ``i`` before ``j``, appended to each column after its own entries."""
    p = model.problem
    n, n_mem, n_col = p.n, model.row_round.size, model.col_cost.size
    row_lower = np.concatenate([np.ones(n), np.full(n_mem, -np.inf)])
    row_upper = np.concatenate([np.ones(n), np.full(n_mem, float(p.memory_tokens))])
    a_start, a_index, a_value = model.a_start, model.a_index, model.a_value
    m = len(model.sym_pairs)
    if m:
        # columns of request i are contiguous (built request by request)
        first = np.searchsorted(model.col_request, np.arange(n + 1))
        i, j = model.sym_pairs[:, 0], model.sym_pairs[:, 1]
        q = np.arange(m)
        ci = np.concatenate([np.arange(first[r], first[r + 1]) for r in i])
        cj = np.concatenate([np.arange(first[r], first[r + 1]) for r in j])
        qi = np.repeat(q, first[i + 1] - first[i])
        qj = np.repeat(q, first[j + 1] - first[j])
        e_col = np.concatenate([ci, cj])
        e_row = n + n_mem + np.concatenate([qi, qj])
        e_val = np.concatenate([model.col_start[ci], -model.col_start[cj]]).astype(np.float64)
        e_q = np.concatenate([qi, qj])
        order = np.lexsort((e_q, e_col))                # per column, in pair order
        e_col, e_row, e_val = e_col[order], e_row[order], e_val[order]
        own = np.repeat(np.arange(n_col), np.diff(a_start))
        col = np.concatenate([own, e_col])
        rows = np.concatenate([a_index, e_row])
        vals = np.concatenate([a_value, e_val])
        keep = np.argsort(col, kind="stable")           # own entries first, then pairs
        a_index, a_value = rows[keep], vals[keep]
        a_start = np.concatenate([[0], np.cumsum(np.bincount(col, minlength=n_col))])
        row_lower = np.concatenate([row_lower, np.full(m, -np.inf)])
        row_upper = np.concatenate([row_upper, np.zeros(m)])
    return dict(row_lower=row_lower, row_upper=row_upper, a_start=a_start,
                a_index=a_index, a_value=a_value)


def certify(model: ScheduleModel, solution: Solution) -> dict[str, float]:
    """Residuals of ``solution`` (all ~0 for a correct one): memory excess (tokens),
    starts before arrival, objective mismatch, bound above objective, and the MIP gap
    for an OPTIMAL status (< 1 round, the objective being an integer)."""
    p = model.problem
    out = {"memory_excess_tokens": 0.0, "early_starts": 0.0, "objective_residual": 0.0,
           "bound_above_objective": 0.0, "optimality_gap": 0.0}
    if not solution.solved:
        return out
    if math.isfinite(solution.bound) and math.isfinite(solution.objective):
        out["bound_above_objective"] = max(0.0, solution.bound - solution.objective)
    if model.relax:
        x = solution.primal["x"]
        on = model.col_start >= 0
        assign = np.bincount(model.col_request, weights=x, minlength=p.n)
        out["objective_residual"] = abs(float(model.col_cost @ x) - solution.objective)
        out["assignment_residual"] = float(np.abs(assign - 1).max())
        load = np.zeros(model.row_round.size)
        for c in np.flatnonzero(on & (x > 0)):
            lo, hi = model.a_start[c], model.a_start[c + 1]
            r = model.a_index[lo:hi]
            mem = r >= p.n
            np.add.at(load, r[mem] - p.n, model.a_value[lo:hi][mem] * x[c])
        out["memory_excess_tokens"] = float(max(0.0, (load - p.memory_tokens).max()
                                                if load.size else 0.0))
        return out
    k = solution.primal["start_round"]
    mem = np.asarray([0]) if k.size == 0 else _profile(p, k)
    out["memory_excess_tokens"] = float(max(0, int(mem.max()) - p.memory_tokens))
    out["early_starts"] = float(np.sum(k < p.arrival_round))
    out["objective_residual"] = abs(total_latency(p, k) - solution.objective)
    if solution.status == Status.OPTIMAL:
        out["optimality_gap"] = max(0.0, solution.objective - solution.bound)
    return out


def _profile(p: KVProblem, k: np.ndarray) -> np.ndarray:
    from lpserve.opt.exact import memory_profile

    return memory_profile(p, k)


class PlannedStartScheduler(Scheduler):
    """Offline scheduler that runs requests in the order of an optimal plan: rank =
    planned start round (requests outside the plan rank last)."""

    name = "schedule-ip-plan"
    meta = Meta(online=False, clairvoyant=False, stochastic=False,
                engines=("lpserve", "vidur", "vllm"))

    def __init__(self, start_round: np.ndarray) -> None:
        self.start_round = np.asarray(start_round, dtype=np.float64).copy()
        self.start_round.setflags(write=False)

    def rank(self, view: Any) -> np.ndarray:
        """Each candidate's planned start round (float64 ``(n,)``, earliest first);
        ``+inf`` for a request outside the plan, which the engine holds back."""
        req = np.asarray(view.request, dtype=np.int64)
        out = np.full(req.shape, np.inf)
        ok = (req >= 0) & (req < self.start_round.size)
        out[ok] = self.start_round[req[ok]]
        return out


def export(solution: Solution, instance: Any) -> PlannedStartScheduler:
    """The planned start order as a :class:`~lpserve.policy.Scheduler`; refuses an
    unsolved solution, an LP solution, or one solved for another instance."""
    solution.require_solved(instance.digest() if instance is not None else None)
    if "start_round" not in solution.primal:
        from lpserve.opt.solution import SolutionError

        raise SolutionError(f"{solution.formulation}: no integral start rounds to export")
    return PlannedStartScheduler(solution.primal["start_round"])


def build_lp(instance: Any, *, memory_tokens: int | None = None, round_s: float = 1.0,
             max_columns: int | None = 200_000,
             deadline: Deadline | None = None) -> ScheduleModel:
    """:func:`build` with ``relax=True`` (``max_columns`` defaults to 200,000)."""
    return build(instance, memory_tokens=memory_tokens, round_s=round_s, relax=True,
                 max_columns=max_columns, deadline=deadline)


SCHEDULE_IP = Formulation("schedule-ip", build, solve, certify, export, limit=limit_solution)
SCHEDULE_LP = Formulation("schedule-lp", build_lp, solve, certify, None, is_bound=True,
                          limit=limit_solution)
