"""Policies x instances -> tidy results with ratios to lower bounds (layer 5).

:func:`compare` simulates each policy on one instance (for each seed), computes the lower
bounds that apply, **checks** that no bound exceeds any policy's value of the same metric
over the same requests, and returns one row per policy. :func:`robustness` does it over
several instances (workloads, loads) and summarizes each policy's spread.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from lpserve import objectives as obj
from lpserve.evaluate.bounds import (
    BoundViolation,
    PerRequestBound,
    applies,
    check_bound,
    flatten,
    resolve_bounds,
)
from lpserve.evaluate.checkpoint import ARRAY_KEYS
from lpserve.evaluate.lineup import (
    BASELINES,
    PREFERRED_PRINCIPLED,
    SOLVED_POLICIES,
    PolicyUnavailable,
    default_policies,
    describe_policy,
    resolve_policies,
    resolve_with_sources,
    solved_policy,
)
from lpserve.evaluate.specs import rejection_warnings


@dataclass(eq=False)
class Samples:
    """Per-request latencies kept beside a :func:`compare` table (for CDF plots).

    Attributes:
        policies: label -> {"ttft_s", "tpot_s", "e2e_s"} arrays over the requests the policy
            finished (first seed).
        bounds: bound name -> the same keys, per-request lower bounds over the requests
            every policy finished (bounds with per-request values only).
        bound_values: bound name -> metric key -> lower bound over those common requests.
        n_common: how many requests every policy finished.
    """

    policies: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    bounds: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    bound_values: dict[str, dict[str, float]] = field(default_factory=dict)
    n_common: int = 0


def _restricted(arrays: Mapping[str, np.ndarray], mask: np.ndarray) -> dict[str, float]:
    """Latency statistics of one run over the requests in ``mask`` (finished ones)."""
    out: dict[str, float] = {}
    for key in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        if key not in arrays:
            continue
        for q, v in obj.distribution(arrays[key][mask]).items():
            out[f"{key}_{q}"] = v
    out["total_latency_s"] = obj.total_latency_s(arrays["e2e_s"][mask])
    return out


#: columns of a compare() table that are not averaged over seeds
_TEXT_COLUMNS = ("policy", "kind", "description", "engine", "engine_from", "online",
                 "clairvoyant", "bound_metric", "bound_name", "rejection_reasons", "seed",
                 "from_checkpoint")


def _run_row(label: str, kind: str, pol: Any, seed: int, res: Any, wall: float,
             cluster: Any, source: str
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The table row of one run over the requests it finished, and its per-request arrays."""
    import json

    a = res.arrays
    fin = a["status"] == "finished"
    flat = flatten(res.summary())
    flat["total_latency_s"] = obj.total_latency_s(a["e2e_s"][fin])
    reasons = a["reason"][a["status"] == "rejected"]
    counts = dict(zip(*np.unique(reasons.astype(str), return_counts=True))) \
        if reasons.size else {}
    row = {"policy": label, "kind": kind, "description": describe_policy(pol, cluster=cluster),
           "engine": pol.engine_on(cluster).describe(), "engine_from": source,
           "online": bool(pol.meta.online), "clairvoyant": bool(pol.meta.clairvoyant),
           "seed": int(seed), **flat,
           "rejection_reasons": json.dumps({str(k): int(v) for k, v in counts.items()}),
           "wall_s": float(wall)}
    arrays = {k: np.asarray(a[k], float) for k in ARRAY_KEYS}
    arrays["finished"] = fin
    return row, arrays


def _best_bound(vals: Sequence[tuple[Any, dict[str, float]]], metric: str
                ) -> tuple[str, float]:
    """Name and value of the largest finite bound of ``metric`` among ``vals``."""
    best_name, best = "", float("nan")
    for b, v in vals:
        x = v.get(metric, float("nan"))
        if np.isfinite(x) and not (best >= x):
            best_name, best = b.name, x
    return best_name, best


