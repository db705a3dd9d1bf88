"""Fit the vLLM V1-era H100 profile to the train split of the bundled public serving runs
and write ``lpserve/data/calibration/serving.toml``.

    python scripts/fit_serving_profile.py [--max-stage-s 150] [--evaluations 80]

The fit (:func:`lpserve.evaluate.serving_fit.fit_serving`) simulates the ``general`` runs
(``lpserve.evaluate.sim_to_real.TRAIN_PROFILES``: Llama-2-7B TP1, Llama-2-70B TP4,
Mixtral-8x7B TP2, CodeLlama-34B TP2 at 8 and 20 requests/s), each stage cut to its first
``--max-stage-s`` seconds, and matches their mean E2E and mean inter-token latency; then
fits the serving front end's latency to their full-length mean TTFT and E2E. It starts from the Splitwise-era H100 profile (``splitwise-h100``), whose other parameters
the new profile keeps. The validation stages are never simulated here: check them with
``python benchmarks/sim_to_real.py``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

import numpy as np

from lpserve.cost.calibration import named_calibration
from lpserve.evaluate.serving_fit import fit_serving
from lpserve.evaluate.sim_to_real import TRAIN_PROFILES, split_of
from lpserve.trace.serving_runs import bundled_serving_runs

PARAMS = ("eff_weights", "eff_kv", "attn_seq_s", "layer_overhead_s", "iter_overhead_s",
          "seq_overhead_s")
BASE = "splitwise-h100"
OUT = Path(__file__).resolve().parents[1] / "lpserve" / "data" / "calibration" / "serving.toml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-stage-s", type=float, default=150.0)
    ap.add_argument("--evaluations", type=int, default=80)
    args = ap.parse_args()
    train = [s for s in bundled_serving_runs() if split_of(s) == "train"]
    t0 = time.perf_counter()
    fit = fit_serving(train, params=PARAMS, calibration=BASE, max_stage_s=args.max_stage_s,
                      max_evaluations=args.evaluations)
    wall = time.perf_counter() - t0
    err = fit.errors()
    print(f"fitted {', '.join(PARAMS)} on {len(train)} train stages in {wall:.0f} s "
          f"({fit.evaluations} simulations of the cut stages)")
    for k, v in fit.values.items():
        print(f"  {k:18s} {fit.start[k]:.6g} -> {v:.6g}")
    for when in ("before", "after"):
        print(f"  train MAPE {when:6s}: " + ", ".join(f"{k} {v:.1f} %"
                                                      for k, v in err[when].items()))
    apes = fit.abs_errors()
    base = named_calibration(BASE)
    keep = {k: v for k, v in base.items() if k not in ("name", "gpu", "llm", "engine",
                                                        "provenance")}
    keep.update(fit.values)
    lines = [
        "# Calibrations fitted to serving benchmarks by simulating their workloads;",
        "# regenerate with `python scripts/fit_serving_profile.py`. Looked up before",
        "# fitted.toml (lpserve/cost/calibration.py: CALIBRATION_FILES).",
        "",
        "[[calibration]]",
        'name = "vllm-v1-h100"',
        'gpu = "h100"',
        'llm = "*"',
        'engine = "vllm"',
        'era = "vLLM V1 engine (2026: CUDA graphs, chunked prefill, prefix caching)"',
    ]
    lines += [f"{k} = {v:.6g}" for k, v in sorted(keep.items())]
    lines += [
        "[calibration.provenance]",
        'data = "lpserve/data/serving/inference_sim_h100_vllm.json, stages of the '
        f'{"/".join(TRAIN_PROFILES)} runs"',
        f'date = "{dt.date.today().isoformat()}"',
        f'note = "vLLM V1 on H100 SXM, served by inference-perf; fitted by simulating each '
        f"train stage's first {args.max_stage_s:g} s and matching e2e_s.mean, itl_s.mean, "
        "then frontend_latency_s to the full stages' ttft_s.mean, e2e_s.mean; "
        f'other parameters from {BASE}; validation stages held out (benchmarks/sim_to_real.py)"',
        f"rows = {len(train)}",
        f"fitted = {list(fit.values)!r}".replace("'", '"'),
        f"median_abs_error = {float(np.median(apes)):.4f}",
        f"max_abs_error = {float(np.max(apes)):.4f}",
        f"train_mape_e2e = {err['after']['e2e_s.mean'] / 100:.4f}",
        f"train_mape_itl = {err['after']['itl_s.mean'] / 100:.4f}",
        f"train_mape_ttft = {err['after']['ttft_s.mean'] / 100:.4f}",
        "",
    ]
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
