"""The run options of ``lpserve gap`` (engine parameters, predictor, load unit and
capacity estimates, checkpoints, progress, warnings) and the report pieces that show them,
apart from the table and bound logic of :mod:`lpserve.commands.gap_cmd`."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


class GapRun:
    """The run options of one ``lpserve gap``: engine overrides, predictor, load unit and
    capacity estimates, checkpoint folder, progress reporter, notes and warnings."""

    def __init__(self, args, workloads, cluster, slo, policies, loads, seeds) -> None:
        from lpserve.commands import runopts as ro
        from lpserve.commands.common import CLIError
        from lpserve.evaluate.utilization import fluid_capacity
        from lpserve.instance import Instance

        self.over, self.load_unit = args.over, args.load_unit
        self.engine = ro.engine_mapping(args.engine, policies)
        shared = args.shared_engine
        if shared is not None and shared != "own" and shared not in policies:
            raise CLIError(f"--shared-engine {shared!r} is not among the policies compared "
                           f"({', '.join(policies)}) nor 'own'"[:300])
        self.shared_engine = True if shared is None else (False if shared == "own" else shared)
        self.predictor = ro.predictor_spec(args.predictor)
        base = workloads[0][1]
        self.notes: list[str] = []
        if self.predictor is None and not args.policies and ro.prediction_readers(policies) \
                and base.predicted_lo is None:
            self.predictor = "history"
            self.notes.append(f"predictions: history (online quantiles of completed requests) "
                              f"for {', '.join(ro.prediction_readers(policies))} of the "
                              "default policy set; the trace has none (--predictor to choose)")
        ro.check_predictions(policies, base, self.predictor)
        if self.predictor is not None and not any("predictions:" in n for n in self.notes):
            self.notes.append(f"predictions: {self.predictor} (--predictor) for every run")
        from lpserve.evaluate.specs import describe_overrides, engine_for

        for p in policies:
            over = engine_for(self.engine, p)
            if over:
                self.notes.append(f"engine of {p}: {describe_overrides(over)} (--engine)")
        self.caps = {wl: fluid_capacity(Instance(trace=tr, cluster=cluster, slo=slo))
                     for wl, tr in workloads}
        self.scale, self.utilization = {}, {}
        for wl, _ in workloads:
            cap = self.caps[wl]
            for load in loads:
                sc = cap.load_for(load) if args.load_unit == "utilization" else load
                self.scale[wl, load] = sc
                self.utilization[wl, load] = cap.utilization(sc)
        cap0 = self.caps[workloads[0][0]]
        self.notes.append(f"load: {'utilisation' if args.load_unit == 'utilization' else 'rate scale'}"
                          f" (--load-unit); table at {load_name(args.load_unit, args.load)} = rate scale "
                          f"{self.scale[workloads[0][0], args.load]:.3g}, utilisation "
                          f"{self.utilization[workloads[0][0], args.load]:.3g} of the "
                          f"{cap0.describe()}")
        self.warnings: list[str] = []
        ctx = ro.context_warning(base, args.llm)
        if ctx:
            self.warnings.append(ctx)
        self.checkpoint = None if args.no_checkpoint else \
            Path(args.checkpoint) if args.checkpoint else Path(args.out) / "checkpoints"
        n_runs = len(workloads) * len(loads) * len(policies) * len(seeds)
        total = sum(len(tr) for _, tr in workloads) * len(loads) * len(policies) * len(seeds)
        self.reporter = ro.Reporter(total, n_runs, "lpserve gap",
                                    quiet=args.json or args.quiet)
        ro.warn(self.warnings, quiet=args.json)

    def load_name(self, load: float) -> str:
        """``"load x1.5"`` or ``"utilisation 0.6"`` (by ``--load-unit``)."""
        return load_name(self.load_unit, load)

    def compare_options(self) -> dict:
        """Keyword arguments of :func:`lpserve.evaluate.compare` for every case."""
        return {"engine": self.engine, "predictor": self.predictor,
                "over": self.over, "shared_engine": self.shared_engine,
                "checkpoint": self.checkpoint,
                "on_result": self.reporter.on_result,
                "on_requests": self.reporter.on_requests}

    def json(self) -> dict:
        """The run options as JSON fields of the command's output."""
        return {"engine": self.engine, "predictor": self.predictor, "over": self.over,
                "shared_engine": self.shared_engine, "warnings": self.warnings,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None,
                "capacity": {wl: c.as_dict() for wl, c in self.caps.items()},
                "load_unit": self.load_unit}


def gap_run(args, workloads, cluster, slo, policies, loads, seeds) -> GapRun:
    """The :class:`GapRun` of one command (validates ``--engine`` and ``--predictor``)."""
    return GapRun(args, workloads, cluster, slo, policies, loads, seeds)


def print_run_summary(run: GapRun, runs: Any) -> None:
    """Checkpoint use, and the warnings again at the end (where they are seen)."""
    if run.checkpoint is not None:
        n = int(runs["from_checkpoint"].sum()) if "from_checkpoint" in runs else 0
        print(f"checkpoints: {run.checkpoint}/ ({n} of {len(runs)} runs loaded from it; a "
              "rerun with the same inputs loads them all)")
    for w in run.warnings:
        print(f"WARNING: {w}")


def rejected_title(frame: Any) -> str:
    """``rejected: vllm 646 of 918 (70.4 %), ...`` over the frame's rows, or that none was."""
    g = frame.groupby("policy", sort=False)[["n_rejected", "n_requests"]].sum()
    bad = g[g["n_rejected"] > 0]
    if bad.empty:
        return "no policy rejected a request"
    return "rejected: " + ", ".join(f"{p} {int(r.n_rejected):,} of {int(r.n_requests):,} "
                                    f"({100 * r.n_rejected / r.n_requests:.1f} %)"
                                    for p, r in bad.iterrows())


def load_name(load_unit: str, load: float) -> str:
    """A load of ``lpserve gap`` in its unit: ``"load x1.5"`` (rate scale) or
    ``"utilisation 0.6"`` (of the fluid capacity estimate)."""
    return f"utilisation {load:g}" if load_unit == "utilization" else f"load x{load:g}"


def load_tag(load_unit: str, load: float) -> str:
    """:func:`load_name` in a table header: ``"x1.5"`` or ``"u0.6"``."""
    return f"u{load:g}" if load_unit == "utilization" else f"x{load:g}"


def load_label(args: argparse.Namespace) -> str:
    """The x-axis label of the load plots (by ``--load-unit``)."""
    return ("load (utilisation of the fluid capacity estimate)"
            if args.load_unit == "utilization" else "load (rate scale, x trace arrival rate)")


def nest_run(row: Any) -> dict[str, Any]:
    """The comparison set, rejections and load of a row."""
    import json

    d: dict[str, Any] = {"n_compared": int(row["n_compared"]),
                         "rejected_share": float(row["rejected_share"]),
                         "rejection_reasons": json.loads(row["rejection_reasons"] or "{}")}
    for k in ("rate_scale", "utilization"):
        if k in row:
            d[k] = float(row[k])
    return d
