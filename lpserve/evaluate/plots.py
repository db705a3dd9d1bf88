"""Plots of evaluation results (layer 5), each returning a matplotlib ``Figure``.

* :func:`plot_latency_cdf` — CDFs of per-request latencies of each policy, with the CDF of
  the per-request lower bounds (dashed) where a bound gives them.
* :func:`plot_latency_vs_load` — a metric against the load (rate scale), one line per
  policy (mean over workloads, band from min to max), with the lower bound.
* :func:`plot_gap_to_bound` — each policy's ratio to the lower bound (bar: mean over cases,
  whiskers: min to max, dots: the cases).

Figures are built without pyplot (no global state, no backend needed): ``fig.savefig``
writes them, and notebooks display them through their ``_repr_png_`` whatever the
matplotlib backend. :func:`new_figure` gives the same kind of figure for custom plots.
"""
from __future__ import annotations

import functools
import io
from typing import Any, Mapping, Sequence

import numpy as np

#: axis labels with units, by metric
LABELS = {
    "ttft_s": "time to first token (s)",
    "tpot_s": "time per output token (s)",
    "e2e_s": "end-to-end latency (s)",
    "queue_s": "queueing delay (s)",
    "throughput_rps": "throughput (requests/s)",
    "goodput_rps": "goodput under SLO (requests/s)",
    "prefix_hit_rate": "prefix hit rate (fraction of prompt tokens)",
}
STAT_NAMES = {"mean": "mean", "p50": "median", "p90": "p90", "p99": "p99"}


def metric_label(metric: str) -> str:
    """Axis label of a flattened metric key, with its unit (``e2e_s_p99`` -> ``p99
    end-to-end latency (s)``)."""
    if metric in LABELS:
        return LABELS[metric]
    base, _, stat = metric.rpartition("_")
    if base in LABELS and stat in STAT_NAMES:
        return f"{STAT_NAMES[stat]} {LABELS[base]}"
    return metric


@functools.cache
def _figure_class() -> type:
    """matplotlib's Figure with a ``_repr_png_`` (built on first use: matplotlib is heavy)."""
    from matplotlib.figure import Figure

    class ReportFigure(Figure):
        """A Figure that renders itself as PNG for rich displays (Jupyter)."""

        def _repr_png_(self) -> bytes:
            buf = io.BytesIO()
            self.savefig(buf, format="png", dpi=100)
            return buf.getvalue()

    return ReportFigure


def new_figure(ncols: int = 1, width_in: float = 6.4, height_in: float = 4.2):
    """``(figure, [axes, ...])``: a pyplot-free matplotlib figure with ``ncols`` panels of
    ``width_in`` x ``height_in`` inches that Jupyter displays as PNG."""
    fig = _figure_class()(figsize=(width_in * ncols, height_in), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


_figure = new_figure


def _samples(data: Any) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict]]:
    """(policy -> metric -> array, bound -> metric -> array) from a compare table, a
    :class:`~lpserve.evaluate.Samples`, or a mapping label -> Result / dict / array."""
    from lpserve.evaluate.compare import Samples

    s = data.attrs.get("samples") if hasattr(data, "attrs") else data
    if isinstance(s, Samples):
        return s.policies, s.bounds
    if not isinstance(s, Mapping):
        raise ValueError("plot_latency_cdf needs a compare() table (with attrs['samples']), "
                         "a Samples object, or a mapping label -> Result or arrays")
    out: dict[str, dict[str, np.ndarray]] = {}
    for label, v in s.items():
        if hasattr(v, "arrays"):  # a simulation Result: finished requests only
            fin = v.arrays["status"] == "finished"
            out[str(label)] = {k: np.asarray(v.arrays[k], float)[fin]
                               for k in ("ttft_s", "tpot_s", "e2e_s")}
        elif isinstance(v, Mapping):
            out[str(label)] = {k: np.asarray(x, float) for k, x in v.items()}
        else:
            out[str(label)] = {"e2e_s": np.asarray(v, float)}
    return out, {}


#: line styles cycled with the colours, so that policies with identical results stay visible
LINESTYLES = ("-", "--", "-.", ":")


