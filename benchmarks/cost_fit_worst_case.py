"""How small the worst error of the engine-level cost fits can get on the Splitwise medians.

The shipped calibrations minimise squared log-ratios on every other row of the Splitwise
table (``python -m lpserve.cost.fit``). This script asks the most favourable question for
the worst point instead: it refits the engine parameters of each Splitwise group on
**every** row (train and held-out alike) with a growing power ``p`` of the log-ratio
(``lpserve.cost.fit.fit(..., power=p)``: ``p = 2`` is least squares, larger ``p`` weighs
the worst rows more and approaches the minimax fit), and prints the median and worst
|predicted / measured - 1| with the worst point.

It then checks the Llama-2-70B table against itself: for every (prompt, batch)
configuration measured at TP 2, 4 and 8 (128 output tokens), the ratios t(TP4) / t(TP2) and t(TP8) / t(TP4)
of the measured prefill times, with a robust z-score (distance from the median in units
of 1.4826 x the median absolute deviation). A point far outside its own table's tensor-
parallel scaling cannot be matched by a model that scales the same way for every batch.
Beside each median it prints the range of the source's repeats (5-15 runs per
configuration, ``lpserve/data/calibration/splitwise_perf_model_spread.csv``).

Run: ``python benchmarks/cost_fit_worst_case.py [--powers 2,4,8,16]``.
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from lpserve.cost.analytic import AnalyticCost
from lpserve.cost.data import CalibrationData
from lpserve.cost.fit import ENGINE_PARAMETERS, SPLITWISE_GROUPS, fit, _model, predict_row


def vidur_base() -> dict[str, float]:
    """The operator-profile (``vidur-a100``) parameters every engine fit starts from."""
    return dict(AnalyticCost(gpu="a100-80gb", llm="llama-2-7b", tp=1).values)


def worst_case(data: CalibrationData, powers: list[float]) -> None:
    base = vidur_base()
    print("engine fit on every row (prefill and decode), |predicted / measured - 1|:")
    print(f"  {'group':28s} {'p':>3s} {'rows':>5s} {'median':>7s} {'max':>7s}  worst point")
    for llm, hw, gpu in SPLITWISE_GROUPS:
        rows = [r for r in data.splitwise_rows(llm=llm, hardware=hw) if not r["excluded"]]
        for p in powers:
            res = fit(rows, gpu, llm, parameters=ENGINE_PARAMETERS, base=base, power=p)
            err = np.abs(res.rel_errors)
            worst = int(np.argmax(err))
            models = {tp: _model(gpu, llm, tp, res.values)
                      for tp in sorted({int(r["tp"]) for r in rows})}
            check = predict_row(models[int(rows[worst]["tp"])], rows[worst])
            assert np.isclose(check / rows[worst]["measured_s"] - 1, res.rel_errors[worst])
            print(f"  {llm + ' ' + hw:28s} {p:3g} {len(rows):5d} {100 * np.median(err):6.1f}% "
                  f"{100 * err.max():6.1f}%  {rows[worst]['point']} "
                  f"({100 * res.rel_errors[worst]:+.1f}%)")


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
    ap.add_argument("--powers", default="2,4,8,16", help="comma-separated powers p >= 1")
    ap.add_argument("--source", default=None, help="calibration folder (original layout); "
                    "default: the package's copies")
    a = ap.parse_args()
    powers = [float(x) for x in a.powers.split(",")]
    data = CalibrationData.packaged() if a.source is None else CalibrationData.from_shared(a.source)
    worst_case(data, powers)
    tp_scaling(data)


if __name__ == "__main__":
    main()
