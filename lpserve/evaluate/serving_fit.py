"""Calibration from serving measurements (layer 7): fit cost-model parameters by simulating
the measured benchmarks' own workloads and matching what their clients measured.

The objective is the sum over the fitted stages of ``log(sim / real)^2`` of the mean E2E,
mean TTFT and mean inter-token latency (:mod:`lpserve.evaluate.sim_to_real`), minimized by
``scipy.optimize.least_squares`` over the logarithms of the chosen parameters (so each
stays positive), within :data:`lpserve.cost.fit.BOUNDS`. Stages the real server overloaded
are left out (their figures cover only the requests that did not time out). Each stage can
be cut to its first ``max_stage_s`` seconds to bound the cost of one evaluation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from lpserve.evaluate.sim_to_real import StageComparison, compare_runs, mape
from lpserve.trace.serving_runs import ServingStage, runs

#: the figures the fit matches
FIT_FIGURES = ("e2e_s.mean", "itl_s.mean")
#: parameters a serving fit moves by default: the weight-streaming efficiency and the
#: engine's per-iteration, per-layer and per-sequence overheads
SERVING_PARAMETERS = ("eff_weights", "iter_overhead_s", "layer_overhead_s", "seq_overhead_s")
#: where the search starts for a parameter at 0 in the starting calibration
_START = {"iter_overhead_s": 1e-3, "layer_overhead_s": 1e-5, "seq_overhead_s": 1e-5}


@dataclass(frozen=True)
class ServingFit:
    """Outcome of :func:`fit_serving`.

    Attributes:
        values: fitted parameter -> value (units as in ``lpserve.cost.fit.BOUNDS``).
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


def fit_serving(stages: Sequence[ServingStage], *, params: Sequence[str] = SERVING_PARAMETERS,
                engine: str = "vllm", calibration: str | None = None,
                max_stage_s: float | None = 120.0, max_evaluations: int = 80,
                seed: int = 0, **fixed: Any) -> ServingFit:
    """Fit ``params`` of the cost model to ``stages`` by simulation.

    Starts from the calibration ``lp.cost_model`` picks for ``engine`` (or the named
    ``calibration``) with ``fixed`` overrides; returns the fitted values with the error of
    every fitted stage before and after, each simulated at full length."""
    from scipy.optimize import least_squares

    from lpserve.cost import cost_model
    from lpserve.cost.fit import BOUNDS

    unknown = [p for p in params if p not in BOUNDS]
    if unknown:
        raise ValueError(f"cannot fit {unknown}; fittable: {', '.join(sorted(BOUNDS))}")
    base = {"engine": engine, **({"calibration": calibration} if calibration else {}), **fixed}
    st0 = stages[0]
    ref = cost_model(gpu=st0.gpu, llm=st0.llm, tp=st0.tp, **base)
    start = {p: float(ref.values[p]) or _START.get(p, 1e-6) for p in params}
    lo = np.array([math.log(max(BOUNDS[p][0], 1e-9)) for p in params])
    hi = np.array([math.log(BOUNDS[p][1]) for p in params])
    x0 = np.clip(np.log([start[p] for p in params]), lo + 1e-9, hi - 1e-9)
    short = truncate(stages, max_stage_s) if max_stage_s else list(stages)
    count = [0]

    def fun(x: np.ndarray) -> np.ndarray:
        count[0] += 1
        vals = dict(zip(params, np.exp(x).tolist()))
        return _residuals(compare_runs(short, seed=seed, **base, **vals))

    sol = least_squares(fun, x0, bounds=(lo, hi), diff_step=0.05, x_scale=1.0,
                        max_nfev=max_evaluations, method="trf")
    values = dict(zip(params, np.exp(sol.x).tolist()))
    before = compare_runs(stages, seed=seed, **base)
    after = compare_runs(stages, seed=seed, **base, **values)
    return ServingFit(values, start, before, after, count[0])