def _ecdf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(x[np.isfinite(x)])
    return x, np.arange(1, x.size + 1) / max(x.size, 1)


def plot_latency_cdf(data: Any, metrics: str | Sequence[str] = ("ttft_s", "e2e_s"), *,
                     log_x: bool = True, title: str | None = None):
    """CDF of per-request latencies, one panel per metric (``"ttft_s"``, ``"tpot_s"``,
    ``"e2e_s"``), one line per policy; dashed: per-request lower bounds (over the requests
    every policy finished). ``data``: a :func:`~lpserve.evaluate.compare` table or a
    mapping label -> Result (or -> {metric: array})."""
    pols, bounds = _samples(data)
    if not pols:
        raise ValueError("plot_latency_cdf: no policies to plot")
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    fig, axes = _figure(len(metrics), width_in=5.6)
    for ax, m in zip(axes, metrics):
        for i, (label, arrs) in enumerate(pols.items()):
            if m not in arrs:
                raise KeyError(f"plot_latency_cdf: no {m!r} samples for {label!r}")
            x, y = _ecdf(arrs[m])
            ax.step(x, y, where="post", label=label, linewidth=1.5,
                    linestyle=LINESTYLES[i % len(LINESTYLES)])
        for name, arrs in bounds.items():
            if m in arrs:
                x, y = _ecdf(arrs[m])
                ax.step(x, y, where="post", color="black", linestyle=(0, (4, 2)),
                        linewidth=1.1, alpha=0.8, label=f"lower bound ({name}, per request)")
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(LABELS.get(m, m))
        ax.set_ylabel("fraction of finished requests")
        ax.set_ylim(0, 1.01)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"CDF of {LABELS.get(m, m).split(' (')[0]}")
    axes[-1].legend(loc="lower right", fontsize="small")
    fig.suptitle(title or "Per-request latency distribution")
    return fig


def _check_columns(frame: Any, cols: Sequence[str], fn: str) -> None:
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise KeyError(f"{fn}: the frame has no column(s) {missing}; have {list(frame.columns)}")


def plot_latency_vs_load(frame: Any, metric: str = "e2e_s_mean", *, x: str = "load",
                         by: str = "policy", bound: bool = True, log_y: bool = False,
                         title: str | None = None, x_label: str | None = None):
    """``metric`` against ``x`` (default the rate scale ``load``), one line per policy: the
    mean over the rows at each load (e.g. several workloads), shaded from min to max. With
    ``bound``, the lower bound of the metric (the smallest ``bound_value`` at each load,
    averaged over workloads) as a dashed black line, when the frame's bounds are of
    ``metric`` (its ``bound_metric`` column). ``x_label`` replaces the x-axis label."""
    _check_columns(frame, [x, by, metric], "plot_latency_vs_load")
    fig, (ax,) = _figure()
    for i, (label, g) in enumerate(frame.groupby(by, sort=False)):
        st = g.groupby(x)[metric].agg(["mean", "min", "max"]).sort_index()
        xs = st.index.to_numpy(float)
        line, = ax.plot(xs, st["mean"], marker="o", label=str(label),
                        linestyle=LINESTYLES[i % len(LINESTYLES)])
        if (st["max"] > st["min"]).any():
            ax.fill_between(xs, st["min"], st["max"], color=line.get_color(), alpha=0.15)
    same_metric = "bound_metric" in frame.columns and (frame["bound_metric"] == metric).all()
    if bound and same_metric and "bound_value" in frame.columns and \
            np.isfinite(frame["bound_value"].to_numpy(float)).any():
        per_case = frame.groupby([x] + [c for c in ("workload",) if c in frame.columns])
        lb = per_case["bound_value"].min().groupby(level=0).mean().sort_index()
        ax.plot(lb.index.to_numpy(float), lb.to_numpy(float), color="black", linestyle="--",
                marker="x", label="lower bound")
    ax.set_xlabel(x_label or ("load (rate scale, x trace arrival rate)" if x == "load"
                              else x))
    ax.set_ylabel(metric_label(metric))
    if log_y:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(title or f"{metric_label(metric).split(' (')[0]} vs load")
    return fig


