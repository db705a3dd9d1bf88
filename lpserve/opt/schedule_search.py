"""Offline schedules the simulator executes: an upper bound on the optimum (``schedule-search``)
and the exact optimum of the same schedule space on tiny instances (``schedule-exact``).

The schedule space (``models/schedule-search.md`` (1)): a router from :data:`ROUTERS`, an
engine from the candidate list (decode-first chunked prefill with a token budget near the
cost model's compute crossover, and the registered baselines' budget), and a **static
priority order** of the requests (:class:`~lpserve.policies.static_order.StaticOrder`),
everything else as the ``sarathi`` engine. Every candidate is simulated; the value of the
best is the total latency the simulator reports for it, so it is an upper bound on the
optimum over every schedule the simulator can run (``proofs/schedule-search-upper.md``).

``schedule-search``: seeds (arrival order = FCFS, shortest output first, least isolated
latency first, the cost-LP's alpha points, prompt length), every engine x router for the
best seeds, then a local search over the order (swap and insert moves aimed at the
requests slowed most), evaluated by the compiled replica loop. ``schedule-exact``: every
permutation of at most :data:`EXACT_MAX_REQUESTS` requests under every engine x router.
Both export the best schedule as a :class:`~lpserve.policy.Policy`.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lpserve.opt.solution import Formulation, Solution, SolutionError, Status

__all__ = ["SearchModel", "build_search", "solve_search", "solve_exact", "export_schedule",
           "candidate_engines", "schedule_policy", "SCHEDULE_SEARCH", "SCHEDULE_EXACT",
           "ROUTERS", "EXACT_MAX_REQUESTS"]

ROUTERS = ("least-outstanding", "round-robin")
EXACT_MAX_REQUESTS = 7
#: offsets of the candidate token budgets from the cost model's compute crossover n*
BUDGET_OFFSETS = (0, 8, 24, 56, 120)


def candidate_engines(instance: Any) -> list[dict[str, Any]]:
    """Engine keyword sets of the schedule space (``models/schedule-search.md`` (1)):
    decode-first chunked prefill with budgets ``n* + offset`` (n* the linear layers'
    memory/compute crossover of the cost model, at least 16 tokens) and ``sarathi``'s 512;
    prefix caching on only when the trace has block ids (without them it changes nothing
    and would leave the compiled loop)."""
    from lpserve.opt.cost_lp_terms import iteration_minorant

    try:
        n_star = iteration_minorant(instance.cost_model()).n_star
    except ValueError:
        n_star = 64.0
    base = 64 if not math.isfinite(n_star) else max(16, int(round(n_star)))
    budgets = sorted({base + d for d in BUDGET_OFFSETS} | {512})
    cache = bool(getattr(instance.trace, "has_blocks", False))
    return [{"max_num_batched_tokens": int(b), "prefix_caching": cache} for b in budgets]


def schedule_policy(keys: np.ndarray, engine: dict[str, Any], router: str,
                    name: str = "schedule-search") -> Any:
    """The :class:`~lpserve.policy.Policy` of one point of the schedule space."""
    from lpserve.policies.baselines import engine_policy
    from lpserve.policies.static_order import StaticOrder

    pol = engine_policy("sarathi", router=router, name=name, **engine)
    return pol.with_(scheduler=StaticOrder(keys, name=f"{name}-order"))


@dataclass(eq=False)
class SearchModel:
    """What the search needs: the instance, its engines and routers, the seed orders
    (name -> keys, float64 shape (n,)) and per-request isolated latencies (s)."""

    instance: Any
    engines: list[dict[str, Any]]
    routers: tuple[str, ...]
    seeds: dict[str, np.ndarray]
    isolated_s: np.ndarray
    digest: str = ""
    build_s: float = 0.0
    max_evaluations: int | None = None
    history: list = field(default_factory=list)


def build_search(instance: Any, *, lp_solution: Any = None, engines: list | None = None,
                 routers: tuple[str, ...] = ROUTERS,
                 max_evaluations: int | None = None) -> SearchModel:
    """Seeds and the space for ``instance``; ``lp_solution``: a solved ``cost-lp``
    :class:`Solution` whose ``alpha_point_s`` becomes a seed order; ``max_evaluations``
    caps the simulations of the search (None: only the time limit)."""
    t0 = time.perf_counter()
    from lpserve.opt.cost_lp import request_floors

    tr = instance.trace
    a = np.asarray(tr.arrival_s, np.float64)
    o = np.asarray(tr.output_tokens, np.float64)
    s = np.asarray(tr.prompt_tokens, np.float64)
    try:
        fl = request_floors(instance, instance.cost_model())
        iso = fl.prefill_s + fl.decode_s
    except ValueError:
        iso = o + 1.0
    seeds = {"fcfs": a.copy(), "shortest-output": o + a * 1e-9,
             "least-isolated": iso + a * 1e-9, "prompt": s + a * 1e-9,
             "fcfs+isolated": a + iso}
    if lp_solution is not None and "alpha_point_s" in getattr(lp_solution, "primal", {}):
        ap = np.asarray(lp_solution.primal["alpha_point_s"], np.float64)
        if ap.shape == a.shape and np.all(np.isfinite(ap)):
            seeds["lp-alpha"] = ap + a * 1e-9
    return SearchModel(instance, list(engines) if engines is not None else
                       candidate_engines(instance), tuple(routers), seeds, iso,
                       instance.digest(), time.perf_counter() - t0, max_evaluations)


def _evaluate(model: SearchModel, keys: np.ndarray, engine: dict, router: str,
              seed: int = 0) -> tuple[float, np.ndarray, int]:
    """Simulated total latency (s), per-request latency (s) and finished count."""
    from lpserve.sim import simulate

    res = simulate(model.instance, schedule_policy(keys, engine, router), seed)
    fin = res.arrays["status"] == "finished"
    e2e = np.where(fin, res.arrays["e2e_s"], np.nan)
    # a schedule that leaves a request unfinished is not a schedule of the instance
    total = float(np.nansum(e2e)) if fin.all() else math.inf
    return total, e2e, int(fin.sum())


def _moves(rng: np.random.Generator, order: np.ndarray, e2e: np.ndarray, iso: np.ndarray,
           arrival: np.ndarray) -> np.ndarray:
    """One neighbour of ``order`` (a permutation, first = highest priority): with
    probability 1/2 an insert of a request drawn by slowdown ``e2e/iso`` a few places
    earlier, else a swap of two requests adjacent in the order and close in arrival."""
    n = order.size
    new = order.copy()
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    if rng.random() < 0.5:
        slow = np.nan_to_num(e2e / np.maximum(iso, 1e-9), nan=1.0)
        p = slow / slow.sum()
        j = int(rng.choice(n, p=p))
        k = int(pos[j])
        if k == 0:
            return new
        step = int(rng.integers(1, max(2, min(k, 16)) + 1))
        tgt = max(0, k - step)
        new = np.insert(np.delete(new, k), tgt, j)
        return new
    k = int(rng.integers(0, max(1, n - 1)))
    m = min(n - 1, k + 1 + int(rng.integers(0, 3)))
    i, j = new[k], new[m]
    if abs(arrival[i] - arrival[j]) <= 4.0 * max(iso[i], iso[j]):
        new[k], new[m] = j, i
    return new


def solve_search(model: SearchModel, solver: str = "local-search",
                 time_limit_s: float | None = 30.0, seed: int = 0) -> Solution:
    """See :func:`_search`; an instance the simulator refuses gives status ERROR."""
    if time_limit_s is None and model.max_evaluations is None:
        raise ValueError("schedule-search: give time_limit_s or max_evaluations (the local "
                         "search runs until one of them)")
    try:
        return _search(model, solver, time_limit_s, seed)
    except ValueError as exc:
        return Solution("schedule-search", Status.ERROR, digest=model.digest,
                        objective_units="s", message=f"the simulator refused the instance: "
                        f"{exc}")


def _search(model: SearchModel, solver: str, time_limit_s: float | None,
            seed: int) -> Solution:
    """Seeds x engines x routers, then local search from the best until the time limit or
    ``max_evaluations``. Status FEASIBLE with the best schedule found (``info
    ["hit_time_limit"]`` says whether the time limit ended the search), LIMIT when the limit
    came before any schedule finished every request, INFEASIBLE when none did.
    ``objective`` = simulated total latency (s); ``bound`` NaN (a search proves none)."""
    from lpserve.policies.static_order import order_keys

    t0 = time.perf_counter()
    max_evaluations = model.max_evaluations
    deadline = math.inf if time_limit_s is None else t0 + float(time_limit_s)
    rng = np.random.default_rng(seed)
    arrival = np.asarray(model.instance.trace.arrival_s, np.float64)
    hist: list[dict[str, Any]] = []
    best = (math.inf, None, None, None, None)
    n_eval = 0
    stopped = False

    def budget_left() -> bool:
        return time.perf_counter() < deadline and (max_evaluations is None
                                                   or n_eval < max_evaluations)

    # stage 1: every seed on the first engine x router, then every engine x router on the
    # two best seeds
    stage1 = [(name, model.engines[0], model.routers[0]) for name in model.seeds]
    scored: dict[str, float] = {}
    for name, eng, rt in stage1:
        if not budget_left():
            stopped = True
            break
        v, e2e, _ = _evaluate(model, model.seeds[name], eng, rt)
        n_eval += 1
        scored[name] = v
        hist.append({"stage": "seed", "seed": name, "value_s": v})
        if v < best[0]:
            best = (v, model.seeds[name], eng, rt, e2e)
    top = sorted(scored, key=scored.get)[:2]
    for name in top:
        for eng in model.engines:
            for rt in model.routers:
                if (eng is model.engines[0] and rt == model.routers[0]):
                    continue
                if not budget_left():
                    stopped = True
                    break
                v, e2e, _ = _evaluate(model, model.seeds[name], eng, rt)
                n_eval += 1
                hist.append({"stage": "engine", "seed": name, "value_s": v,
                             "budget": eng["max_num_batched_tokens"], "router": rt})
                if v < best[0]:
                    best = (v, model.seeds[name], eng, rt, e2e)
    if best[1] is None:
        return Solution("schedule-search", Status.INFEASIBLE if not stopped else Status.LIMIT,
                        wall_s=time.perf_counter() - t0, digest=model.digest,
                        objective_units="s", message="no candidate schedule finished every "
                        "request", info={"evaluations": n_eval})
    # stage 2: local search over the order of the best (engine, router)
    val, keys, eng, rt, e2e = best
    order = np.argsort(keys, kind="stable")
    improved = 0
    # one request has one order: no neighbour to try (the loop would spin until the limit)
    while order.size > 1 and budget_left():
        cand = _moves(rng, order, e2e, model.isolated_s, arrival)
        if np.array_equal(cand, order):
            continue
        v, e2e_c, _ = _evaluate(model, order_keys(cand), eng, rt)
        n_eval += 1
        if v < val - 1e-9:
            val, order, e2e = v, cand, e2e_c
            improved += 1
            hist.append({"stage": "local", "value_s": v, "evaluation": n_eval})
    stopped = stopped or time.perf_counter() >= deadline
    keys = order_keys(order)
    model.history = hist
    status = Status.FEASIBLE  # an incumbent schedule; its optimality is never proven
    return Solution("schedule-search", status, float(val), math.nan,
                    time.perf_counter() - t0, model.digest,
                    primal={"keys": keys, "order": order.copy(), "e2e_s": e2e},
                    objective_units="s",
                    message=("time limit reached; best schedule found" if stopped else ""),
                    info={"evaluations": n_eval, "local_improvements": improved,
                          "hit_time_limit": bool(stopped),
                          "engine": dict(eng), "router": rt,
                          "schedule_space": "static priority orders x decode-first chunked "
                          "prefill budgets x {least-outstanding, round-robin} routing",
                          "best_seed": min(scored, key=scored.get) if scored else ""})


def solve_exact(model: SearchModel, solver: str = "enumeration",
                time_limit_s: float | None = None) -> Solution:
    """See :func:`_exact`; an instance the simulator refuses gives status ERROR."""
    try:
        return _exact(model, time_limit_s)
    except ValueError as exc:
        return Solution("schedule-exact", Status.ERROR, digest=model.digest,
                        objective_units="s", message=f"the simulator refused the instance: "
                        f"{exc}")


def _exact(model: SearchModel, time_limit_s: float | None) -> Solution:
    """Every permutation under every engine x router of the space; OPTIMAL with the
    optimum of the space, FEASIBLE (best so far) when the time limit stops it, ERROR for
    more than :data:`EXACT_MAX_REQUESTS` requests."""
    from lpserve.policies.static_order import order_keys

    n = len(model.instance.trace)
    if n > EXACT_MAX_REQUESTS:
        return Solution("schedule-exact", Status.ERROR, digest=model.digest,
                        objective_units="s", message=f"schedule-exact enumerates at most "
                        f"{EXACT_MAX_REQUESTS} requests, the instance has {n}")
    t0 = time.perf_counter()
    best = (math.inf, None, None, None)
    count = 0
    stopped = False
    for perm in itertools.permutations(range(n)):
        keys = order_keys(np.array(perm, np.int64))
        for eng in model.engines:
            for rt in model.routers:
                if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                    stopped = True
                    break
                v, _, _ = _evaluate(model, keys, eng, rt)
                count += 1
                if v < best[0] - 1e-12:
                    best = (v, keys, eng, rt)
            if stopped:
                break
        if stopped:
            break
    if best[1] is None:
        return Solution("schedule-exact", Status.LIMIT if stopped else Status.INFEASIBLE,
                        wall_s=time.perf_counter() - t0, digest=model.digest,
                        objective_units="s", info={"evaluations": count})
    v, keys, eng, rt = best
    return Solution("schedule-exact", Status.FEASIBLE if stopped else Status.OPTIMAL, v,
                    math.nan if stopped else v, time.perf_counter() - t0, model.digest,
                    primal={"keys": keys}, objective_units="s",
                    info={"evaluations": count, "engine": dict(eng), "router": rt})


def export_schedule(solution: Solution, instance: Any) -> Any:
    """The schedule of ``solution`` as a Policy (``StaticOrder`` + its engine and router);
    simulating it reproduces ``solution.objective``."""
    if "keys" not in solution.primal:
        raise SolutionError(f"{solution.formulation}: no schedule to export "
                            f"({solution.status.value})")
    if solution.digest and solution.digest != instance.digest():
        raise SolutionError(f"{solution.formulation}: solution was solved for instance "
                            f"{solution.digest[:12]}, not {instance.digest()[:12]}")
    return schedule_policy(solution.primal["keys"], solution.info["engine"],
                           solution.info["router"], name=solution.formulation)


def _certify(model: SearchModel, solution: Solution) -> dict[str, float]:
    """|simulated value of the exported schedule - objective| (s)."""
    if "keys" not in solution.primal:
        return {"value_residual_s": 0.0}
    v, _, _ = _evaluate(model, solution.primal["keys"], solution.info["engine"],
                        solution.info["router"])
    return {"value_residual_s": abs(v - solution.objective)}


SCHEDULE_SEARCH = Formulation("schedule-search", build_search, solve_search, _certify,
                              export_schedule)
SCHEDULE_EXACT = Formulation("schedule-exact", build_search, solve_exact, _certify,
                             export_schedule)
