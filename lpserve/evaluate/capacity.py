"""Capacity search: the highest load at which a policy meets p99 TTFT and TPOT objectives.

Load is a rate multiplier ``x`` of a workload: every arrival time is divided by ``x``
(:meth:`lpserve.trace.Trace.scale_rate`), so lengths and burstiness are kept. A run at
load ``x`` *meets* the objectives if the 99th percentile of TTFT over **all** requests
(a request that never produced a token counts as infinite) is at most ``slo.ttft_s`` and
the 99th percentile of TPOT over the requests that finished is at most ``slo.tpot_s``.
Runs stop at a horizon (``drain_s`` after the last scaled arrival, unless the instance has
one), so an overloaded run ends quickly and its unfinished requests count as misses.

Statistical rule. Each replication (an instance: another seed of a generator, or another
window of a trace) is searched on its own: the bracket ``[x_lo, x_hi]`` (``x_lo`` met,
``x_hi`` missed) is found by doubling or halving from ``start``, then bisected until
``x_hi / x_lo <= 1 + rel_tol``; that replication's capacity is ``x_lo``. With ``R``
replications the result is the mean of the ``R`` capacities with a two-sided Student-t
confidence interval at ``confidence`` (``R >= 2``), beside their minimum (the load every
replication met) and maximum. The search assumes that meeting the objectives is monotone
in load; :attr:`CapacityResult.monotone_violations` counts the runs that contradicted it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["CapacityResult", "bisect_capacity", "capacity", "meets_slo"]


def meets_slo(result: Any, ttft_s: float, tpot_s: float,
              quantile: float = 99.0) -> tuple[bool, float, float]:
    """``(met, p99 TTFT, p99 TPOT)`` of a :class:`~lpserve.sim.Result` (see the module
    docstring: TTFT over every request, inf where no token came; TPOT over finished ones)."""
    a = result.arrays
    tt = np.where(np.isfinite(a["first_token_s"]), a["ttft_s"], np.inf)
    fin = a["status"] == "finished"
    tp = a["tpot_s"][fin]
    tp = tp[np.isfinite(tp)]
    q_tt = float(np.percentile(tt, quantile, method="higher")) if tt.size else 0.0
    q_tp = float(np.percentile(tp, quantile, method="higher")) if tp.size else 0.0
    return bool(q_tt <= ttft_s and q_tp <= tpot_s), q_tt, q_tp


def bisect_capacity(passes: Callable[[float], bool], *, start: float = 1.0,
                    rel_tol: float = 0.02, max_steps: int = 40,
                    bounds: tuple[float, float] = (1e-6, 1e6),
                    check_below: Sequence[float] = ()) -> dict[str, Any]:
    """Largest ``x`` with ``passes(x)`` (assumed monotone: true below, false above), to a
    relative tolerance, by doubling or halving from ``start`` and geometric bisection.
    Returns ``{"capacity": x_lo, "x_hi": x_hi, "evaluated": [(x, ok)...],
    "monotone_violations": n}`` where ``n`` counts the loads ``f * x_lo`` (``f`` in
    ``check_below``, each in (0, 1)) that failed; ``capacity`` is 0 if even ``bounds[0]``
    fails and ``inf`` if ``bounds[1]`` passes."""
    if any(not 0 < f < 1 for f in check_below):
        raise ValueError(f"bisect_capacity: check_below fractions must be in (0, 1), got "
                         f"{list(check_below)}")
    if not (start > 0 and rel_tol > 0):
        raise ValueError(f"bisect_capacity: start and rel_tol must be > 0, got {start}, "
                         f"{rel_tol}")
    seen: list[tuple[float, bool]] = []

    def ev(x: float) -> bool:
        ok = bool(passes(x))
        seen.append((x, ok))
        return ok

    lo, hi = None, None
    x = float(start)
    if ev(x):
        lo = x
        while hi is None:
            x *= 2.0
            if x > bounds[1]:
                return _bisect_out(math.inf, math.inf, seen, 0)
            if ev(x):
                lo = x
            else:
                hi = x
    else:
        hi = x
        while lo is None:
            x /= 2.0
            if x < bounds[0]:
                return _bisect_out(0.0, hi, seen, 0)
            if ev(x):
                lo = x
            else:
                hi = x
    steps = 0
    while hi / lo > 1.0 + rel_tol and steps < max_steps:
        mid = math.sqrt(lo * hi)
        if ev(mid):
            lo = mid
        else:
            hi = mid
        steps += 1
    viol = sum(1 for f in check_below if not ev(f * lo))
    return _bisect_out(lo, hi, seen, viol)


def _bisect_out(lo: float, hi: float, seen: list, viol: int) -> dict[str, Any]:
    return {"capacity": lo, "x_hi": hi, "evaluated": seen, "monotone_violations": viol}


@dataclass
class CapacityResult:
    """Outcome of :func:`capacity`.

    Attributes:
        policy: the policy's name; ttft_s, tpot_s: the objectives (s).
        load: mean capacity over replications (rate multiplier of the workload).
        rate_rps: ``load`` times the mean arrival rate of the replications (requests/s).
        ci: ``(lo, hi)`` Student-t confidence interval of ``load`` (NaN for one
            replication); confidence: its level.
        min_load, max_load: the smallest and largest replication capacity.
        per_replication: each replication's capacity; runs: every simulation
            ``{"replication", "load", "met", "ttft_p99_s", "tpot_p99_s"}``.
        monotone_violations: re-runs below a replication's capacity (``check_below``)
            that missed the objectives (the monotonicity the search assumes).
        rel_tol: bisection tolerance; wall_s: total seconds.
    """

    policy: str
    ttft_s: float
    tpot_s: float
    load: float
    rate_rps: float
    ci: tuple[float, float]
    confidence: float
    min_load: float
    max_load: float
    per_replication: list[float]
    runs: list[dict[str, Any]] = field(default_factory=list)
    monotone_violations: int = 0
    rel_tol: float = 0.02
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-ready)."""
        from dataclasses import asdict

        return asdict(self)


