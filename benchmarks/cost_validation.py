"""Validation of the calibrated cost model against every measured point.

For each point of the calibration data (Vidur operator profiles, NCCL all-reduce,
Splitwise end-to-end medians, NeMo's TensorRT-LLM latencies, SGLang on B200) and the
published points of the reference (lmdeploy, TensorRT-LLM, DistServe), prints predicted vs
measured and the relative error, each point predicted under the profile of the engine that
measured it, then the median and max |error| for prefill, decode, whole requests and
communication, over all points and over points held out of every fit, and per engine
profile.

    python benchmarks/cost_validation.py [--source ../shared/calibration] [--quiet]

Without ``--source`` it reads the shared calibration folder beside the repository
(``../shared/calibration``, or ``$LPSERVE_SHARED/calibration``) when present and otherwise
the copies inside the package (``lpserve/data/calibration``).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from lpserve.cost import validation_table
from lpserve.cost.validate import summary, summary_by_engine

SHARED = Path(os.environ.get("LPSERVE_SHARED",
                            Path(__file__).resolve().parents[2] / "shared")) / "calibration"


def tp_scaling_table() -> None:
    """NeMo's TensorRT-LLM Llama-2-7B latencies on H100 (batch 1, 128 in / 20 out; held
    out of the trtllm fit) beside the predictions of every profile."""
    from lpserve.cost import cost_model
    from lpserve.cost.data import CalibrationData

    rows = {r["tp"]: r for r in CalibrationData.packaged().nemo_rows()
            if r["llm"] == "llama-2-7b" and r["gpu"] == "h100-sxm" and r["prefill_chunks"] == 1}
    print("\nLlama-2-7B on H100, batch 1, 128 input + 20 output tokens (ms): NeMo's TensorRT-LLM "
          "measurement vs each profile")
    engines = ("trtllm", "vllm", "sglang", None)
    print(f"  {'TP':>3s} {'measured':>9s} " + " ".join(f"{str(e or 'default'):>16s}" for e in engines))
    for tp in sorted(rows):
        meas = rows[tp]["measured_s"] * 1e3
        cells = []
        for e in engines:
            m = cost_model(gpu="h100-sxm", llm="llama-2-7b", tp=tp, engine=e)
            t = (m.batch_time_s([128], [0], []) + m.decode_run_s([129], 19)) * 1e3
            cells.append(f"{t:7.1f} ({100 * (t / meas - 1):+5.1f}%)")
        print(f"  {tp:3d} {meas:9.1f} " + " ".join(f"{c:>16s}" for c in cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=None, help="calibration folder (original layout)")
    ap.add_argument("--packaged", action="store_true", help="use the package's copies")
    ap.add_argument("--quiet", action="store_true", help="print only the summary")
    args = ap.parse_args()
    source = None if args.packaged else (args.source or (str(SHARED) if SHARED.exists() else None))
    t = validation_table(source)
    print(f"data: {source or 'lpserve/data/calibration (packaged copies)'}; {len(t)} points")
    if not args.quiet:
        print(f"{'point':58s} {'calibration':28s} {'measured':>11s} {'predicted':>11s} "
              f"{'error':>8s}  split")
        for r in t.itertuples():
            flag = "  EXCLUDED (flagged anomalous)" if r.excluded else ""
            print(f"{r.point:58s} {r.calibration:28s} {r.measured_ms:9.4g}ms {r.predicted_ms:9.4g}ms "
                  f"{100 * r.rel_error:+7.1f}%  {r.fit_split}{flag}")
    print("\nsummary (|predicted / measured - 1|, excluded points left out)")
    for key, v in summary(t).items():
        print(f"  {key:14s} n={v['n']:4d}  median {100 * v['median_abs']:5.1f}%  "
              f"max {100 * v['max_abs']:6.1f}%")
    print("\nper engine profile (prefill, decode and request points)")
    for key, v in summary_by_engine(t).items():
        print(f"  {key:22s} n={v['n']:4d}  median {100 * v['median_abs']:5.1f}%  "
              f"max {100 * v['max_abs']:6.1f}%")
    print("\nprofiles that predicted the points, with the engine era each models")
    for name, sub in t.groupby("calibration", sort=True):
        print(f"  {name:28s} {sub['era'].iloc[0]:55s} n={len(sub):4d}")
    kept = t[~t.excluded & (t.phase != "comm")]
    worse = kept[kept.rel_error.abs() > 0.30]
    print(f"  prefill+decode+request points worse than 30%: {len(worse)} of {len(kept)}")
    for r in worse.itertuples():
        print(f"    {r.point} {100 * r.rel_error:+.1f}%")
    tp_scaling_table()
    s = summary(t)
    ok = all(s[f"{ph}/all"]["median_abs"] <= 0.10 for ph in ("prefill", "decode", "request"))
    ok = ok and len(worse) == 0
    print("targets (median <= 10% for prefill, decode and requests, no point worse than 30%):",
          "met" if ok else "MISSED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