def at_load(instance: Any, load: float | None = None,
            utilization: float | None = None) -> tuple[Any, dict[str, float]]:
    """``instance`` with its trace's rate scaled to ``load`` or to ``utilization`` of the
    cluster's fluid capacity (at most one; neither: unchanged), and ``{"load": rate
    scale, "utilization": rate / capacity}`` of the result."""
    from lpserve.evaluate.utilization import fluid_capacity

    if load is not None and utilization is not None:
        raise ValueError("compare: give load or utilization, not both")
    for name, v in (("load", load), ("utilization", utilization)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v) or v <= 0):
            raise ValueError(f"compare: {name} must be a finite number > 0, got {v!r}"[:200])
    try:
        cap = fluid_capacity(instance)
    except ValueError:  # a trace without a rate (fewer than two requests)
        if utilization is not None:
            raise
        cap = None
    scale = cap.load_for(utilization) if utilization is not None else (load or 1.0)
    if scale != 1.0:
        instance = instance.with_(trace=instance.trace.scale_rate(scale))
    return instance, {"load": float(scale),
                      "utilization": cap.utilization(scale) if cap else math.nan}


def compare(instance: Any, policies: Sequence[Any] | Mapping[str, Any],
            bounds: Sequence[Any] | None = None, seeds: Sequence[int] = (0,), *,
            metric: str = "e2e_s_mean", check: bool = True, skip_unavailable: bool = False,
            on_run: Callable[[str, int], None] | None = None,
            engine: Mapping[str, Any] | None = None, predictor: Any = None,
            over: str = "common", checkpoint: Any = None,
            on_result: Callable[[dict[str, Any]], None] | None = None,
            on_requests: Callable[[int], None] | None = None,
            load: float | None = None, utilization: float | None = None,
            shared_engine: bool | str = True):
    """Simulate ``policies`` on ``instance`` and compare them with lower bounds.

    Same engine, different decision: by default every registered policy runs on the
    engine of the first baseline (:data:`BASELINES`; else of the first policy), exactly as
    that engine runs on the instance's cluster, keeping only the engine fields that are its
    own decisions (:data:`~lpserve.policy.engine.DECISION_FIELDS`: preemption by rank,
    budget controllers, deciders, speculation, proactive swapping; a policy that *is* an
    engine, such as ``sarathi``, keeps all; :func:`~lpserve.registry.owned_engine_fields`).
    A Policy object keeps the engine it was built with. The ``engine`` and ``engine_from``
    columns say what each row ran on.

    Args:
        instance: an :class:`~lpserve.instance.Instance`.
        load, utilization: run at another load (at most one of them): ``load`` scales the
            trace's arrival rate (``Trace.scale_rate``: 2 sends it twice as fast);
            ``utilization`` is the trace's rate over the cluster's fluid capacity
            (:func:`~lpserve.evaluate.utilization.fluid_capacity`: 1.0 is the rate the
            cost model says the cluster can just serve), turned into that load.
            ``frame.attrs["load"]`` and ``["utilization"]`` say what ran.
        policies: registered names, :data:`SOLVED_POLICIES` names or Policy objects (a
            mapping gives row labels).
        bounds: bound names (``"cost-bound"``), bound objects or claimed-value dicts
            (:func:`~lpserve.evaluate.bounds.resolve_bounds`); ``None`` = ``["cost-bound"]``,
            ``[]`` = none.
        seeds: the simulation is run once per seed; metrics are averaged over seeds.
        metric: the flattened key ``ratio_to_bound`` is taken on (``e2e_s_mean``: the
            cost-model bound on total latency divided by the request count).
        check: raise :class:`~lpserve.evaluate.bounds.BoundViolation` when a bound exceeds
            a policy's value of the same metric over the same requests (each policy's
            finished requests, and the requests every policy finished).
        skip_unavailable: leave out solved policies that cannot be built for this instance
            (their LP infeasible at this load) instead of raising :class:`PolicyUnavailable`;
            the reasons are in ``frame.attrs["skipped"]``.
        on_run: called with ``(label, seed)`` after each simulation (progress bars).
        engine: :class:`~lpserve.policy.EngineConfig` overrides: ``{field: value}`` for
            every policy, ``{label: {field: value}}`` for one policy (both may be given;
            the policy's own win), applied after the shared engine. Validated before any
            simulation.
        shared_engine: ``True`` (default: the first baseline's engine, see above), a
            policy label (that policy's engine) or ``False`` (each policy on the engine it
            was registered with).
        predictor: output-length predictor of every simulation: a spec
            (``"history"``, ``"noisy-oracle:sigma=0.3"``), a Predictor, ``"none"`` (on
            purpose) or ``None``. A policy that reads predictions on a trace without them
            and no predictor raises :class:`~lpserve.registry.MissingPredictions` before
            any simulation.
        over: ``"common"`` (default): every latency column, bound and ratio is over the
            requests *every* policy (and seed) finished, so rows compare the same requests;
            ``"served"``: over the requests each policy finished (a policy that rejects
            the hard requests then looks fast).
        checkpoint: a folder (:class:`~lpserve.evaluate.checkpoint.RunStore`): each run is
            stored when it ends and loaded instead of simulated when present, so an
            interrupted comparison resumes with the same table.
        on_result: called with each run's row (over the requests it finished) as soon as
            it is known (incremental results).
        on_requests: called with the number of requests routed, during each simulation
            (progress within long runs; :mod:`lpserve.evaluate.progress`).

    Returns:
        pandas DataFrame, one row per policy: ``policy, kind, description, engine`` (the
        exact :meth:`~lpserve.policy.EngineConfig.describe` of what ran), ``engine_from``
        (``"own"``, ``"vllm's"``: shared; ``"+ given"``: with ``engine`` overrides),
        ``online, clairvoyant, n_seeds``, the flattened DESIGN metrics (``ttft_s_mean`` …
        ``queue_s_p99``, ``throughput_rps``, ``goodput_rps``, ``prefix_hit_rate``,
        ``n_requests``, ``n_finished``, ``n_rejected``, ``n_unfinished``, ``preemptions``,
        ``total_latency_s``), ``n_compared`` (requests the latency columns cover),
        ``served_total_latency_s`` (total latency over the requests the policy finished,
        whatever ``over`` says),
        ``rejected_share`` (rejected / requests), ``rejection_reasons`` (JSON reason ->
        count), the stability diagnostics ``e2e_s_p99_over_p50`` and
        ``ttft_s_p99_over_p50``, ``bound_metric`` (= ``metric``), ``bound_name``,
        ``bound_value`` (the largest bound of ``metric`` over the compared requests),
        ``ratio_to_bound`` and ``wall_s`` (simulation seconds). Throughput, goodput, hit
        rate and the request counts are over the whole run. ``frame.attrs``:
        ``samples`` (a :class:`Samples`), ``metric``, ``over``, ``skipped`` (label ->
        reason), ``warnings`` (one line per policy that rejected more than 1 % of the
        requests; also issued as :class:`~lpserve.evaluate.specs.RejectionWarning`).
    """
    import pandas as pd

    from lpserve.evaluate.checkpoint import RunStore, identity, predictor_identity
    from lpserve.evaluate.progress import counting
    from lpserve.registry import check_predictions, resolve_predictor, simulate

    instance, at = at_load(instance, load, utilization)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("compare: seeds must hold at least one seed")
    if over not in ("common", "served"):
        raise ValueError(f"compare: over must be 'common' or 'served', got {over!r}")
    skipped: dict[str, str] = {}
    pols = resolve_with_sources(instance, policies, skipped if skip_unavailable else None, engine,
                    shared_engine)
    _, given = resolve_predictor(predictor)
    for _, pol, *_ in pols:
        check_predictions(instance, pol, given)
    prepared = [b.prepare(instance) for b in resolve_bounds(bounds)]
    store = RunStore(checkpoint) if checkpoint is not None else None
    inst_digest = instance.digest() if store is not None else ""
    n = len(instance.trace)
    records: list[tuple[str, int, Any, dict[str, Any], dict[str, np.ndarray]]] = []
    for label, pol, kind, spec, overrides, source in pols:
        for seed in seeds:
            key = RunStore.key(instance_digest=inst_digest, policy=identity(spec, overrides),
                               predictor=predictor_identity(predictor), seed=seed) \
                if store is not None else ""
            got = store.load(key) if store is not None else None
            if got is not None:
                row, arrays = got
                row.update(policy=label, kind=kind, from_checkpoint=True)
                if on_requests is not None:
                    on_requests(n)
            else:
                t0 = time.perf_counter()
                res = simulate(instance, counting(pol, on_requests), seed=seed,
                               predictor=predictor)
                row, arrays = _run_row(label, kind, pol, seed, res,
                                       time.perf_counter() - t0, instance.cluster, source)
                if store is not None:
                    store.save(key, row, arrays)
                row["from_checkpoint"] = False
            records.append((label, seed, pol, row, arrays))
            if on_result is not None:
                on_result(dict(row))
            if on_run is not None:
                on_run(label, seed)
    common = np.ones(n, bool)
    for *_, arrays in records:
        common &= arrays["finished"]
    samples = Samples(n_common=int(common.sum()))
    served_vals = []  # every bound against each run over the requests it finished
    for label, seed, pol, base, arrays in records:
        fin = arrays["finished"]
        vals = [(b, b.values(fin)) for b in prepared if applies(b, pol)]
        if check:
            for b, v in vals:
                check_bound(policy=label, bound=b.name, bound_values=v, policy_values=base,
                            seed=seed, n_requests=int(fin.sum()),
                            scope="the requests it finished")
        served_vals.append(vals)
    common_vals = {b.name: b.values(common) for b in prepared}
    rows = []
    for (label, seed, pol, base, arrays), vals in zip(records, served_vals):
        row = dict(base)
        # total latency over the requests this run finished, whatever ``over`` restricts
        # the latency columns to (the optimality interval compares it over every request)
        row["served_total_latency_s"] = base["total_latency_s"]
        if over == "common":
            row.update(_restricted(arrays, common))
            vals = [(b, common_vals[b.name]) for b in prepared if applies(b, pol)]
        best_name, best = _best_bound(vals, metric)
        pv = row.get(metric, float("nan"))
        mask = common if over == "common" else arrays["finished"]
        row.update(n_compared=int(mask.sum()),
                   rejected_share=float(row["n_rejected"]) / n if n else float("nan"),
                   e2e_s_p99_over_p50=row["e2e_s_p99"] / row["e2e_s_p50"],
                   ttft_s_p99_over_p50=row["ttft_s_p99"] / row["ttft_s_p50"],
                   bound_metric=metric, bound_name=best_name, bound_value=best,
                   ratio_to_bound=pv / best if best > 0 else float("nan"))
        rows.append(row)
        if seed == seeds[0]:
            samples.policies[label] = {k: arrays[k][mask] for k in ("ttft_s", "tpot_s",
                                                                     "e2e_s")}
    for b in prepared:
        vals = common_vals[b.name]
        samples.bound_values[b.name] = vals
        if isinstance(b, PerRequestBound):
            samples.bounds[b.name] = {"ttft_s": b.ttft_lb_s[common],
                                      "tpot_s": b.tpot_lb_s[common],
                                      "e2e_s": b.e2e_lb_s[common]}
        if check and common.any():
            for label, seed, pol, _, arrays in records:
                if not applies(b, pol):
                    continue
                check_bound(policy=label, bound=b.name, bound_values=vals,
                            policy_values=_restricted(arrays, common), seed=seed,
                            n_requests=int(common.sum()),
                            scope="the requests every policy finished")
    df = pd.DataFrame(rows)
    if len(seeds) > 1:
        num = [c for c in df.columns if c not in _TEXT_COLUMNS]
        agg = {c: "mean" for c in num}
        agg.update({c: "first" for c in _TEXT_COLUMNS if c in df.columns and c != "policy"})
        agg["seed"] = "count"
        df = df.groupby("policy", sort=False).agg(agg).reset_index()
    df = df.rename(columns={"seed": "n_seeds"})
    if len(seeds) == 1:
        df["n_seeds"] = 1
    first = [r for r in rows if r["seed"] == seeds[0]]
    df.attrs["samples"] = samples
    df.attrs["metric"] = metric
    df.attrs["over"] = over
    df.attrs.update(at)
    df.attrs["skipped"] = skipped
    df.attrs["warnings"] = rejection_warnings(first, instance, {r[0]: r[2] for r in records},
                                              samples.n_common, over)
    return df


