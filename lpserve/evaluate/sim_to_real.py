"""Simulated against measured serving (layer 7): rebuild a measured run's workload, simulate
it on the engine it ran and compare per stage what the client measured.

Metrics compared per stage (seconds, over the stage's requests):

* ``e2e_s`` mean and p90, ``ttft_s`` mean and p90, as the client measured them;
* ``itl_s`` mean: seconds per generated token after the first, ``(E2E - TTFT) / (n - 1)``.
  The measured side is computed from the published means (every request generates exactly
  ``n = output_tokens``). inference-perf's own ``inter_token_latency`` averages the gaps
  between streamed chunks, about two per generated token on these runs (``(E2E - TTFT) /
  ITL`` is ``2 n`` within 1 %), so it is half the per-token interval; it is printed beside
  (``itl_chunk_s``) and not compared.

A stage *saturates* when its queue grows without bound: the mean TTFT of its last tenth
of arrivals is over 1 s and over twice that of its first tenth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from lpserve.trace.serving_runs import ServingStage, runs, stage_trace

#: workload profiles of the public runs whose stages a fit may use; every other stage is
#: validation. The ``general`` runs carry two loads per model (8 and 20 requests/s), which
#: separates per-iteration from per-sequence costs; ``codegen``, ``roleplay`` (other
#: prompt lengths, 5-10 requests/s) and ``reasoning`` (overloaded for real) are held out.
TRAIN_PROFILES = ("general",)


def split_of(stage: ServingStage) -> str:
    """``"train"`` for a stage of a :data:`TRAIN_PROFILES` run, else ``"validation"``."""
    return "train" if stage.run.rsplit("-", 1)[-1] in TRAIN_PROFILES else "validation"


#: the compared figures: (metric, statistic)
COMPARED = (("e2e_s", "mean"), ("e2e_s", "p90"), ("ttft_s", "mean"), ("ttft_s", "p90"),
            ("itl_s", "mean"))


@dataclass(frozen=True)
class StageComparison:
    """One stage: measured and simulated figures (keys ``"e2e_s.mean"`` ... as in
    :data:`COMPARED`), whether each side saturated, and the simulation's settings (the
    calibration's name and the front end's latency in seconds)."""

    stage: ServingStage
    real: dict[str, float]
    sim: dict[str, float]
    real_saturated: bool
    sim_saturated: bool
    calibration: str
    frontend_latency_s: float = 0.0

    def ape(self, key: str) -> float:
        """Absolute percentage error of ``key`` (100 |sim - real| / real)."""
        r, s = self.real[key], self.sim[key]
        return 100.0 * abs(s - r) / r if r > 0 and math.isfinite(s) else math.inf

    def row(self) -> dict[str, Any]:
        """A flat, JSON-ready row: the stage's name, load, each figure and its error."""
        st = self.stage
        out: dict[str, Any] = {"stage": st.key, "llm": st.llm, "tp": st.tp,
                               "rate_rps": st.rate_rps, "calibration": self.calibration,
                               "frontend_latency_s": self.frontend_latency_s,
                               "real_saturated": self.real_saturated,
                               "sim_saturated": self.sim_saturated,
                               "itl_chunk_s": st.measured["itl_s"]["mean"]}
        for m, stat in COMPARED:
            k = f"{m}.{stat}"
            out[f"real {k}"], out[f"sim {k}"], out[f"ape {k}"] = (
                self.real[k], self.sim[k], self.ape(k))
        return out


def measured_figures(stage: ServingStage) -> dict[str, float]:
    """The stage's measured :data:`COMPARED` figures (``itl_s.mean`` per generated token)."""
    m = stage.measured
    return {"e2e_s.mean": m["e2e_s"]["mean"], "e2e_s.p90": m["e2e_s"]["p90"],
            "ttft_s.mean": m["ttft_s"]["mean"], "ttft_s.p90": m["ttft_s"]["p90"],
            "itl_s.mean": stage.tpot_s()}


