"""Time-indexed LP relaxation of serving in the GPU cost model (``cost-lp``).

A lower bound on the total end-to-end latency of every schedule the simulator can run
without speculative decoding or dependencies (``proofs/cost-lp-bound.md``); the equations
are ``models/cost-lp.md`` (1)-(19), cited below by number.

Time is cut into intervals of ``dt_s``; in each interval a request produces some of its
decode tokens at per-token time levels (faster costs more of a replica: (4)-(5)) and some of
its prompt tokens in chunk-size classes ((3)); every interval has three capacity rows over
the whole cluster (the two iteration-time minorants and the KV memory, (9)-(11)), every
request-interval a time row ((12)), and each request's completion is tied to its first token,
its iteration time and the mean time of its tokens ((13)-(16)). The bound reported is the
Lagrangian value of the solver's dual vector (weak duality), so it is valid at any solver
status, including a time limit.

``build_cost_lp(instance, ...) -> CostLPModel``; ``solve_cost_lp(model, time_limit_s=...)``
-> :class:`~lpserve.opt.solution.Solution` (``bound`` = ``objective`` = the certified bound
on total latency, s); ``certify_cost_lp``; no export (the LP's alpha points seed
:mod:`lpserve.opt.schedule_search`).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from lpserve.opt.cost_lp_build import (
    KIND_NAMES,
    CostLPModel,
    Floors,
    build_cost_lp,
    request_floors,
)
from lpserve.opt.solution import Formulation, Solution, SolutionError, Status

__all__ = ["CostLPModel", "Floors", "KIND_NAMES", "build_cost_lp", "solve_cost_lp",
           "certify_cost_lp", "COST_LP", "request_floors", "lagrangian_bound",
           "mass_capped_hi"]


# ====================================================================== solving
def mass_capped_hi(model: CostLPModel) -> np.ndarray:
    """Each column's upper bound, lowered to what its request's mass rows (18) allow: a
    token column holds at most the request's decode-phase (``mass``) or prompt (``pmass``)
    tokens. The LP is the same (the mass rows imply it); the certificate of
    :func:`lagrangian_bound` is tighter (``models/cost-lp.md`` §4). Shape (n_cols,)."""
    from scipy.sparse import csc_matrix

    A = csc_matrix((model.a_value, model.a_index, model.a_start),
                   shape=(model.row_lo.size, model.c.size)).tocoo()
    mass = np.isin(model.row_group, ("mass", "pmass"))
    take = mass[A.row]
    if np.any((A.data[take] <= 0) | (model.col_lo[A.col[take]] < 0)):
        raise ValueError("cost-lp: a mass row with a negative entry or column implies no bound")
    hi = model.col_hi.copy()
    np.minimum.at(hi, A.col[take], model.row_hi[A.row[take]] / A.data[take])
    return hi


def lagrangian_bound(model: CostLPModel, row_dual: np.ndarray,
                     col_hi: np.ndarray | None = None) -> float:
    """Weak-duality bound ``min_x c'x + y'(b - Ax)`` over the column box, for the row duals
    ``row_dual`` projected onto the signs the row bounds allow; valid for any vector (the
    columns' boxes are finite). ``col_hi``: upper bounds the LP's rows imply (default the
    model's own, ``mass_capped_hi`` is tighter). Returns the bound on the LP's objective
    plus ``const`` (s)."""
    from scipy.sparse import csc_matrix

    hi = model.col_hi if col_hi is None else col_hi
    y = np.asarray(row_dual, np.float64).copy()
    y[(y > 0) & ~np.isfinite(model.row_lo)] = 0.0
    y[(y < 0) & ~np.isfinite(model.row_hi)] = 0.0
    A = csc_matrix((model.a_value, model.a_index, model.a_start),
                   shape=(model.row_lo.size, model.c.size))
    d = model.c - A.T @ y
    if np.any(~np.isfinite(hi[d < 0])) or np.any(~np.isfinite(model.col_lo[d > 0])):
        return -math.inf
    rows = np.where(y > 0, y * np.where(np.isfinite(model.row_lo), model.row_lo, 0.0),
                    y * np.where(np.isfinite(model.row_hi), model.row_hi, 0.0))
    cols = np.where(d > 0, d * model.col_lo, d * np.where(np.isfinite(hi), hi, 0.0))
    return float(rows.sum() + cols.sum() + model.const)


def _run_highs(model: CostLPModel, time_limit_s: float | None, solver: str, *,
               max_add: int = 4000) -> tuple:
    """Column generation: solve the LP over ``model.start_cols``, price every other column
    with the row duals, add the most negative (at most ``max_add`` per round) and solve
    again, until none prices out or the time limit. Every round's duals give a certified
    bound on the *full* LP (:func:`lagrangian_bound`), so stopping early is safe.

    Returns ``(status, best certified bound, solver text, primal x over all columns,
    duals of the best round, rounds)``; status OPTIMAL only when no column prices out."""
    import highspy
    from scipy.sparse import csc_matrix

    from lpserve.opt.solution import highs_model, highs_status

    t0 = time.perf_counter()
    A = csc_matrix((model.a_value, model.a_index, model.a_start),
                   shape=(model.row_lo.size, model.c.size))
    active = model.start_cols.copy() if model.start_cols.size == model.c.size \
        else np.ones(model.c.size, bool)
    idx = np.flatnonzero(active)
    sub = A[:, idx]
    cap = mass_capped_hi(model)
    h = highs_model(col_cost=model.c[idx], col_lower=model.col_lo[idx],
                    col_upper=model.col_hi[idx], row_lower=model.row_lo,
                    row_upper=model.row_hi, a_start=sub.indptr, a_index=sub.indices,
                    a_value=sub.data, time_limit_s=time_limit_s,
                    options={"solver": solver} if solver not in ("highs", "choose") else None)
    best, best_y, x_full, text = -math.inf, None, None, ""
    status = Status.ERROR
    n_rounds = 0
    while True:
        if time_limit_s is not None:
            left = time_limit_s - (time.perf_counter() - t0)
            if left <= 0.05:
                status = Status.LIMIT
                break
            h.setOptionValue("time_limit", float(h.getRunTime() + left))
        h.run()
        n_rounds += 1
        st, obj, _, text = highs_status(h, has_integers=False)
        if st == Status.INFEASIBLE and not active.all():
            # the starting columns alone cannot meet some row: start again from all of them
            cand = np.flatnonzero(~active)
            active[:] = True
            add = A[:, cand]
            h.addCols(int(cand.size), model.c[cand], model.col_lo[cand], model.col_hi[cand],
                      int(add.nnz), add.indptr[:-1].astype(np.int32),
                      add.indices.astype(np.int32), add.data.astype(np.float64))
            idx = np.concatenate([idx, cand])
            continue
        sol = h.getSolution()
        if not sol.dual_valid:
            status = st if st != Status.OPTIMAL else Status.ERROR
            break
        y = np.asarray(sol.row_dual, np.float64)
        lb = lagrangian_bound(model, y, cap)
        if lb > best:
            best, best_y = lb, y
        if sol.value_valid:
            x_full = np.zeros(model.c.size)
            x_full[idx] = np.asarray(sol.col_value, np.float64)
        if st != Status.OPTIMAL:
            status = Status.LIMIT if st in (Status.LIMIT, Status.FEASIBLE) else st
            break
        d = model.c - A.T @ y
        # a column prices out when it could lower the bound by more than 1 us of latency
        # over its whole box (its reduced cost times its implied upper bound)
        cand = np.flatnonzero(~active & (d * cap < -1e-6))
        if cand.size == 0:
            status = Status.OPTIMAL
            break
        cand = cand[np.argsort(d[cand], kind="stable")[:max_add]]
        active[cand] = True
        add = A[:, cand]
        h.addCols(int(cand.size), model.c[cand], model.col_lo[cand], model.col_hi[cand],
                  int(add.nnz), add.indptr[:-1].astype(np.int32), add.indices.astype(np.int32),
                  add.data.astype(np.float64))
        idx = np.concatenate([idx, cand])
    del highspy
    return status, best, text, x_full, best_y, {"cg_rounds": n_rounds,
                                                 "active_cols": int(active.sum())}


def solve_cost_lp(model: CostLPModel, solver: str = "highs",
                  time_limit_s: float | None = None, *, window_rounds: int | None = None,
                  late_tol: float = 0.01) -> Solution:
    """Solve the LP; widen the windows of requests with late mass and solve again while
    time remains (``window_rounds`` at most; default the model's, 2 unless it was built
    with another). The bound is the largest certified Lagrangian value over the rounds
    (each round's LP is a relaxation).

    Status: OPTIMAL when the last round solved to optimality and left no late mass above
    ``late_tol`` of any request's tokens; FEASIBLE when it solved but a wider window might still raise the
    bound (``objective == bound`` in both); LIMIT when the time limit stopped a round
    (``bound`` is the best certified value, NaN if none; ``objective`` NaN); ERROR for an
    unsupported instance or a solver failure.
    """
    t0 = time.perf_counter()
    name = "cost-lp"
    if model.unsupported:
        return Solution(name, Status.ERROR, wall_s=model.build_s, digest=model.digest,
                        message=model.message, objective_units="s")
    best = -math.inf
    best_x = None
    cur = model
    rounds = []
    status = Status.ERROR
    text = ""
    if window_rounds is None:
        window_rounds = model.window_rounds
    for rnd in range(max(1, int(window_rounds))):
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - t0)
        if left is not None and left <= 0.05:
            status = Status.LIMIT
            break
        st, lb, text, x, _, cg = _run_highs(cur, left, solver)
        rounds.append({"round": rnd, "status": st.value, "certified_s": lb,
                       "n_cols": int(cur.c.size), **cg})
        if lb > best:
            best, best_x = lb, (x, cur)
        if st != Status.OPTIMAL:
            status = Status.LIMIT if st in (Status.LIMIT, Status.FEASIBLE) else Status.ERROR
            break
        n_req = int(cur.info.get("n_requests", 0))
        late = np.zeros(n_req)
        if x is not None:
            lk = np.flatnonzero((cur.col_kind == KIND_NAMES.index("late-decode"))
                                | (cur.col_kind == KIND_NAMES.index("late-prefill")))
            np.add.at(late, cur.col_req[lk], x[lk])
            tr = cur.instance.trace
            late /= np.maximum(np.asarray(tr.output_tokens, np.float64) - 1.0
                               + np.asarray(tr.prompt_tokens, np.float64), 1.0)
        wide = late > late_tol
        status = Status.OPTIMAL if not wide.any() else Status.FEASIBLE
        if not wide.any() or rnd + 1 >= window_rounds:
            break
        W = cur.window_s.copy()
        W[wide] *= 2.0
        cur = build_cost_lp(cur.instance, windows_s=W, **_window_free(cur.options))
        cur.options = model.options
    wall = model.build_s + time.perf_counter() - t0
    primal: dict[str, np.ndarray] = {}
    if best_x is not None and best_x[0] is not None:
        x, mdl = best_x
        comp = np.flatnonzero(mdl.col_kind == KIND_NAMES.index("completion"))
        first = np.flatnonzero(mdl.col_kind == KIND_NAMES.index("first-token"))
        lb_c = np.zeros(int(mdl.info["n_requests"]))
        lb_c[mdl.col_req[first]] = x[first]
        lb_c[mdl.col_req[comp]] = x[comp]
        primal = {"completion_lb_s": lb_c, "alpha_point_s": _alpha_points(mdl, x, 0.5),
                  "window_s": mdl.window_s.copy()}
    info = {**model.info, "rounds": rounds, "dt_s": model.dt_s, "solver_message": text}
    if not math.isfinite(best):
        st_out = Status.LIMIT if status == Status.LIMIT else Status.ERROR
        return Solution(name, st_out, wall_s=wall, digest=model.digest, objective_units="s",
                        message=f"no certified bound ({text})", info=info, primal=primal)
    # at a time limit the certified value is a bound but the LP is not solved: LIMIT with
    # the bound and no objective (lpserve.opt.solution.Status)
    obj = math.nan if status == Status.LIMIT else best
    return Solution(name, status, obj, best, wall, model.digest, primal=primal,
                    objective_units="s", message=text or "", info=info)


def _window_free(options: dict) -> dict:
    return {k: v for k, v in options.items() if k not in ("windows_s", "window_mult",
                                                          "window_intervals")}


def _alpha_points(model: CostLPModel, x: np.ndarray, alpha: float) -> np.ndarray:
    """Per request, the start of the interval in which the LP's decode (or, for one-token
    outputs, prompt) mass first reaches ``alpha`` of its total (s); the window's end when
    only late mass does."""
    n = int(model.info["n_requests"])
    dec = KIND_NAMES.index("decode")
    pre = KIND_NAMES.index("prefill")
    out = model.instance.trace.arrival_s + model.window_s
    for kind, late in ((pre, "late-prefill"), (dec, "late-decode")):
        j = np.flatnonzero((model.col_kind == kind) & (x > 0))
        if j.size == 0:
            continue
        order = np.lexsort((model.col_k[j], model.col_req[j]))
        j = j[order]
        req = model.col_req[j]
        tot = np.zeros(n)
        np.add.at(tot, req, x[j])
        lj = model.columns(late)
        np.add.at(tot, model.col_req[lj], x[lj])
        cum = np.zeros(j.size)
        run = 0.0
        prev = -1
        for q in range(j.size):
            run = x[j[q]] + (run if req[q] == prev else 0.0)
            prev = req[q]
            cum[q] = run
        hit = cum >= alpha * np.maximum(tot[req], 1e-12)
        for q in np.flatnonzero(hit)[::-1]:
            out[req[q]] = model.col_k[j[q]] * model.dt_s
    return np.asarray(out, np.float64)


def certify_cost_lp(model: CostLPModel, solution: Solution) -> dict[str, float]:
    """Residuals: the bound minus the LP objective of the round it came from (>= 0 means the
    certificate is not above the LP optimum), and how far the certified value is below it."""
    rounds = solution.info.get("rounds", [])
    if not solution.solved or not rounds:
        return {"certificate_above_lp": 0.0, "certificate_gap": 0.0}
    objs = [r["certified_s"] for r in rounds if math.isfinite(r["certified_s"])]
    top = max(objs) if objs else solution.bound
    return {"certificate_above_lp": max(0.0, solution.bound - top - 1e-6 * abs(top)),
            "certificate_gap": max(0.0, top - solution.bound)}


def _build(instance: Any, *, window_rounds: int = 2, **options: Any) -> CostLPModel:
    """``build_cost_lp``'s model; ``window_rounds`` (>= 1) is kept for the solve
    (``lp.solve("cost-lp", inst, window_rounds=1)``: one round, no widened windows)."""
    if isinstance(window_rounds, bool) or not isinstance(window_rounds, (int, np.integer)) \
            or window_rounds < 1:
        raise ValueError(f"cost-lp: window_rounds must be an integer >= 1, got "
                         f"{window_rounds!r}")
    model = build_cost_lp(instance, **options)
    model.options = dict(options)
    model.window_rounds = int(window_rounds)
    return model


def _no_export(solution: Solution, instance: Any) -> Any:
    raise SolutionError("cost-lp is a bound and exports no policy (its alpha points seed "
                        "schedule-search)")


COST_LP = Formulation("cost-lp", _build, solve_cost_lp, certify_cost_lp, _no_export,
                      is_bound=True)
