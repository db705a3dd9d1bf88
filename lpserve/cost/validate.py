"""Predicted vs measured for every calibration point (used by the validation benchmark)."""
from __future__ import annotations

from typing import Any

import numpy as np


def validation_table(source: str | None = None) -> Any:
    """A pandas DataFrame, one row per measured point, predicted by the catalog models.

    ``source``: a calibration folder in its original layout (e.g. ``../shared/calibration``);
    ``None`` uses the copies inside the package. Columns: ``point``, ``source``, ``phase``
    (``prefill``, ``decode`` or ``comm``), ``scope``, ``gpu``, ``llm``, ``tp``,
    ``measured_ms``, ``predicted_ms``, ``rel_error`` (predicted / measured - 1),
    ``fit_split`` (``train``: used by the fit of the calibration that predicts it;
    ``test``: held out) and ``excluded`` (the source flags the point as anomalous).
    """
    import pandas as pd

    from lpserve.cost.analytic import AnalyticCost
    from lpserve.cost.data import CalibrationData
    from lpserve.cost.fit import predict_row

    data = CalibrationData.packaged() if source is None else CalibrationData.from_shared(source)
    models: dict[tuple, AnalyticCost] = {}
    out = []
    for r in data.all_rows():
        key = (r["gpu"], r["llm"], int(r["tp"]), r.get("dtype"))
        if key not in models:
            kw = {"dtype": key[3]} if key[3] else {}
            models[key] = AnalyticCost(gpu=key[0], llm=key[1], tp=key[2], **kw)
        pred = predict_row(models[key], r)
        out.append({
            "point": r["point"], "source": r["source"], "phase": r["phase"],
            "scope": r["scope"], "gpu": r["gpu"], "llm": r["llm"], "tp": int(r["tp"]),
            "calibration": models[key].calibration.get("name"),
            "measured_ms": r["measured_s"] * 1e3, "predicted_ms": pred * 1e3,
            "rel_error": pred / r["measured_s"] - 1.0,
            "fit_split": r.get("fit_split", "train"), "excluded": bool(r.get("excluded", False)),
        })
    return pd.DataFrame(out)


def summary(table: Any) -> dict[str, dict[str, float]]:
    """Median and max |relative error| per phase, over all and over held-out points."""
    t = table[~table["excluded"]]
    out = {}
    for phase in ("prefill", "decode", "comm"):
        for split, sub in (("all", t[t.phase == phase]),
                           ("test", t[(t.phase == phase) & (t.fit_split == "test")])):
            if len(sub):
                e = np.abs(sub["rel_error"].to_numpy())
                out[f"{phase}/{split}"] = {"n": int(len(sub)), "median_abs": float(np.median(e)),
                                           "max_abs": float(np.max(e))}
    return out
