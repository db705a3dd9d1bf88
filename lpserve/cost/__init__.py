"""The GPU cost model: per-iteration batch time, KV sizes, swap and transfer times.

Three models share the :class:`CostModel` interface:

- :func:`cost_model` / :class:`AnalyticCost`: a calibrated roofline of a catalog GPU x LLM
  at tensor-parallel degree 1/2/4/8 (``models/cost-model.md``);
- :class:`TableCost`: interpolation of a measured per-layer profile;
- :class:`UnitRoundCost`: every iteration takes one time unit (the theory papers' GPU).

Each exposes ``params`` (flat float64) and ``kind`` so numba code can call the kernel
:func:`iteration_time` ``(params, prefill_tokens, prefill_cached, decode_context)``
directly (its plain-Python twin is :func:`iteration_time_ref`); a kernel pricing many
prefill plans beside one decode batch sums the batch once (:func:`decode_sums`) and calls
:func:`iteration_time_sums`.
"""
from __future__ import annotations

from typing import Any

from lpserve.cost._kernels import (
    context_sum,
    decode_sums,
    decode_time_at,
    iteration_time,
    iteration_time_ref,
    iteration_time_sums,
)
from lpserve.cost.analytic import AnalyticCost
from lpserve.cost.base import CostModel
from lpserve.cost.calibration import calibration_for, calibrations, load_calibration_file
from lpserve.cost.catalog import (
    GPUSpec,
    LLMSpec,
    get_gpu,
    get_llm,
    gpu_names,
    llm_from_hf_config,
    llm_names,
    load_catalog_file,
    register_gpu,
    register_llm,
)
from lpserve.cost.links import engine_names, get_engine, get_link
from lpserve.cost.table import TableCost, UnitRoundCost

__all__ = [
    "AnalyticCost", "CostModel", "GPUSpec", "LLMSpec", "TableCost", "UnitRoundCost",
    "calibration_for", "calibrations", "cost_model", "cost_model_for", "cost_models_for",
    "context_sum", "decode_sums", "decode_time_at", "engine_names", "fit", "get_engine", "get_gpu", "get_link", "get_llm",
    "gpu_names", "iteration_time", "iteration_time_ref", "iteration_time_sums",
    "llm_from_hf_config", "llm_names",
    "load_calibration_file", "load_catalog_file",
    "register_gpu", "register_llm", "validation_table",
]


def cost_model(gpu: str | GPUSpec = "a100-80gb", llm: str | LLMSpec = "llama-2-7b", tp: int = 1,
               engine: str | None = None, **overrides: Any) -> AnalyticCost:
    """The calibrated analytic cost model of one replica (see :class:`AnalyticCost`).

    ``engine``: ``"vllm"``, ``"trtllm"``, ``"sglang"`` or ``"kernels"`` (the engine the model
    stands for; ``None`` keeps the package's default calibration); ``calibration=PATH``
    loads a TOML file written by ``lpserve calibrate``.
    """
    return AnalyticCost(gpu=gpu, llm=llm, tp=tp, engine=engine, **overrides)


def cost_model_for(cluster: Any, **overrides: Any) -> AnalyticCost:
    """The cost model of one replica of a homogeneous ``cluster`` (an
    :class:`lpserve.Cluster`); a heterogeneous one raises (use :func:`cost_models_for`)."""
    if cluster.heterogeneous:
        raise ValueError(f"cluster {cluster.describe()} is heterogeneous: its replicas have "
                         "different cost models; use cost_models_for(cluster)")
    return AnalyticCost(gpu=cluster.gpu, llm=cluster.llm, tp=cluster.tp, **overrides)


def cost_models_for(cluster: Any, **overrides: Any) -> list[AnalyticCost]:
    """One cost model per replica of ``cluster``, in replica order (replicas of the same
    GPU type and TP share one object)."""
    made: dict[tuple[str, int], AnalyticCost] = {}
    out = []
    for gpu, tp in cluster.replica_types():
        if (gpu, tp) not in made:
            made[(gpu, tp)] = AnalyticCost(gpu=gpu, llm=cluster.llm, tp=tp, **overrides)
        out.append(made[(gpu, tp)])
    return out


def fit(*args: Any, **kwargs: Any):
    """Fit calibrated parameters to measured rows; see :func:`lpserve.cost.fit.fit`."""
    from lpserve.cost.fit import fit as _fit

    return _fit(*args, **kwargs)


def validation_table(source: str | None = None):
    """Predicted vs measured for every calibration point; see :mod:`lpserve.cost.validate`."""
    from lpserve.cost.validate import validation_table as _vt

    return _vt(source)
