"""Calibration: fit efficiencies and overheads of the analytic model to measured rows.

A measured row is a dict (see :func:`predict_row`) with a ``scope``:

- ``"iteration"``: one whole iteration, or the mean over ``decode_iters`` decode
  iterations (contexts growing by one each);
- ``"layer_linear"``, ``"layer_prefill_attention"``, ``"layer_decode_attention"``: one
  decoder layer's token-level ops or attention, as in operator profiles;
- ``"all_reduce"``: one all-reduce of ``message_bytes`` bytes over ``tp`` GPUs;
- ``"static_batch"``: a whole static batch: one iteration prefilling the batch, then
  ``decode_iters`` decode iterations of it (a request-level latency);
- ``"batch"``: one iteration of an arbitrary batch given as lists (``prefill_list``,
  ``cached_list``, ``decode_list``), as read from a user's CSV.

Row fields: ``tp``, ``prefill_tokens`` (tokens per chunk), ``prefill_chunks`` (identical
chunks), ``prefill_cached``, ``decode_batch``, ``decode_context`` (context at the first
iteration), ``decode_iters``, ``message_bytes``, ``measured_s``, and optionally ``dtype``
(the served dtype of that measurement). Missing fields are 0 (``decode_iters`` 1).

Running ``python -m lpserve.cost.fit`` refits every calibration from the data in
``lpserve/data/calibration`` and rewrites ``fitted.toml`` there.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from lpserve.cost import _kernels as K
from lpserve.cost.catalog import GPUSpec, LLMSpec

# parameter -> (lower, upper) bounds of the fit
BOUNDS = {
    "eff_compute": (0.05, 1.0), "eff_weights": (0.05, 1.0), "plateau_tokens": (0.0, 512.0),
    "eff_attn": (0.02, 1.0), "attn_plateau_tokens": (0.0, 4096.0), "eff_kv": (0.05, 1.0),
    "attn_seq_s": (0.0, 1e-3), "attn_fixed_s": (0.0, 1e-3), "multi_prompt_token_s": (0.0, 1e-3),
    "attn_chunk_s": (0.0, 1e-3), "attn_token_s": (0.0, 1e-5), "ar_fixed_s": (0.0, 1e-3),
    "ar_latency_s": (0.0, 1e-3), "ar_link_efficiency": (0.01, 1.0), "a2a_fixed_s": (0.0, 1e-3),
    "a2a_link_efficiency": (0.01, 1.0), "layer_overhead_s": (0.0, 1e-3),
    "iter_overhead_s": (0.0, 0.1), "seq_overhead_s": (0.0, 1e-2),
}

# parameters refitted per engine on end-to-end measurements (steps 3-5 of ``calibrate``);
# ``ar_latency_s`` only where the rows span several tensor-parallel degrees (at one degree
# it is a per-layer constant like ``layer_overhead_s``: see :func:`engine_parameters`)
ENGINE_PARAMETERS = ("eff_compute", "eff_weights", "plateau_tokens", "layer_overhead_s",
                     "iter_overhead_s", "seq_overhead_s", "eff_attn", "ar_latency_s",
                     "multi_prompt_token_s")
# worst |predicted / measured - 1| allowed on any fitted row of the engine-level
# calibrations (least squares within this band; the validation target is 30 %)
MAX_REL_ERROR = 0.29
# (llm, Splitwise hardware key, catalog GPU) of each engine-level calibration
SPLITWISE_GROUPS = (("llama-2-70b", "a100-80gb", "a100-80gb"),
                    ("bloom-176b", "a100-80gb", "a100-80gb"),
                    ("bloom-176b", "h100-80gb", "h100-sxm"))


@dataclass
class FitResult:
    """Fitted values, the rows used and the relative errors of the fit (pred/meas - 1)."""

    values: dict[str, float]
    fitted: tuple[str, ...]
    n_rows: int
    rel_errors: np.ndarray = field(repr=False)
    success: bool = True
    message: str = ""

    @property
    def median_abs_error(self) -> float:
        """Median of ``|pred/meas - 1|`` over the rows used (a fraction, 0.05 = 5 %)."""
        return float(np.median(np.abs(self.rel_errors)))

    @property
    def max_abs_error(self) -> float:
        """Largest ``|pred/meas - 1|`` over the rows used (a fraction)."""
        return float(np.max(np.abs(self.rel_errors)))


def engine_parameters(rows: Sequence[dict[str, Any]],
                      candidates: Iterable[str] = ENGINE_PARAMETERS) -> tuple[str, ...]:
    """The ``candidates`` that ``rows`` identify.

    At a single tensor-parallel degree the all-reduce latency (``ar_latency_s``) is a
    per-layer constant like ``layer_overhead_s``: it stays at its base value (the
    interconnect's measured latency). For a single model (one layer count) a per-layer
    constant is also a per-iteration one: the per-layer overhead is fitted and the
    per-iteration overhead (``iter_overhead_s``) stays at its base (0), so that an engine's
    fixed costs scale with the layers it runs when the fit is applied to other models
    (``benchmarks/cost_validation.py`` checks that transfer on SGLang's held-out model).
    """
    several_tp = len({int(r.get("tp", 1)) for r in rows}) > 1
    several_llm = len({r.get("llm") for r in rows}) > 1
    drop = ({"ar_latency_s"} if not several_tp else set()) | (
        {"iter_overhead_s"} if not several_llm else set())
    return tuple(c for c in candidates if c not in drop)


def _model(gpu: str | GPUSpec, llm: str | LLMSpec, tp: int, values: dict[str, float],
           dtype: str | None = None, engine: str | None = None):
    from lpserve.cost.analytic import AnalyticCost

    kw = dict(values)
    if dtype:
        kw["dtype"] = dtype
    return AnalyticCost(gpu=gpu, llm=llm, tp=tp, engine=engine, **kw)


def predict_row(model: Any, row: dict[str, Any]) -> float:
    """Predicted seconds of one measured row under ``model`` (an AnalyticCost)."""
    p = model.params
    scope = row["scope"]
    c = int(row.get("prefill_tokens", 0))
    chunks = int(row.get("prefill_chunks", 1 if c else 0))
    h = int(row.get("prefill_cached", 0))
    b = int(row.get("decode_batch", 0))
    ctx = int(row.get("decode_context", 0))
    if scope == "iteration":
        iters = int(row.get("decode_iters", 1))
        dc = np.full(b, ctx, dtype=np.int64)
        if chunks == 0 and b > 0:
            return K.decode_run(p, dc, iters) / iters
        return K.iteration_time(p, np.full(chunks, c, np.int64), np.full(chunks, h, np.int64), dc)
    if scope == "static_batch":  # prefill of the whole batch, then its decode iterations
        first = K.iteration_time(p, np.full(chunks, c, np.int64), np.full(chunks, h, np.int64),
                                 np.zeros(0, np.int64))
        iters = int(row.get("decode_iters", 0))
        return first + K.decode_run(p, np.full(b, ctx, dtype=np.int64), iters)
    if scope == "batch":
        return K.iteration_time(p, np.asarray(row["prefill_list"], np.int64),
                                np.asarray(row["cached_list"], np.int64),
                                np.asarray(row["decode_list"], np.int64))
    peak_f, peak_b = p[K.P_PEAK_FLOPS], p[K.P_PEAK_BW]
    if scope == "layer_linear":  # (2)-(3) plus the per-layer overhead of (8)
        n = c * chunks + b
        t_mem = p[K.P_LIN_BYTES] / (peak_b * p[K.P_EFF_WEIGHTS])
        t_cmp = p[K.P_LIN_FLOPS] * (n + p[K.P_PLATEAU_TOKENS]) / (peak_f * p[K.P_EFF_COMPUTE])
        return max(t_mem, t_cmp) + p[K.P_LAYER_OVERHEAD_S]
    if scope == "layer_prefill_attention":  # (5)
        return chunks * (max(p[K.P_ATTN_FLOPS] * (h + c) * (c + p[K.P_ATTN_PLATEAU])
                                 / (peak_f * p[K.P_EFF_ATTN]),
                                 p[K.P_KV_BYTES] * (h + c) / (peak_b * p[K.P_EFF_KV]))
                             + p[K.P_ATTN_CHUNK_S] + p[K.P_ATTN_TOKEN_S] * c)
    if scope == "layer_decode_attention":  # (6)
        s = float(b * ctx)
        return (max(p[K.P_KV_BYTES] * s / (peak_b * p[K.P_EFF_KV]),
                    p[K.P_ATTN_FLOPS] * s / (peak_f * p[K.P_EFF_ATTN]))
                + p[K.P_ATTN_SEQ_S] * b + p[K.P_ATTN_FIXED_S])
    if scope == "all_reduce":  # (7), one call
        tp = float(row["tp"])
        return (p[K.P_AR_FIXED_S] + p[K.P_AR_LATENCY_S] * np.log2(tp)
                + 2.0 * (tp - 1.0) / tp * float(row["message_bytes"]) / p[K.P_AR_BW])
    raise ValueError(f"unknown row scope {scope!r}")


class _Problem:
    """Rows, bounds and predictions of one fit, over ``z`` in [0, 1]^k (scaled parameters)."""

    def __init__(self, rows: Sequence[dict[str, Any]], gpu: str | GPUSpec, llm: str | LLMSpec,
                 parameters: Iterable[str], base: dict[str, float] | None,
                 dtype: str | None, engine: str | None = None) -> None:
        from lpserve.cost.analytic import AnalyticCost

        self.names = tuple(parameters)
        unknown = set(self.names) - set(BOUNDS)
        if unknown:
            raise ValueError(f"cannot fit {sorted(unknown)}; fittable: {sorted(BOUNDS)}")
        self.rows = list(rows)
        if not self.rows:
            raise ValueError("fit needs at least one measured row")
        for i, r in enumerate(self.rows):
            if not r.get("measured_s", 0) > 0:
                raise ValueError(f"row {i}: measured_s must be > 0, got {r.get('measured_s')!r}")
        if base is None:
            base = dict(AnalyticCost(gpu=gpu, llm=llm, tp=int(self.rows[0].get("tp", 1)),
                                     engine=engine).values)
        self.base = {k: float(v) for k, v in base.items()}
        self.gpu, self.llm, self.dtype, self.engine = gpu, llm, dtype, engine
        self.meas = np.array([float(r["measured_s"]) for r in self.rows])
        self.keys = [(r.get("gpu") or gpu, r.get("llm") or llm, int(r.get("tp", 1)),
                      r.get("dtype") or dtype) for r in self.rows]
        self.lo = np.array([BOUNDS[n][0] for n in self.names])
        self.scale = np.maximum(np.array([BOUNDS[n][1] for n in self.names]) - self.lo, 1e-12)
        self.z0 = np.array([np.clip((self.base[n] - self.lo[i]) / self.scale[i], 1e-6, 1 - 1e-6)
                            for i, n in enumerate(self.names)])

    def values_at(self, z: np.ndarray) -> dict[str, float]:
        v = dict(self.base)
        v.update({n: float(self.lo[i] + self.scale[i] * z[i]) for i, n in enumerate(self.names)})
        return v

    def ratios(self, z: np.ndarray) -> np.ndarray:
        """predicted / measured per row."""
        v = self.values_at(z)
        models = {key: _model(key[0], key[1], key[2], v, key[3], self.engine)
                  for key in set(self.keys)}
        pred = np.array([predict_row(models[key], r) for key, r in zip(self.keys, self.rows)])
        return pred / self.meas

    def rel_errors(self, z: np.ndarray) -> np.ndarray:
        """predicted / measured - 1 per row."""
        return self.ratios(z) - 1.0

    def result(self, z: np.ndarray, success: bool, message: str) -> FitResult:
        return FitResult(values=self.values_at(z), fitted=self.names, n_rows=len(self.rows),
                         rel_errors=self.rel_errors(z), success=success, message=message)

    def least_squares(self, power: float) -> Any:
        from scipy.optimize import least_squares

        def residuals(z: np.ndarray) -> np.ndarray:
            r = np.log(self.ratios(z))
            return r if power == 2.0 else np.sign(r) * np.abs(r) ** (power / 2.0)

        return least_squares(residuals, self.z0, bounds=(0.0, 1.0), x_scale="jac", method="trf")


def fit(rows: Sequence[dict[str, Any]], gpu: str | GPUSpec, llm: str | LLMSpec, *,
        parameters: Iterable[str], base: dict[str, float] | None = None,
        dtype: str | None = None, power: float = 2.0,
        max_rel_error: float | None = None, engine: str | None = None) -> FitResult:
    """Least-squares fit of ``parameters`` so predictions match ``rows``.

    Minimises the sum of ``|log(predicted / measured)| ** power`` (relative errors weigh
    every row alike) with ``scipy.optimize.least_squares`` within :data:`BOUNDS`.
    ``power=2`` (the default) is ordinary least squares on log-ratios; larger powers weigh
    the worst rows more. ``max_rel_error`` (e.g. 0.29) adds the constraint
    ``|predicted / measured - 1| <= max_rel_error`` on every row (SLSQP, started from the
    unconstrained fit); a ``ValueError`` says so when no parameters within the bounds meet
    it (:func:`fit_minimax` gives the smallest reachable worst error).
    ``base`` gives the values of every parameter not fitted (default: the catalog's
    calibration for the pair). Each row's ``tp`` selects the tensor-parallel degree and
    its ``dtype`` (else ``dtype``) the served dtype; ``engine`` the engine whose defaults
    (communication) apply to parameters ``base`` does not give.
    """
    if not (np.isfinite(power) and power >= 1.0):
        raise ValueError(f"power must be a finite number >= 1, got {power!r}")
    if max_rel_error is not None and not (np.isfinite(max_rel_error) and max_rel_error > 0):
        raise ValueError(f"max_rel_error must be a finite number > 0, got {max_rel_error!r}")
    pb = _Problem(rows, gpu, llm, parameters, base, dtype, engine)
    res = pb.least_squares(power)
    if max_rel_error is None or np.abs(pb.rel_errors(res.x)).max() <= max_rel_error:
        return pb.result(res.x, bool(res.success), str(res.message))
    from scipy.optimize import minimize

    band = float(max_rel_error)
    def within_band(z: np.ndarray) -> np.ndarray:  # both sides: one prediction per point
        e = pb.rel_errors(z)
        return np.concatenate([band - e, band + e])

    cons = [{"type": "ineq", "fun": within_band}]
    out = minimize(lambda z: float(np.sum(np.abs(np.log(pb.ratios(z))) ** power)), res.x,
                   method="SLSQP", bounds=[(0.0, 1.0)] * len(pb.names), constraints=cons,
                   options={"maxiter": 500, "ftol": 1e-10})
    worst = np.abs(pb.rel_errors(out.x))
    if worst.max() > band + 1e-6:
        i = int(np.argmax(worst))
        raise ValueError(f"no {', '.join(pb.names)} within BOUNDS keep every row within "
                         f"+-{band:.1%}: the constrained fit leaves row {i} "
                         f"({pb.rows[i].get('point', '')}) at {worst[i]:.1%} ({out.message})")
    return pb.result(out.x, bool(out.success), f"within +-{band:.1%}: {out.message}")


def fit_minimax(rows: Sequence[dict[str, Any]], gpu: str | GPUSpec, llm: str | LLMSpec, *,
                parameters: Iterable[str], base: dict[str, float] | None = None,
                dtype: str | None = None, engine: str | None = None) -> FitResult:
    """Fit of ``parameters`` with the smallest worst ``|predicted / measured - 1|`` over ``rows``.

    Solves min s subject to -s <= predicted / measured - 1 <= s on every row (SLSQP on the
    epigraph form, started from the least-squares fit), within :data:`BOUNDS`. A local
    method: the result is an upper bound on the best worst error of the model form.
    """
    from scipy.optimize import minimize

    pb = _Problem(rows, gpu, llm, parameters, base, dtype, engine)
    z = pb.least_squares(2.0).x
    k = len(pb.names)
    x0 = np.r_[z, np.abs(pb.rel_errors(z)).max()]
    def within_s(x: np.ndarray) -> np.ndarray:  # both sides: one prediction per point
        e = pb.rel_errors(x[:k])
        return np.concatenate([x[k] - e, x[k] + e])

    cons = [{"type": "ineq", "fun": within_s}]
    out = minimize(lambda x: x[k], x0, method="SLSQP", constraints=cons,
                   bounds=[(0.0, 1.0)] * k + [(0.0, None)], options={"maxiter": 500})
    best = out.x[:k] if np.abs(pb.rel_errors(out.x[:k])).max() < x0[k] else z
    return pb.result(best, bool(out.success), str(out.message))


# ---- the project's own calibrations ---------------------------------------------------

def calibrate(data: Any = None) -> list[dict[str, Any]]:
    """Refit every calibration entry of ``fitted.toml`` from the shipped data.

    Returns the entries (dicts with ``name``, ``gpu``, ``llm``, ``engine``, the parameter
    values and ``provenance``). ``data`` is a :class:`lpserve.cost.data.CalibrationData`
    (default: the copies inside the package). Steps (``models/cost-model.md``,
    Calibration): 1. NCCL on DGX-A100 (the ``nvlink3`` row of ``links.toml``); 2. Vidur's
    A100 operator profile (engine ``kernels``); 3. Splitwise medians (``vllm``); 4. NeMo's
    and TensorRT-LLM's published latencies (``trtllm``); 5. SGLang on B200 (``sglang``).
    Communication parameters are stored only where the fit's rows identify them (several
    tensor-parallel degrees); the others come from ``links.toml``.
    """
    from lpserve.cost import data as D
    from lpserve.cost.analytic import CALIBRATED, link_defaults
    from lpserve.cost.catalog import get_gpu

    data = data or D.CalibrationData.packaged()
    today = _dt.date.today().isoformat()
    hw = ("eff_compute", "eff_weights", "plateau_tokens", "layer_overhead_s")
    attn = ("eff_attn", "attn_plateau_tokens", "eff_kv", "attn_seq_s", "attn_fixed_s", "attn_chunk_s",
            "attn_token_s")
    start = {"eff_compute": 0.7, "eff_weights": 0.75, "plateau_tokens": 50.0, "eff_attn": 0.4,
             "attn_plateau_tokens": 500.0, "eff_kv": 0.8, "attn_seq_s": 5e-6, "attn_fixed_s": 5e-6,
             "multi_prompt_token_s": 0.0, "attn_chunk_s": 5e-6, "attn_token_s": 1e-7,
             "ar_fixed_s": 0.0, "ar_latency_s": 5e-5, "ar_link_efficiency": 0.6,
             "a2a_fixed_s": 0.0, "a2a_link_efficiency": 0.5, "layer_overhead_s": 3e-5,
             "iter_overhead_s": 0.0, "seq_overhead_s": 0.0}
    entries = []

    def entry(name, gpu, llm, engine, values, used, res, note, comm=()):
        e = {"name": name, "gpu": gpu, "llm": llm, "engine": engine}
        keep = sorted(set(CALIBRATED) | set(comm))
        # a bound reached up to solver round-off (e.g. 4e-20 for 0) is stored as the bound
        e.update({k: 0.0 if abs(values[k]) < 1e-15 else float(f"{values[k]:.6g}") for k in keep})
        e["provenance"] = {
            "data": used, "date": today, "note": note, "rows": res.n_rows,
            "fitted": list(res.fitted),
            "median_abs_error": round(res.median_abs_error, 4),
            "max_abs_error": round(res.max_abs_error, 4),
        }
        return e

    def base_for(values: dict[str, float], gpu: str, engine: str) -> dict[str, float]:
        """Calibrated values with the interconnect's communication defaults for the engine."""
        return {**{k: values[k] for k in CALIBRATED}, **link_defaults(get_gpu(gpu), engine)}

    # 1. NCCL all-reduce on DGX-A100 -> latency per step and link efficiency (links.toml nvlink3)
    ar_rows = data.all_reduce_rows()
    r_ar = fit(ar_rows, "a100-80gb", "llama-2-7b", parameters=("ar_latency_s", "ar_link_efficiency"),
               base=start, engine="kernels")
    start.update({k: r_ar.values[k] for k in r_ar.fitted})
    # 2. Vidur A100 operator profile -> A100 kernel efficiencies (no engine overhead)
    op_rows = data.vidur_linear_rows() + data.vidur_attention_rows()
    r_v = fit(op_rows, "a100-80gb", "llama-2-7b", parameters=hw + attn, base=start, engine="kernels")
    a100 = dict(r_v.values)
    used_v = ("vidur_a100_llama2_7b_linear_ops_summary.csv, vidur_a100_llama2_7b_*_attention_tp1.csv, "
              "nccl_a100_dgx_all_reduce_summary.csv")
    note_v = ("A100 kernel times from Vidur's operator profile; no engine overhead "
              "(iteration and sequence overheads 0); all-reduce: NCCL on DGX-A100, the nvlink3 "
              f"row of links.toml (fit median error {r_ar.median_abs_error:.3f})")
    entries.append(entry("vidur-a100", "a100", "*", "kernels", a100, used_v, r_v, note_v))
    entries.append(entry("default", "*", "*", "kernels", a100, used_v, r_v,
                         "A100 efficiencies (fractions of peak) applied to a GPU with no "
                         "calibration; communication from its interconnect (links.toml)"))
    # 3. Splitwise end-to-end medians -> vLLM-based engine fits per (gpu, llm), on even rows
    for llm, hwkey, gpu in SPLITWISE_GROUPS:
        rows = data.splitwise_rows(llm=llm, hardware=hwkey)
        train = [r for r in rows if r["fit_split"] == "train" and not r["excluded"]]
        params = engine_parameters(train)
        r_s = fit(train, gpu, llm, parameters=params, base=base_for(a100, gpu, "vllm"),
                  max_rel_error=MAX_REL_ERROR, engine="vllm")
        tag = "a100" if gpu.startswith("a100") else "h100"
        comm = [k for k in params if k not in CALIBRATED]
        note = ("Splitwise end-to-end medians (vLLM-based engine, fp16); least squares on "
                "every other row (fit_split=train) with every train row held within "
                f"+-{MAX_REL_ERROR:.0%}; the rest held out")
        if not comm:
            note += "; one tensor-parallel degree, so all-reduce latency from links.toml"
        entries.append(entry(f"splitwise-{tag}-{llm}", gpu, llm, "vllm", r_s.values,
                             "splitwise_perf_model_medians.csv", r_s, note, comm))
        if tag == "a100" and llm == "llama-2-70b":
            entries.append(entry("splitwise-a100", "a100", "*", "vllm", r_s.values,
                                 "splitwise_perf_model_medians.csv", r_s,
                                 "A100 Llama-2-70B engine fit applied to other models on A100",
                                 comm))
            entries.append(entry("vllm-default", "*", "*", "vllm", r_s.values,
                                 "splitwise_perf_model_medians.csv", r_s,
                                 "A100 Llama-2-70B engine fit (fractions of peak, overheads) "
                                 "applied to a GPU with no vLLM calibration; communication from "
                                 "its interconnect (links.toml)"))
        if tag == "h100":
            # BLOOM's attention (ALiBi, no FlashAttention in that engine) is not typical:
            # other models on Hopper keep the FlashAttention efficiency of the A100 profile
            hopper = dict(r_s.values, eff_attn=a100["eff_attn"])
            entries.append(entry("splitwise-h100", "h100", "*", "vllm", hopper,
                                 "splitwise_perf_model_medians.csv", r_s,
                                 "H100 BLOOM-176B engine fit applied to other models on Hopper, "
                                 "with the FlashAttention efficiency (eff_attn) of vidur-a100"))
    # 4. TensorRT-LLM: NeMo's Llama-2 latencies (TP 1-8, one release, fp16); TRT-LLM v0.5's
    # first-token times (another release, FP8 on H100) stay held out as validation points
    trt = [r for r in data.nemo_rows() if not r["excluded"]]
    trt_params = ("eff_compute", "eff_weights", "plateau_tokens", "layer_overhead_s",
                  "iter_overhead_s", "seq_overhead_s", "ar_fixed_s", "ar_latency_s")
    fits = {}
    for tag, gpu in (("a100", "a100-80gb"), ("h100", "h100-sxm")):
        train = [r for r in trt if r["gpu"] == gpu and r["fit_split"] == "train"]
        fits[tag] = fit(train, gpu, "llama-2-7b", parameters=engine_parameters(train, trt_params),
                        base=base_for(a100, gpu, "trtllm"), engine="trtllm")
        held = "; H100 batch-1 rows held out" if tag == "h100" else ""
        entries.append(entry(f"trtllm-{tag}", tag, "*", "trtllm", fits[tag].values,
                             "nemo_trtllm_llama2_inference.csv", fits[tag],
                             "NeMo Framework TensorRT-LLM latencies of Llama-2-7B (TP 1-8, batch "
                             f"1-8, 128 in / 20 out); least squares{held}",
                             ("ar_fixed_s", "ar_latency_s")))
    entries.append(entry("trtllm-default", "*", "*", "trtllm", fits["h100"].values,
                         "nemo_trtllm_llama2_inference.csv",
                         fits["h100"], "H100 TensorRT-LLM fit (fractions of peak, overheads) "
                         "applied to a GPU with no TensorRT-LLM calibration; communication from "
                         "its interconnect (links.toml)"))
    # 5. SGLang: decode at concurrency 1 on 8 x B200 (gpt-oss-120b; Qwen3-235B held out)
    sgl = [r for r in data.sglang_rows() if r["fit_split"] == "train"]
    vllm_default = next(e for e in entries if e["name"] == "vllm-default")
    r_g = fit(sgl, "b200", "gpt-oss-120b", parameters=("layer_overhead_s",),
              base=base_for(vllm_default, "b200", "sglang"), engine="sglang")
    note_g = ("SGLang TPOT at concurrency 1 on 8 x B200 (gpt-oss-120b, TP 8): the per-layer "
              "overhead on top of the vllm-default efficiencies; Qwen3-235B-A22B held out")
    entries.append(entry("sglang-b200", "b200", "*", "sglang", r_g.values,
                         "sglang_b200_tpot_c1.csv", r_g, note_g))
    entries.append(entry("sglang-default", "*", "*", "sglang", r_g.values,
                         "sglang_b200_tpot_c1.csv", r_g,
                         "the B200 SGLang fit applied to a GPU with no SGLang calibration"))
    return entries


def write_fitted(entries: list[dict[str, Any]], path: Any = None) -> str:
    """Write calibration entries as TOML (to ``path`` when given); returns the text."""
    lines = ["# Fitted cost-model calibrations; regenerate with `python -m lpserve.cost.fit`.",
             "# Lookup order: (gpu key, llm), (gpu family, llm), (gpu, *), (family, *), (*, *).",
             ""]

    def fmt(v: Any) -> str:
        if isinstance(v, str):
            return '"' + v.replace('"', "'") + '"'
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return repr(v)

    for e in entries:
        lines.append("[[calibration]]")
        lines += [f"{k} = {fmt(v)}" for k, v in e.items() if k != "provenance"]
        lines.append("[calibration.provenance]")
        lines += [f"{k} = {fmt(v)}" for k, v in e["provenance"].items()]
        lines.append("")
    text = "\n".join(lines)
    if path is not None:
        from pathlib import Path

        Path(path).write_text(text)
    return text


if __name__ == "__main__":  # pragma: no cover
    from importlib import resources

    target = resources.files("lpserve") / "data" / "calibration" / "fitted.toml"
    out = calibrate()
    write_fitted(out, str(target))
    for e in out:
        pv = e["provenance"]
        print(f"{e['name']:32s} rows={pv['rows']:4d} median={pv['median_abs_error']:.3f} "
              f"max={pv['max_abs_error']:.3f}")