def plot_gap_to_bound(frame: Any, *, by: str = "policy", title: str | None = None):
    """Each policy's ``ratio_to_bound`` (its metric over the best lower bound of the same
    metric): bar = mean over the frame's rows for the policy, whiskers = min and max, dots =
    the rows (e.g. workloads x loads). 1.0 is the bound itself."""
    _check_columns(frame, [by, "ratio_to_bound"], "plot_gap_to_bound")
    fig, (ax,) = _figure(width_in=max(6.4, 1.2 * frame[by].nunique() + 2.5))
    labels, means, lo, hi = [], [], [], []
    groups = list(frame.groupby(by, sort=False))
    for i, (label, g) in enumerate(groups):
        r = g["ratio_to_bound"].to_numpy(float)
        r = r[np.isfinite(r)]
        labels.append(str(label))
        m = float(r.mean()) if r.size else float("nan")
        means.append(m)
        lo.append(m - float(r.min()) if r.size else 0.0)
        hi.append(float(r.max()) - m if r.size else 0.0)
        if r.size > 1:
            jitter = np.linspace(-0.15, 0.15, r.size)
            ax.scatter(i + jitter, r, color="black", s=10, zorder=3)
    pos = np.arange(len(labels))
    bars = ax.bar(pos, means, yerr=[lo, hi], capsize=4, color="tab:blue", alpha=0.75)
    for rect, m in zip(bars, means):
        if np.isfinite(m):
            ax.annotate(f"{m:.2f}", (rect.get_x() + rect.get_width() / 2, min(0.4, m / 2)),
                        ha="center", va="center", color="white", fontweight="bold")
    ax.axhline(1.0, color="black", linestyle="--", label="lower bound (ratio 1)")
    ax.set_xticks(pos, labels, rotation=20, ha="right")
    metric = frame["bound_metric"].iloc[0] if "bound_metric" in frame.columns and len(frame) \
        else frame.attrs.get("metric", "ratio")
    ax.set_ylabel(f"{metric_label(metric).split(' (')[0]} / lower bound (ratio, x)")
    ax.set_xlabel("policy")
    top = np.nanmax(np.asarray(means) + np.asarray(hi)) if np.isfinite(means).any() else 1.0
    ax.set_ylim(0, max(1.1, 1.12 * top))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    ax.set_title(title or "Gap to the lower bound per policy")
    return fig


__all__ = ["metric_label", "new_figure", "plot_gap_to_bound", "plot_latency_cdf",
           "plot_latency_vs_load", "plot_interval_vs_load"]


def plot_interval_vs_load(intervals: Sequence[Mapping[str, Any]], policies: Mapping[str, Any],
                          *, title: str | None = None, x_label: str | None = None):
    """Mean end-to-end latency against load: the optimality interval (shaded, from the
    best lower bound to the best offline schedule, both over the requests) and each
    policy's value (one line each).

    Args:
        intervals: records of :func:`optimality_interval` with an added ``"load"`` key.
        policies: label -> sequence of ``(load, mean e2e s)`` points.
        x_label: the load axis's label, in the unit the loads are given (default: the
            arrival-rate scale).
    """
    fig, (ax,) = new_figure()
    rec = sorted(intervals, key=lambda r: r["load"])
    x = np.array([r["load"] for r in rec], np.float64)
    lo = np.array([r["lower_mean_s"] for r in rec], np.float64)
    up = np.array([r["upper_mean_s"] for r in rec], np.float64)
    ax.fill_between(x, lo, up, color="0.8", alpha=0.8, label="optimum lies here")
    ax.plot(x, lo, "k--", lw=1.2, label="best lower bound")
    ax.plot(x, up, "k-", lw=1.2, label="best offline schedule")
    for label, pts in policies.items():
        p = sorted(pts)
        if p:
            ax.plot([a for a, _ in p], [b for _, b in p], marker="o", lw=1.0, label=label)
    ax.set_xlabel(x_label or "load (arrival-rate scale)")
    ax.set_ylabel("mean end-to-end latency (s)")
    ax.set_title(title or "Policies against the optimality interval")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig
