"""Predicted vs measured for every calibration point (used by the validation benchmark)."""
from __future__ import annotations

from typing import Any

import numpy as np

PHASES = ("prefill", "decode", "request", "comm")


def validation_table(source: str | None = None) -> Any:
    """A pandas DataFrame, one row per measured point, predicted by the catalog models.

    ``source``: a calibration folder in its original layout (e.g. ``../shared/calibration``);
    ``None`` uses the copies inside the package. Each point is predicted under the engine
    profile of the engine that measured it (``engine``: ``kernels`` for operator profiles,
    ``vllm``, ``trtllm``, ``sglang``; empty where lpserve has no profile of that engine,
    predicted with the default calibration). Columns: ``point``, ``source``, ``engine``,
    ``phase`` (``prefill``, ``decode``, ``request`` for whole static batches, ``comm``),
    ``scope``, ``gpu``, ``llm``, ``tp``, ``calibration``, ``era`` (the engine era that
    calibration models, :func:`lpserve.cost.calibration.era_of`), ``measured_ms``,
    ``predicted_ms``, ``rel_error`` (predicted / measured - 1), ``fit_split`` (``train``:
    used by the fit of the calibration that predicts it; ``test``: held out) and
    ``excluded`` (the source, or a physical bound, flags the point as anomalous).
    """
    import pandas as pd

    from lpserve.cost.analytic import AnalyticCost
    from lpserve.cost.calibration import era_of
    from lpserve.cost.data import CalibrationData
    from lpserve.cost.fit import predict_row

    data = CalibrationData.packaged() if source is None else CalibrationData.from_shared(source)
    models: dict[tuple, AnalyticCost] = {}
    out = []
    for r in data.all_rows():
        key = (r["gpu"], r["llm"], int(r["tp"]), r.get("dtype"), r.get("engine"))
        if key not in models:
            kw = {"dtype": key[3]} if key[3] else {}
            models[key] = AnalyticCost(gpu=key[0], llm=key[1], tp=key[2], engine=key[4], **kw)
        pred = predict_row(models[key], r)
        out.append({
            "point": r["point"], "source": r["source"], "engine": r.get("engine") or "",
            "phase": r["phase"], "scope": r["scope"], "gpu": r["gpu"], "llm": r["llm"],
            "tp": int(r["tp"]), "calibration": models[key].calibration.get("name"),
            "era": era_of(models[key].calibration),
            "measured_ms": r["measured_s"] * 1e3, "predicted_ms": pred * 1e3,
            "rel_error": pred / r["measured_s"] - 1.0,
            "fit_split": r.get("fit_split", "train"), "excluded": bool(r.get("excluded", False)),
        })
    return pd.DataFrame(out)


def _stats(sub: Any) -> dict[str, float]:
    e = np.abs(sub["rel_error"].to_numpy())
    return {"n": int(len(sub)), "median_abs": float(np.median(e)), "max_abs": float(np.max(e))}


def summary(table: Any) -> dict[str, dict[str, float]]:
    """Median and max |relative error| per phase, over all and over held-out points."""
    t = table[~table["excluded"]]
    out = {}
    for phase in PHASES:
        for split, sub in (("all", t[t.phase == phase]),
                           ("test", t[(t.phase == phase) & (t.fit_split == "test")])):
            if len(sub):
                out[f"{phase}/{split}"] = _stats(sub)
    return out


def summary_by_engine(table: Any) -> dict[str, dict[str, float]]:
    """Median and max |relative error| per engine profile (``engine/all``, ``engine/test``),
    communication rows left out."""
    t = table[~table["excluded"] & (table.phase != "comm")]
    out = {}
    for engine in sorted(set(t["engine"])):
        name = engine or "none (default)"
        for split, sub in (("all", t[t.engine == engine]),
                           ("test", t[(t.engine == engine) & (t.fit_split == "test")])):
            if len(sub):
                out[f"{name}/{split}"] = _stats(sub)
    return out