def _stage_figures(arrays: dict[str, np.ndarray], mask: np.ndarray) -> tuple[dict[str, float],
                                                                             bool]:
    fin = mask & (arrays["status"] == "finished")
    if not fin.any():
        return {f"{m}.{s}": math.inf for m, s in COMPARED}, True
    e2e, ttft = arrays["e2e_s"][fin], arrays["ttft_s"][fin]
    out = arrays["output_tokens"][fin].astype(float)
    per_token = (e2e - ttft) / np.maximum(out - 1.0, 1.0)
    figs = {"e2e_s.mean": float(e2e.mean()), "e2e_s.p90": float(np.percentile(e2e, 90)),
            "ttft_s.mean": float(ttft.mean()), "ttft_s.p90": float(np.percentile(ttft, 90)),
            "itl_s.mean": float(per_token.mean())}
    idx = np.flatnonzero(mask)
    tenth = max(idx.size // 10, 1)
    t_all = np.where(arrays["status"] == "finished", arrays["ttft_s"], np.inf)
    first, last = t_all[idx[:tenth]].mean(), t_all[idx[-tenth:]].mean()
    saturated = bool(last > 1.0 and last > 2.0 * first) or fin.sum() < mask.sum()
    return figs, saturated


def simulate_run(stages: Sequence[ServingStage], *, seed: int = 0,
                 policy: Any = None, **cost_options: Any) -> list[StageComparison]:
    """Simulate one run's stages back to back on its engine and compare each stage.

    The cluster is one replica of the run's GPU, model and TP; the policy is lpserve's
    ``vllm`` (V1 scheduling: chunked prefill, decode first) with the run's
    ``max_num_batched_tokens``, ``max_num_seqs``, prefix caching and async scheduling
    (``schedule_ahead``) unless ``policy`` is given (a limit the run does not state, 0,
    keeps the engine's default for the GPU);
    ``cost_options`` go to :func:`lpserve.cost.cost_model` (``engine=``,
    ``calibration=``, parameter overrides)."""
    from lpserve.cluster import Cluster
    from lpserve.cost import cost_model
    from lpserve.instance import Instance
    from lpserve.registry import make_policy, simulate

    st0 = stages[0]
    trace, stage_of = stage_trace(stages, seed=seed)
    cost = cost_model(gpu=st0.gpu, llm=st0.llm, tp=st0.tp, **cost_options)
    cluster = Cluster(gpu=st0.gpu, llm=st0.llm, tp=st0.tp)
    inst = Instance(trace=trace, cluster=cluster, cost=cost)
    limits = {k: v for k, v in (("max_num_batched_tokens", st0.max_num_batched_tokens),
                                ("max_num_seqs", st0.max_num_seqs)) if v}  # 0: GPU default
    pol = policy if policy is not None else make_policy(
        "vllm", prefix_caching=st0.prefix_caching, schedule_ahead=st0.schedule_ahead,
        **limits)
    res = simulate(inst, pol, seed)
    name = str(getattr(cost, "calibration", {}).get("name", "?"))
    out = []
    for k, st in enumerate(stages):
        sim, sat = _stage_figures(res.arrays, stage_of == k)
        out.append(StageComparison(st, measured_figures(st), sim, st.overloaded, sat, name,
                                   cost.frontend_latency_s))
    return out


def compare_runs(stages: Iterable[ServingStage], *, seed: int = 0,
                 **cost_options: Any) -> list[StageComparison]:
    """:func:`simulate_run` for every run among ``stages`` (grouped by run)."""
    out: list[StageComparison] = []
    for run_stages in runs(stages).values():
        out.extend(simulate_run(run_stages, seed=seed, **cost_options))
    return out


def mape(rows: Sequence[StageComparison]) -> dict[str, float]:
    """Mean absolute percentage error per compared figure over ``rows`` (stages the real
    server did not overload; an overloaded stage's figures cover only the requests that
    did not time out)."""
    keep = [r for r in rows if not r.real_saturated]
    return {f"{m}.{s}": (float(np.mean([r.ape(f"{m}.{s}") for r in keep])) if keep
                         else math.nan) for m, s in COMPARED}