def common_cases(runs: Any, *, by: str = "policy", case: Sequence[str] = ("instance",)):
    """The rows of a long frame whose case (the ``case`` columns) every policy ran, so that
    per-policy aggregates compare the same cases; and the left-out cases as a list."""
    cols = [c for c in case if c in runs.columns]
    if not cols:
        return runs, []
    n_pol = runs[by].nunique()
    counts = runs.groupby(cols, sort=False)[by].nunique()
    full = counts[counts == n_pol].index
    keys = runs.set_index(cols).index
    keep = keys.isin(full)
    dropped = [k for k in counts.index if k not in set(full)]
    return runs[keep].reset_index(drop=True), dropped


def robustness_summary(runs: Any, metric: str = "e2e_s_mean", *, by: str = "policy",
                       case: Sequence[str] = ("instance",)):
    """Spread of each policy over the cases (rows) of a long frame of :func:`compare`
    results: ``n_cases``, mean, std, min, max of ``metric``, mean and worst
    ``ratio_to_bound``, and the case where the policy was worst. Pass the frame through
    :func:`common_cases` first to compare policies on the same cases."""
    import pandas as pd

    if metric not in runs.columns:
        raise KeyError(f"robustness: metric {metric!r} not in the results; have "
                       f"{[c for c in runs.columns if c.endswith(('_mean', '_rps'))]}")
    rows = []
    for pol, g in runs.groupby(by, sort=False):
        v = g[metric].to_numpy(float)
        r = g["ratio_to_bound"].to_numpy(float) if "ratio_to_bound" in g else np.full(len(g),
                                                                                     np.nan)
        worst = g.iloc[int(np.nanargmax(r))] if np.isfinite(r).any() else \
            g.iloc[int(np.nanargmax(v))]
        rows.append({by: pol, "n_cases": len(g), f"{metric}_mean": float(np.nanmean(v)),
                     f"{metric}_std": float(np.nanstd(v)), f"{metric}_min": float(np.nanmin(v)),
                     f"{metric}_max": float(np.nanmax(v)),
                     "ratio_to_bound_mean": float(np.nanmean(r)) if np.isfinite(r).any()
                     else float("nan"),
                     "ratio_to_bound_max": float(np.nanmax(r)) if np.isfinite(r).any()
                     else float("nan"),
                     "worst_case": ", ".join(f"{c}={worst[c]}" for c in case if c in g)})
    return pd.DataFrame(rows)


