"""Calibration from serving measurements (layer 7): fit cost-model parameters by simulating
the measured benchmarks' own workloads and matching what their clients measured.

The fit has two stages. First the engine's parameters: the objective is the sum over the
fitted stages of ``log(sim / real)^2`` of :data:`FIT_FIGURES` (mean E2E and mean
inter-token latency, :mod:`lpserve.evaluate.sim_to_real`), minimized by
``scipy.optimize.least_squares`` over the logarithms of the chosen parameters (so each
stays positive), within :data:`lpserve.cost.fit.BOUNDS`, simulated without a front end.
Then the serving front end's latency (``frontend_latency_s``, ``models/simulator.md``
(33)): it shifts every request's TTFT and E2E by exactly itself on a trace without
dependencies, so it is the one-dimensional minimizer of the same objective over
:data:`FRONTEND_FIGURES`, on the full-length simulations of the first stage's result.
Stages the real server overloaded are left out (their figures cover only the requests
that did not time out). Each stage can be cut to its first ``max_stage_s`` seconds to
bound the cost of one evaluation of the first stage.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from lpserve.evaluate.sim_to_real import StageComparison, compare_runs, mape
from lpserve.trace.serving_runs import ServingStage, runs

#: the figures the fit of the engine's parameters matches
FIT_FIGURES = ("e2e_s.mean", "itl_s.mean")
#: the figures the front end's latency is fitted to (each moves by exactly that latency)
FRONTEND_FIGURES = ("ttft_s.mean", "e2e_s.mean")
#: the largest front-end latency a fit may return (s)
MAX_FRONTEND_S = 1.0
#: parameters a serving fit moves by default: the weight-streaming efficiency and the
#: engine's per-iteration, per-layer and per-sequence overheads
SERVING_PARAMETERS = ("eff_weights", "iter_overhead_s", "layer_overhead_s", "seq_overhead_s")
#: where the search starts for a parameter at 0 in the starting calibration
_START = {"iter_overhead_s": 1e-3, "layer_overhead_s": 1e-5, "seq_overhead_s": 1e-5}


@dataclass(frozen=True)
class ServingFit:
    """Outcome of :func:`fit_serving`.

    Attributes:
        values: fitted parameter -> value (units as in ``lpserve.cost.fit.BOUNDS``), with
            ``frontend_latency_s`` (seconds) when the front end was fitted.
        start: the starting values (the starting calibration's, or a small positive value
            for a parameter it has at 0, since the search runs on logarithms).
        before, after: per-stage comparisons on the fitted stages (full length) under the
            starting calibration and under the fitted values.
        evaluations: simulations of the fitted stages the search ran.
    """

    values: dict[str, float]
    start: dict[str, float]
    before: list[StageComparison]
    after: list[StageComparison]
    evaluations: int

    def errors(self) -> dict[str, dict[str, float]]:
        """``{"before": mape, "after": mape}`` on the fitted stages."""
        return {"before": mape(self.before), "after": mape(self.after)}

    @property
    def figures(self) -> tuple[str, ...]:
        """The figures the fit matched (:data:`FIT_FIGURES`, and :data:`FRONTEND_FIGURES`
        when the front end's latency was fitted)."""
        extra = FRONTEND_FIGURES if "frontend_latency_s" in self.values else ()
        return tuple(dict.fromkeys(FIT_FIGURES + extra))

    def abs_errors(self) -> list[float]:
        """``|sim / real - 1|`` of every matched figure of every fitted stage the real
        server did not overload, under the fitted values."""
        return [r.ape(k) / 100 for r in self.after if not r.real_saturated
                for k in self.figures]


def truncate(stages: Sequence[ServingStage], max_stage_s: float) -> list[ServingStage]:
    """Each run's stages cut to their first ``max_stage_s`` seconds, re-timed back to back."""
    out = []
    for run_stages in runs(stages).values():
        start = 0.0
        for s in run_stages:
            d = min(s.duration_s, max_stage_s)
            out.append(replace(s, duration_s=d, start_s=start))
            start += d
    return out


def _residuals(rows: Sequence[StageComparison]) -> np.ndarray:
    r = []
    for row in rows:
        if row.real_saturated:
            continue
        for k in FIT_FIGURES:
            sim = row.sim[k]
            r.append(math.log(sim / row.real[k]) if math.isfinite(sim) and sim > 0 else 10.0)
    return np.asarray(r)


def fit_frontend_latency(rows: Sequence[StageComparison]) -> float:
    """The front end's latency (s, in ``[0, MAX_FRONTEND_S]``) that minimizes the sum of
    ``log((sim + L) / real)^2`` over :data:`FRONTEND_FIGURES` of ``rows`` (simulated
    without a front end; stages the real server overloaded left out)."""
    from scipy.optimize import minimize_scalar

    pairs = [(r.sim[k], r.real[k]) for r in rows if not r.real_saturated
             for k in FRONTEND_FIGURES if math.isfinite(r.sim[k]) and r.real[k] > 0]
    if not pairs:
        raise ValueError("fit_frontend_latency: no stage the real server did not overload")
    sim, real = np.array(pairs).T
    res = minimize_scalar(lambda x: float(np.sum(np.log((sim + x) / real) ** 2)),
                          bounds=(0.0, MAX_FRONTEND_S), method="bounded",
                          options={"xatol": 1e-7})
    return float(res.x)


def fit_serving(stages: Sequence[ServingStage], *, params: Sequence[str] = SERVING_PARAMETERS,
                engine: str = "vllm", calibration: str | None = None,
                max_stage_s: float | None = 120.0, max_evaluations: int = 80,
                frontend: bool = True, seed: int = 0, **fixed: Any) -> ServingFit:
    """Fit ``params`` of the cost model to ``stages`` by simulation, then (``frontend``)
    the serving front end's latency.

    Starts from the calibration ``lp.cost_model`` picks for ``engine`` (or the named
    ``calibration``) with ``fixed`` overrides; returns the fitted values with the error of
    every fitted stage before and after, each simulated at full length."""
    from scipy.optimize import least_squares

    from lpserve.cost import cost_model
    from lpserve.cost.fit import BOUNDS

    unknown = [p for p in params if p not in BOUNDS]
    if unknown:
        raise ValueError(f"cannot fit {unknown}; fittable: {', '.join(sorted(BOUNDS))}")
    if frontend and "frontend_latency_s" in fixed:
        raise ValueError("fit_serving: frontend_latency_s is fixed; pass frontend=False")
    base = {"engine": engine, **({"calibration": calibration} if calibration else {}), **fixed}
    st0 = stages[0]
    ref = cost_model(gpu=st0.gpu, llm=st0.llm, tp=st0.tp, **base)
    # the engine's parameters are fitted without a front end; it is fitted after them
    engine_only = {**base, "frontend_latency_s": 0.0} if frontend else base
    start = {p: float(ref.values[p]) or _START.get(p, 1e-6) for p in params}
    lo = np.array([math.log(max(BOUNDS[p][0], 1e-9)) for p in params])
    hi = np.array([math.log(BOUNDS[p][1]) for p in params])
    x0 = np.clip(np.log([start[p] for p in params]), lo + 1e-9, hi - 1e-9)
    short = truncate(stages, max_stage_s) if max_stage_s else list(stages)
    count = [0]

    def fun(x: np.ndarray) -> np.ndarray:
        count[0] += 1
        vals = dict(zip(params, np.exp(x).tolist()))
        return _residuals(compare_runs(short, seed=seed, **engine_only, **vals))

    sol = least_squares(fun, x0, bounds=(lo, hi), diff_step=0.05, x_scale=1.0,
                        max_nfev=max_evaluations, method="trf")
    values = dict(zip(params, np.exp(sol.x).tolist()))
    before = compare_runs(stages, seed=seed, **base)
    after = compare_runs(stages, seed=seed, **engine_only, **values)
    if frontend:
        start["frontend_latency_s"] = ref.frontend_latency_s
        values["frontend_latency_s"] = fit_frontend_latency(after)
        after = compare_runs(stages, seed=seed, **base, **values)
    return ServingFit(values, start, before, after, count[0])
