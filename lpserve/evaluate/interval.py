"""The optimality interval of an instance: [best valid lower bound, best offline schedule].

* :class:`TotalLatencyBound` — a bound on total latency from a formulation
  (``cost-lp``, ``srpt-bound``, ``cost-bound``) as a prepared bound of
  :func:`lpserve.evaluate.compare`: it
  bounds ``e2e_s_mean`` and ``total_latency_s`` over the requests that fit on a replica,
  and only for runs that finished all of them (a bound on a sum over a set says nothing
  about a subset); speculative decoding is outside its proof.
* :func:`optimality_interval` — every lower bound (status, wall time), the schedule search
  (``schedule-search``: static priority orders, see ``models/schedule-search.md``) and the
  best of the simulated policies, as one record: the optimum of the simulator's
  non-speculative schedules lies in ``[lower_s, upper_s]`` (totals, s). Its plot is
  :func:`lpserve.evaluate.plots.plot_interval_vs_load`.
  The same for p99 TTFT and p99 E2E: :func:`lpserve.evaluate.bounds.quantile_intervals`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["TotalLatencyBound", "PreparedTotal", "optimality_interval", "interval", "fitting_subset",
           "LOWER_BOUNDS"]

#: lower bounds of the interval, in the order they are computed (the interval takes the
#: largest: each is valid on its own)
LOWER_BOUNDS = ("cost-bound", "srpt-bound", "cost-lp")


def fitting_subset(instance: Any) -> tuple[Any, np.ndarray]:
    """``(instance restricted to the requests whose prompt + output fits one replica's
    KV memory, bool mask (n,))``; the others are rejected by every engine."""
    tr = instance.trace
    cost = instance.cost_model()
    cap = float(cost.kv_capacity_tokens(instance.cluster.gpu_memory_fraction))
    peak = np.asarray(tr.prompt_tokens, np.int64) + np.asarray(tr.output_tokens, np.int64)
    fits = peak <= cap
    return (instance if fits.all() else instance.with_(trace=tr.take(fits))), fits


@dataclass(frozen=True, eq=False)
class PreparedTotal:
    """A total-latency bound prepared for one instance (``values`` as in
    :class:`~lpserve.evaluate.bounds.PreparedBound`)."""

    name: str
    total_s: float
    fits: np.ndarray
    status: str
    wall_s: float
    message: str = ""
    info: dict = field(default_factory=dict)

    def applies_to(self, policy: Any) -> bool:
        """Not for speculative decoding (several tokens per iteration; the proof counts one)."""
        return getattr(policy.engine, "speculation", None) is None

    def values(self, served: np.ndarray) -> dict[str, float]:
        """``e2e_s_mean`` and ``total_latency_s`` when ``served`` covers every fitting
        request and the bound is finite; otherwise nothing."""
        m = np.asarray(served, bool)
        k = int(self.fits.sum())
        if not math.isfinite(self.total_s) or k == 0 or not np.array_equal(m, self.fits):
            return {}
        return {"e2e_s_mean": self.total_s / k, "total_latency_s": self.total_s}


@dataclass(frozen=True)
class TotalLatencyBound:
    """A formulation's bound on total latency, as a :class:`~lpserve.evaluate.bounds.Bound`.

    ``time_limit_s`` goes to the solver (``None``: none); a bound that is not certified at
    the limit prepares with value NaN and its status (``limit``), never raising.
    """

    name: str
    time_limit_s: float | None = 30.0
    options: tuple = ()
    description: str = ""

    def prepare(self, instance: Any) -> PreparedTotal:
        """Solve on the fitting requests of ``instance`` (see :func:`fitting_subset`)."""
        from lpserve.opt import solve

        sub, fits = fitting_subset(instance)
        t0 = time.perf_counter()
        kw = dict(self.options)
        sol = solve(self.name, sub, time_limit_s=self.time_limit_s, **kw)
        val = float(sol.bound) if math.isfinite(sol.bound) else math.nan
        return PreparedTotal(self.name, val, fits, sol.status.value, time.perf_counter() - t0,
                             sol.message, {k: v for k, v in sol.info.items()
                                           if isinstance(v, (int, float, str))})


def optimality_interval(instance: Any, *, lp_time_limit_s: float | None = 30.0,
                        search_time_limit_s: float | None = 20.0,
                        search_evaluations: int | None = None,
                        policy_totals: Mapping[str, float] | None = None,
                        lower: Sequence[str] = LOWER_BOUNDS, seed: int = 0,
                        lp_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The interval ``[lower_s, upper_s]`` (total latency, s) around the optimum of the
    simulator's non-speculative schedules of ``instance``'s fitting requests.

    Args:
        lp_time_limit_s: time limit of ``cost-lp`` (LIMIT keeps the best certified bound).
        search_time_limit_s: time limit of ``schedule-search`` (LIMIT keeps the best
            schedule found; None: only ``search_evaluations``).
        search_evaluations: simulations of ``schedule-search`` at most (None: only the
            time limit); a count alone makes the upper end the same on every machine.
        policy_totals: simulated total latencies of policies that finished every fitting
            request (label -> s); any of them can be the upper end.
        lower: lower-bound formulations to compute.

    Returns a JSON-friendly dict: ``lower_s``, ``lower_name``, ``upper_s``, ``upper_name``,
    ``ratio`` (upper / lower), ``n_requests``, ``bounds`` (one record per bound: name,
    status, total_s, mean_s, wall_s, message), ``search`` (status, total_s, wall_s,
    evaluations, engine, router, schedule space). The tails' intervals:
    :func:`lpserve.evaluate.bounds.quantile_intervals`.
    """
    from lpserve.opt import solve

    sub, fits = fitting_subset(instance)
    n = int(fits.sum())
    records = []
    alpha = None
    for name in lower:
        t0 = time.perf_counter()
        kw: dict[str, Any] = {}
        if name == "cost-lp":
            kw.update(lp_options or {})
            if policy_totals:
                kw.setdefault("upper_total_s", min(policy_totals.values()))
        sol = solve(name, sub, time_limit_s=lp_time_limit_s if name == "cost-lp" else None,
                    **kw)
        if name == "cost-lp" and sol.solved:
            alpha = sol
        val = float(sol.bound) if math.isfinite(sol.bound) else math.nan
        records.append({"name": name, "status": sol.status.value, "total_s": val,
                        "mean_s": val / n if n and math.isfinite(val) else math.nan,
                        "wall_s": time.perf_counter() - t0, "message": sol.message})
    t0 = time.perf_counter()
    ss = solve("schedule-search", sub, time_limit_s=search_time_limit_s, seed=seed,
               lp_solution=alpha, max_evaluations=search_evaluations)
    search = {"status": ss.status.value, "total_s": float(ss.objective),
              "mean_s": float(ss.objective) / n if n else math.nan,
              "wall_s": time.perf_counter() - t0, "message": ss.message,
              **{k: ss.info.get(k) for k in ("evaluations", "engine", "router",
                                             "schedule_space", "best_seed")}}
    finite = [r for r in records if math.isfinite(r["total_s"])]
    best_lo = max(finite, key=lambda r: r["total_s"]) if finite else None
    ups = {"schedule-search": float(ss.objective)} if math.isfinite(ss.objective) else {}
    ups.update({k: float(v) for k, v in (policy_totals or {}).items() if math.isfinite(v)})
    up_name = min(ups, key=ups.get) if ups else ""
    lo = best_lo["total_s"] if best_lo else math.nan
    up = ups.get(up_name, math.nan)
    return {"n_requests": n, "lower_s": lo, "lower_name": best_lo["name"] if best_lo else "",
            "upper_s": up, "upper_name": up_name,
            "lower_mean_s": lo / n if n else math.nan, "upper_mean_s": up / n if n else math.nan,
            "ratio": up / lo if lo and math.isfinite(lo) and math.isfinite(up) else math.nan,
            "bounds": records, "search": search}


#: ``lp.interval(instance, ...)``: the optimality interval (:func:`optimality_interval`)
interval = optimality_interval