def robustness(instances: Mapping[str, Any] | Sequence[Any],
               policies: Sequence[Any] | Mapping[str, Any], *,
               bounds: Sequence[Any] | None = None, seeds: Sequence[int] = (0,),
               metric: str = "e2e_s_mean", check: bool = True, return_runs: bool = False,
               skip_unavailable: bool = False,
               on_run: Callable[[str, int], None] | None = None,
               engine: Mapping[str, Any] | None = None, predictor: Any = None,
               over: str = "common", checkpoint: Any = None,
               on_result: Callable[[dict[str, Any]], None] | None = None,
               on_requests: Callable[[int], None] | None = None,
               on_case: Callable[[str, Any], None] | None = None):
    """Run :func:`compare` on each instance (a mapping gives case labels, else position and
    trace name) and return :func:`robustness_summary` (one row per policy) over the cases
    every policy ran; with ``return_runs`` also the long frame (one row per instance and
    policy, with an ``instance`` column, all cases): ``(summary, runs)``.

    ``skip_unavailable``, ``engine``, ``predictor``, ``over``, ``checkpoint`` (one folder
    for every case: runs are keyed by their instance), ``on_run``, ``on_result`` and
    ``on_requests``: as in :func:`compare`. ``on_case(label, frame)`` is called with each
    case's :func:`compare` table as soon as it is done (incremental results); the
    rejection warnings of every case are in the summary's ``attrs["warnings"]``."""
    import pandas as pd

    items = list(instances.items()) if isinstance(instances, Mapping) else \
        [(f"{i}:{inst.trace.name}", inst) for i, inst in enumerate(instances)]
    if not items:
        raise ValueError("robustness: give at least one instance")
    frames, warned = [], []
    for label, inst in items:
        df = compare(inst, policies, bounds, seeds, metric=metric, check=check,
                     skip_unavailable=skip_unavailable, on_run=on_run, engine=engine,
                     predictor=predictor, over=over, checkpoint=checkpoint,
                     on_result=on_result, on_requests=on_requests)
        warned += [f"{label}: {w}" for w in df.attrs["warnings"]]
        if on_case is not None:
            on_case(str(label), df)
        df.attrs = {}
        df.insert(0, "instance", str(label))
        frames.append(df)
    runs = pd.concat(frames, ignore_index=True)
    out = robustness_summary(common_cases(runs)[0], metric)
    out.attrs["warnings"] = warned
    return (out, runs) if return_runs else out


__all__ = ["BASELINES", "PREFERRED_PRINCIPLED", "SOLVED_POLICIES", "BoundViolation",
           "PolicyUnavailable", "common_cases", "compare", "default_policies", "describe_policy",
           "resolve_policies", "robustness", "robustness_summary", "solved_policy", "Samples"]
