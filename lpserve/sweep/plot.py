"""Standard sweep figures: latency and goodput against load, one line per policy, with
bootstrap-percentile confidence intervals across replications (seeds), which stay within
the metric's range."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

#: (column, axis label) of the latency figure's panels
LATENCY_PANELS = (("ttft_s_mean", "mean TTFT (s)"), ("ttft_s_p99", "p99 TTFT (s)"),
                  ("tpot_s_mean", "mean TPOT (s/token)"), ("e2e_s_p99", "p99 end-to-end (s)"))
THROUGHPUT_PANELS = (("throughput_rps", "throughput (req/s)"),
                     ("goodput_rps", "goodput under SLO (req/s)"))
#: inputs that never split lines (x axis, replication, derived columns)
_NOT_SERIES = {"cell", "rep", "seed", "load", "rate_per_s", "kind", "status", "error",
               "result_digest", "run_id", "part", "worker", "cell_wall_s"}


#: bootstrap resamples of :func:`mean_interval` (fixed seed: the figures are reproducible)
N_BOOTSTRAP = 4000


def mean_interval(values: Any, level: float = 0.95, *, n_boot: int = N_BOOTSTRAP,
                  seed: int = 0) -> tuple[float, float, float, int]:
    """Mean, the ``level`` bootstrap-percentile confidence interval ``(lo, hi)`` of the
    mean, and the sample size.

    The interval is the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the means
    of ``n_boot`` resamples (with replacement, seeded), so it always lies within the range
    of the values: a latency interval never goes below 0 and a rate's never leaves
    [0, 1], unlike a symmetric Student-t interval over few seeds. With few replications
    it is narrow (it cannot leave [min, max] of the seeds) and covers the true mean less
    often than ``level``. ``lo`` and ``hi`` are NaN for fewer than two finite values.
    """
    import numpy as np

    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    if n == 1:
        return float(x[0]), math.nan, math.nan, 1
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(int(n_boot), n))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(lo), float(hi), n


def aggregate(table: Any, metrics: list[str], level: float = 0.95) -> Any:
    """Mean and bootstrap-percentile interval (:func:`mean_interval`) of ``metrics`` over
    seeds, per policy x load point.

    Returns a DataFrame with the series columns, the x column, and for each metric
    ``<metric>``, ``<metric>_lo``, ``<metric>_hi`` and ``n``.
    """
    import pandas as pd

    ok = table[table["status"] == "ok"]
    xcol = _x_column(ok)
    series = series_columns(ok)
    rows = []
    for key, g in ok.groupby(series + [xcol], dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(series + [xcol], key))
        for m in metrics:
            if m in g:
                mean, lo, hi, n = mean_interval(g[m], level)
                row[m], row[f"{m}_lo"], row[f"{m}_hi"], row["n"] = mean, lo, hi, n
        rows.append(row)
    return pd.DataFrame(rows)


def series_columns(table: Any) -> list[str]:
    """Input columns that vary across the table (besides load and seed): one line each."""
    from lpserve.sweep.grid import AXES

    cols = [c for c in table.columns if (c in AXES or c == "trace" or c.startswith("engine."))
            and c not in _NOT_SERIES and table[c].nunique(dropna=False) > 1]
    if "policy" in table.columns and "policy" not in cols:
        cols.insert(0, "policy")
    return cols


def _x_column(table: Any) -> str:
    if "rate_per_s" in table.columns and table["rate_per_s"].notna().any():
        return "rate_per_s"
    return "load"


def plot_sweep(table: Any, out_dir: str | os.PathLike, *, title: str = "sweep",
               level: float = 0.95) -> list[Path]:
    """Draw ``latency_vs_load.png`` and ``throughput_vs_load.png`` into ``out_dir``.

    Only successful simulate cells are drawn. Error bars are ``level`` bootstrap-percentile
    confidence intervals of the mean across replications (:func:`mean_interval`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = table[(table["kind"] == "simulate") & (table["status"] == "ok")] \
        if "kind" in table else table.iloc[0:0]
    if sim.empty:
        raise ValueError("plot: the sweep has no successful simulate cells to draw")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    xcol = _x_column(sim)
    xlabel = "arrival rate (req/s)" if xcol == "rate_per_s" else \
        "load (x the trace's arrival rate)"
    series = series_columns(sim)
    reps = int(sim.groupby(series + [xcol], dropna=False).size().max())
    paths = []
    for fname, panels, what in (("latency_vs_load.png", LATENCY_PANELS, "latency"),
                                ("throughput_vs_load.png", THROUGHPUT_PANELS, "throughput")):
        agg = aggregate(sim, [m for m, _ in panels], level)
        ncols = 2
        nrows = math.ceil(len(panels) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows),
                                 squeeze=False)
        for ax, (metric, label) in zip(axes.flat, panels):
            if metric not in agg:
                ax.set_visible(False)
                continue
            groups = agg.groupby(series, dropna=False, sort=True) if series else [("", agg)]
            for key, g in groups:
                key = key if isinstance(key, tuple) else (key,)
                name = ", ".join(f"{v}" if c == "policy" else f"{c}={v}"
                                 for c, v in zip(series, key)) or "all"
                g = g.sort_values(xcol)
                err = [(g[metric] - g[f"{metric}_lo"]).fillna(0.0),
                       (g[f"{metric}_hi"] - g[metric]).fillna(0.0)]
                ax.errorbar(g[xcol], g[metric], yerr=err, marker="o", ms=3, capsize=3,
                            label=name)
            xs = agg[xcol].astype(float)
            if len(xs) and xs.min() > 0 and xs.max() / xs.min() >= 8:
                ax.set_xscale("log", base=2)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize=8, title="policy" if series == ["policy"] else None)
        fig.suptitle(f"{title}: {what} vs load (mean, {int(level * 100)}% bootstrap CI over "
                     f"{reps} seed{'s' if reps != 1 else ''})")
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