def capacity(instances: Any, policy: Any, *, slo: Any = None, start: float = 1.0,
             rel_tol: float = 0.02, confidence: float = 0.95, drain_s: float | None = None,
             seed: int = 0, quantile: float = 99.0, check_below: Sequence[float] = (),
             make_policy: Callable[[], Any] | None = None,
             predictor: Any = None) -> CapacityResult:
    """Highest load multiplier at which ``policy`` meets ``slo`` (default: each
    instance's) on every replication in ``instances`` (an Instance or a sequence of them),
    with the statistical rule of the module docstring.

    ``policy`` is a registered name or a Policy (copied fresh for every run with
    ``make_policy`` or a pickle round trip). ``drain_s``: seconds after the last scaled
    arrival before the horizon (default ``10 * slo.ttft_s``, at least 30 s).
    ``predictor``: output-length predictor of every run, as in
    :func:`lpserve.registry.simulate` (a spec such as ``"history"``, a Predictor, or
    ``"none"``); a policy that reads predictions needs one on a trace without them.
    """
    import pickle

    from lpserve.instance import Instance
    from lpserve.registry import make_policy as registered
    from lpserve.registry import simulate

    insts: Sequence[Instance] = [instances] if isinstance(instances, Instance) \
        else list(instances)
    if not insts or any(not isinstance(i, Instance) for i in insts):
        raise ValueError("capacity: instances must be an Instance or a non-empty sequence "
                         "of them")
    if not 0 < confidence < 1:
        raise ValueError(f"capacity: confidence must be in (0, 1), got {confidence}")
    if isinstance(policy, str):
        name = policy
        fresh = make_policy or (lambda: registered(name))
    else:
        name = policy.name
        blob = pickle.dumps(policy)
        fresh = make_policy or (lambda: pickle.loads(blob))
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    caps, viol = [], 0
    obj = slo or insts[0].slo
    for r, inst in enumerate(insts):
        s = slo or inst.slo
        if not (math.isfinite(s.ttft_s) and math.isfinite(s.tpot_s)):
            raise ValueError(f"capacity: replication {r} has no finite SLO "
                             f"(ttft_s={s.ttft_s}, tpot_s={s.tpot_s}); give slo=")
        drain = drain_s if drain_s is not None else max(30.0, 10.0 * s.ttft_s)

        def passes(x: float, inst=inst, s=s, drain=drain, r=r) -> bool:
            tr = inst.trace.scale_rate(x)
            horizon = inst.horizon_s if inst.horizon_s is not None else \
                float(tr.arrival_s[-1]) + drain
            res = simulate(inst.with_(trace=tr, horizon_s=horizon), fresh(), seed=seed,
                           predictor=predictor)
            ok, q_tt, q_tp = meets_slo(res, s.ttft_s, s.tpot_s, quantile)
            runs.append({"replication": r, "load": x, "met": ok, "ttft_p99_s": q_tt,
                         "tpot_p99_s": q_tp})
            return ok

        out = bisect_capacity(passes, start=start, rel_tol=rel_tol, check_below=check_below)
        caps.append(float(out["capacity"]))
        viol += int(out["monotone_violations"])
    c = np.asarray(caps)
    mean = float(c.mean())
    if c.size >= 2 and np.all(np.isfinite(c)):
        from scipy import stats

        half = float(stats.t.ppf(0.5 + confidence / 2, c.size - 1) * c.std(ddof=1)
                     / math.sqrt(c.size))
        ci = (mean - half, mean + half)
    else:
        ci = (float("nan"), float("nan"))
    rate = float(np.mean([i.trace.rate_per_s for i in insts])) * mean
    return CapacityResult(policy=name, ttft_s=float(obj.ttft_s), tpot_s=float(obj.tpot_s),
                          load=mean, rate_rps=rate, ci=ci, confidence=confidence,
                          min_load=float(c.min()), max_load=float(c.max()),
                          per_replication=caps, runs=runs, monotone_violations=viol,
                          rel_tol=rel_tol, wall_s=time.perf_counter() - t0)
