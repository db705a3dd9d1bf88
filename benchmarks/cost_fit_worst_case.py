"""How the worst error of the engine-level cost fits trades against the median, on the
Splitwise medians.

For each Splitwise group (model x hardware) it refits the engine parameters
(``lpserve.cost.fit.engine_parameters``) several ways and prints the median and worst
|predicted / measured - 1| over every row, with the worst point:

- least squares on log-ratios to the power ``p`` on every row (``fit(..., power=p)``;
  larger ``p`` weighs the worst rows more);
- least squares on the train rows (every other row), as the calibration did before it had
  a band;
- least squares on the train rows with every train row held within +-``MAX_REL_ERROR``
  (``fit(..., max_rel_error=...)``), the shipped calibration;
- the minimax fit on every row (``fit_minimax``): the smallest worst error found for the
  model form (a local method, so an upper bound on the true minimum).

It then checks the Llama-2-70B table against itself: for every (prompt, batch)
configuration measured at TP 2, 4 and 8 (128 output tokens), the ratios t(TP4) / t(TP2)
and t(TP8) / t(TP4) of the measured prefill times, with a robust z-score (distance from the median in units
of 1.4826 x the median absolute deviation). A point far outside its own table's tensor-
parallel scaling pulls any model that scales the same way for every batch.
Beside each median it prints the range of the source's repeats (5-15 runs per
configuration, ``lpserve/data/calibration/splitwise_perf_model_spread.csv``).

Run: ``python benchmarks/cost_fit_worst_case.py [--powers 2,8]``.
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from lpserve.cost.analytic import CALIBRATED, AnalyticCost, link_defaults
from lpserve.cost.catalog import get_gpu
from lpserve.cost.data import CalibrationData
from lpserve.cost.fit import (
    MAX_REL_ERROR,
    SPLITWISE_GROUPS,
    _model,
    engine_parameters,
    fit,
    fit_minimax,
    predict_row,
)


def vidur_base(gpu: str) -> dict[str, float]:
    """The operator-profile (``vidur-a100``) parameters every engine fit starts from, with
    the communication defaults of ``gpu``'s interconnect for vLLM (as ``calibrate`` does)."""
    values = AnalyticCost(gpu="a100-80gb", llm="llama-2-7b", tp=1).values
    return {**{k: values[k] for k in CALIBRATED}, **link_defaults(get_gpu(gpu), "vllm")}


def _errors(res, gpu: str, llm: str, rows: list[dict]) -> np.ndarray:
    """|predicted / measured - 1| of ``rows`` under the fitted values of ``res``."""
    models = {tp: _model(gpu, llm, tp, res.values, engine="vllm")
              for tp in sorted({int(r["tp"]) for r in rows})}
    return np.array([abs(predict_row(models[int(r["tp"])], r) / r["measured_s"] - 1)
                     for r in rows])


def worst_case(data: CalibrationData, powers: list[float]) -> None:
    print("engine fits, |predicted / measured - 1| over every row (prefill and decode):")
    print(f"  {'group':24s} {'fit':48s} {'median':>7s} {'max':>7s}  worst point")
    for llm, hw, gpu in SPLITWISE_GROUPS:
        rows = [r for r in data.splitwise_rows(llm=llm, hardware=hw) if not r["excluded"]]
        train = [r for r in rows if r["fit_split"] == "train"]
        kw = dict(parameters=engine_parameters(train), base=vidur_base(gpu), engine="vllm")
        fits = [(f"least squares, p={p:g}, every row", fit(rows, gpu, llm, power=p, **kw))
                for p in powers]
        fits.append(("least squares, train rows", fit(train, gpu, llm, **kw)))
        fits.append((f"least squares within +-{MAX_REL_ERROR:.0%}, train rows (shipped)",
                     fit(train, gpu, llm, max_rel_error=MAX_REL_ERROR, **kw)))
        fits.append(("minimax, every row", fit_minimax(rows, gpu, llm, **kw)))
        for name, res in fits:
            err = _errors(res, gpu, llm, rows)
            w = int(np.argmax(err))
            print(f"  {llm + ' ' + hw:24s} {name:48s} {100 * np.median(err):6.1f}% "
                  f"{100 * err.max():6.1f}%  {rows[w]['point'].removeprefix('splitwise-')}")


def repeat_spread() -> dict[tuple, tuple[int, float, float]]:
    """(model, hardware, tp, prompt, batch, output) -> (repeats, min ms, max ms) of the
    Splitwise prompt times."""
    import csv
    from importlib import resources

    path = resources.files("lpserve") / "data" / "calibration" / "splitwise_perf_model_spread.csv"
    with path.open() as fh:
        return {(r["model"], r["hardware"], int(r["tensor_parallel"]), int(r["prompt_size"]),
                 int(r["batch_size"]), int(r["token_size"])):
                (int(r["repeats"]), float(r["prompt_time_ms_min"]), float(r["prompt_time_ms_max"]))
                for r in csv.DictReader(fh)}


def tp_scaling(data: CalibrationData) -> None:
    rows = [r for r in data.splitwise_rows(llm="llama-2-70b", hardware="a100-80gb")
            if r["phase"] == "prefill" and not r["excluded"]
            and r["point"].endswith("-o128-ttft")]  # one row per configuration
    by_cfg: dict[tuple[int, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_cfg[(r["prefill_tokens"], r["prefill_chunks"])][int(r["tp"])].append(r["measured_s"])
    cfgs = sorted(c for c, v in by_cfg.items() if {2, 4, 8} <= set(v))
    med = {c: {tp: float(np.median(v)) for tp, v in by_cfg[c].items()} for c in cfgs}
    r42 = np.array([med[c][4] / med[c][2] for c in cfgs])
    r84 = np.array([med[c][8] / med[c][4] for c in cfgs])

    def z(x: np.ndarray) -> np.ndarray:
        mad = 1.4826 * np.median(np.abs(x - np.median(x)))
        return (x - np.median(x)) / mad

    spread = repeat_spread()

    def cell(c: tuple[int, int], tp: int) -> str:
        _, lo, hi = spread[("llama2-70b", "a100-80gb", tp, c[0], c[1], 128)]
        return f"{1e3 * med[c][tp]:.1f} [{lo:.0f}-{hi:.0f}]"

    print("\nLlama-2-70B on A100, measured prefill time (ms, median [range of repeats]) and "
          "ratios across tensor-parallel degrees")
    print(f"  {'prompt x batch':>15s} {'TP2':>22s} {'TP4':>22s} {'TP8':>22s} "
          f"{'TP4/TP2':>8s} {'z':>6s} {'TP8/TP4':>8s} {'z':>6s}")
    for c, a, za, b, zb in zip(cfgs, r42, z(r42), r84, z(r84)):
        print(f"  {f'{c[0]} x {c[1]}':>15s} {cell(c, 2):>22s} {cell(c, 4):>22s} "
              f"{cell(c, 8):>22s} {a:8.3f} {za:+6.1f} {b:8.3f} {zb:+6.1f}")
    print(f"  TP8/TP4 over {len(cfgs)} configurations: median {np.median(r84):.3f}, "
          f"range {r84.min():.3f}-{r84.max():.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--powers", default="2,8", help="comma-separated powers p >= 1")
    ap.add_argument("--source", default=None, help="calibration folder (original layout); "
                    "default: the package's copies")
    a = ap.parse_args()
    powers = [float(x) for x in a.powers.split(",")]
    data = CalibrationData.packaged() if a.source is None else CalibrationData.from_shared(a.source)
    worst_case(data, powers)
    tp_scaling(data)


if __name__ == "__main__":
    main()
