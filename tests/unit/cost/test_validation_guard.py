"""Regression guards on the shipped calibration: it is what ``python -m lpserve.cost.fit``
produces from the packaged data, and it keeps every packaged measured point within the
validation band (median <= 10 %, worst <= 30 % for prefill and decode)."""
from __future__ import annotations

import pytest

from lpserve.cost.analytic import AnalyticCost, calibrations
from lpserve.cost.fit import calibrate
from lpserve.cost.validate import summary, validation_table


def test_fitted_toml_is_what_calibrate_produces():
    """Refitting gives the shipped entries: same rows, parameters fitted and notes, and the
    same predictions within 1 % (the fits have flat directions, so parameters are compared
    through what they predict)."""
    shipped = {e["name"]: e for e in calibrations()}
    batches = [([512], [0], []), ([2048], [0], []), ([512] * 4, [0] * 4, []),
               ([], [], [1000]), ([], [], [1000] * 32), ([256], [0], [800] * 8)]
    for e in calibrate():
        s = shipped[e["name"]]
        assert (s["gpu"], s["llm"]) == (e["gpu"], e["llm"])
        for pk in ("rows", "fitted", "note", "data"):
            assert s["provenance"][pk] == e["provenance"][pk], (e["name"], pk)
        for pk in ("median_abs_error", "max_abs_error"):
            assert s["provenance"][pk] == pytest.approx(e["provenance"][pk], abs=0.005)
        llm = "llama-2-7b" if e["llm"] == "*" else e["llm"]
        gpu = {"a100": "a100-80gb", "h100": "h100-sxm", "*": "a100-80gb"}.get(e["gpu"], e["gpu"])
        tp = 8 if llm == "bloom-176b" else 4 if llm == "llama-2-70b" else 1
        keys = [k for k in e if k not in ("name", "gpu", "llm", "provenance")]
        new = AnalyticCost(gpu=gpu, llm=llm, tp=tp, **{k: e[k] for k in keys})
        old = AnalyticCost(gpu=gpu, llm=llm, tp=tp, **{k: s[k] for k in keys})
        for b in batches:
            assert new.batch_time_s(*b) == pytest.approx(old.batch_time_s(*b), rel=0.01), \
                (e["name"], b)


def test_packaged_points_within_the_validation_band():
    s = summary(validation_table())
    for phase in ("prefill", "decode"):
        assert s[f"{phase}/all"]["median_abs"] <= 0.10, phase
        assert s[f"{phase}/all"]["max_abs"] <= 0.30, phase
