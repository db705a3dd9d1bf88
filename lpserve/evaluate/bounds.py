"""Lower bounds on the latency metrics of a simulated run, by flattened metric key.

A *bound* turns an instance into per-metric lower bounds over any set of requests:

* ``"cost-bound"`` (:class:`CostModelBound`) — the cost-model bound of
  :mod:`lpserve.opt.lower_bounds` (``models/lower-bounds.md`` (5)–(9),
  ``proofs/cost-bound.md``). Per request ``i`` it gives a least TTFT (its prefill at the best
  per-token rate with every prefix block that another request shares cached), a least end-to-end latency
  (prefill plus ``o_i - 1`` decode iterations alone, ``latency_lb_s``) and so a least TPOT
  (the decode part over ``o_i - 1``). Since every finished request is at least its own
  bound, every mean and every quantile of the per-request bounds bounds the same statistic
  of the simulated values over the same requests. The mean end-to-end bound also uses the
  KV-memory term (order statistics of completion times, (9), with shared prefix blocks
  counted once), which holds for any subset of the requests; requests released by a
  parent enter it with their own least latency only.
* :class:`ClaimedBound` — fixed values computed elsewhere (a paper, another solver), checked
  as given against every policy.
* :func:`quantile_intervals` — the intervals around the smallest p99 TTFT and p99 E2E of
  any schedule: the cost bound's p99 below, the best simulated policy's above.

Metric keys are the DESIGN keys flattened: ``e2e_s_mean``, ``ttft_s_p99``, ``tpot_s_p50`` ….
A policy whose value is below a bound of the same metric over the same requests raises
:class:`BoundViolation`: a bug in the simulator or in the bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from lpserve import objectives as obj
from lpserve.evaluate.interval import TotalLatencyBound, fitting_subset
from lpserve.objectives import LATENCY_METRICS, STATS, flatten  # noqa: F401 (re-exported)

#: every flattened latency key, e.g. ``e2e_s_mean``
METRIC_KEYS = tuple(f"{m}_{q}" for m in LATENCY_METRICS for q in STATS)

#: a simulated value may fall below a bound by this much (float rounding of equal sums)
REL_TOL = 1e-6
ABS_TOL_S = 1e-9


class BoundViolation(AssertionError):
    """A lower bound is above a simulated policy's value of the same metric.

    Attributes: policy, bound, metric, bound_value, policy_value, seed, n_requests.
    """

    def __init__(self, *, policy: str, bound: str, metric: str, bound_value: float,
                 policy_value: float, seed: int, n_requests: int, scope: str) -> None:
        self.policy, self.bound, self.metric = policy, bound, metric
        self.bound_value, self.policy_value = float(bound_value), float(policy_value)
        self.seed, self.n_requests = int(seed), int(n_requests)
        super().__init__(
            f"lower bound {bound!r} on {metric} is {bound_value:.9g}, above the value "
            f"{policy_value:.9g} of policy {policy!r} (seed {seed}, over {n_requests} "
            f"requests: {scope}); a lower bound can never exceed a simulated value, so the "
            f"simulator or the bound has a bug")


class PreparedBound(Protocol):
    """A bound prepared for one instance."""

    name: str

    def values(self, served: np.ndarray) -> dict[str, float]:
        """Lower bounds by metric key over the requests where ``served`` (bool (n,)) holds."""

    # optional: ``applies_to(policy) -> bool``, False where the policy breaks the bound's
    # assumptions (absent: the bound applies to every policy); see :func:`applies`


class Bound(Protocol):
    """Something that prepares a :class:`PreparedBound` for an instance."""

    name: str
    description: str

    def prepare(self, instance: Any) -> PreparedBound:
        """The bound of ``instance`` as a :class:`PreparedBound` (computed once per instance,
        then asked for values over each policy's served requests)."""
        ...


# ================================================================== cost-model bound
@dataclass(frozen=True, eq=False)
class PerRequestBound:
    """Per-request lower bounds of one instance (arrays shape (n,), seconds).

    ``tpot_lb_s`` is NaN for one-token outputs (they have no TPOT); requests that fit on no
    replica have NaN everywhere (the simulator cannot finish them). ``memory_term`` marks
    the requests released at their arrival (no parent), the only ones the KV-memory term
    counts (``models/lower-bounds.md`` (9)).
    """

    name: str
    arrival_s: np.ndarray
    ttft_lb_s: np.ndarray
    tpot_lb_s: np.ndarray
    e2e_lb_s: np.ndarray
    area_token_s: np.ndarray
    capacity_tokens: float
    n_unservable: int = 0
    memory_term: np.ndarray | None = None

    def applies_to(self, policy: Any) -> bool:
        """The bound assumes one token per decode iteration (``proofs/cost-bound.md``);
        speculative decoding emits up to ``k + 1``, so it does not apply there."""
        return getattr(policy.engine, "speculation", None) is None

    def values(self, served: np.ndarray) -> dict[str, float]:
        """Lower bounds by metric key over the requests where ``served`` (bool ``(n,)``)
        holds and a bound exists: ``{ttft_s,tpot_s,e2e_s}_{mean,p50,p90,p99}`` in seconds from the
        per-request bounds, ``e2e_s_mean`` raised to the KV-memory area term's mean
        (``models/lower-bounds.md`` (9)) and ``total_latency_s``, the larger of that term's total
        and the sum of the per-request E2E bounds. Empty when nothing served has a bound."""
        m = np.asarray(served, bool) & np.isfinite(self.e2e_lb_s)
        out: dict[str, float] = {}
        if not m.any():
            return out
        for key, arr in (("ttft_s", self.ttft_lb_s), ("tpot_s", self.tpot_lb_s),
                         ("e2e_s", self.e2e_lb_s)):
            for q, v in obj.distribution(arr[m]).items():
                if np.isfinite(v):
                    out[f"{key}_{q}"] = v
        # the KV-memory term: order statistics of completion times over the served requests
        from lpserve.opt.lower_bounds import cost_bound_total

        mem = np.ones(m.size, bool) if self.memory_term is None else self.memory_term
        total, _ = cost_bound_total(self.arrival_s[m], self.e2e_lb_s[m], self.area_token_s[m],
                                    self.capacity_tokens, mem[m])
        out["e2e_s_mean"] = max(out["e2e_s_mean"], total / int(m.sum()))
        out["total_latency_s"] = max(total, float(self.e2e_lb_s[m].sum()))
        return out


@dataclass(frozen=True)
class CostModelBound:
    """The cost-model bound (``models/lower-bounds.md`` (5)–(9)) as per-metric bounds."""

    name: str = "cost-bound"
    description: str = ("cost-model bound: each request's prefill and decode alone at the "
                        "best per-token rate with every prefix block another request shares "
                        "cached, plus the KV-memory area term with shared blocks counted "
                        "once (models/lower-bounds.md (5)-(9))")

    def prepare(self, instance: Any) -> PerRequestBound:
        """Per-request bounds of ``instance``, solved once over the requests whose
        prompt + output fits one replica's KV capacity (the others get NaN and are counted in
        ``n_unservable``); prefix sharing is counted over every request. Raises RuntimeError if
        the bound's program does not solve."""
        from lpserve.opt.lower_bounds import (
            build_cost_bound,
            prefill_lower_bound_s,
            prefix_sharing,
            solve_cost_bound,
        )

        trace = instance.trace
        n = len(trace)
        # a heterogeneous cluster: the largest replica's KV, each prompt's fastest prefill
        costs = list({id(c): c for c in instance.replica_cost_models()}.values())
        cap = max(float(c.kv_capacity_tokens(instance.cluster.gpu_memory_fraction))
                  for c in costs)
        peak = np.asarray(trace.prompt_tokens, np.int64) + np.asarray(trace.output_tokens,
                                                                       np.int64)
        fits = peak <= cap
        # Sharing is counted over every request: one that never finishes can still have
        # computed prefix blocks another reuses. The bound itself is over the requests
        # that fit a replica (the others are never finished).
        cached, discount = prefix_sharing(trace, instance.cluster.block_tokens)
        sub = instance if fits.all() else instance.with_(trace=trace.take(fits))
        model = build_cost_bound(sub, sharing=(cached[fits], discount[fits]))
        sol = solve_cost_bound(model)
        if not sol.solved:
            raise RuntimeError(f"cost-bound did not solve: {sol.status.value} ({sol.message})")
        s = np.asarray(sub.trace.prompt_tokens, np.int64)
        o = np.asarray(sub.trace.output_tokens, np.int64)
        pre = np.min([prefill_lower_bound_s(c, s - model.cached_tokens) for c in costs],
                     axis=0)
        dec = np.maximum(model.alone_s - pre, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(o > 1, dec / np.maximum(o - 1, 1), np.nan)

        def full(x: np.ndarray) -> np.ndarray:
            a = np.full(n, np.nan)
            a[fits] = x
            return a

        parent = getattr(trace, "parent", None)
        memory_term = np.ones(n, bool) if parent is None else np.asarray(parent) < 0
        return PerRequestBound(self.name, np.asarray(trace.arrival_s, np.float64),
                               full(pre), full(tpot), full(model.alone_s),
                               full(model.area_token_s), float(model.capacity_tokens),
                               int((~fits).sum()), memory_term)


# ==================================================================== claimed bound
@dataclass(frozen=True)
class ClaimedBound:
    """Lower bounds computed elsewhere, by metric key, checked as given against every
    policy (e.g. ``ClaimedBound("paper", {"e2e_s_mean": 2.5})``)."""

    name: str
    claimed: Mapping[str, float] = field(default_factory=dict)
    description: str = "claimed bound (computed elsewhere)"

    def __post_init__(self) -> None:
        allowed = set(METRIC_KEYS) | {"total_latency_s"}
        bad = sorted(set(self.claimed) - allowed)
        if bad:
            raise ValueError(f"ClaimedBound {self.name!r}: unknown metric key(s) {bad}; "
                             f"known: {sorted(allowed)}")
        for k, v in self.claimed.items():
            if not (isinstance(v, (int, float)) and np.isfinite(v)):
                raise ValueError(f"ClaimedBound {self.name!r}: {k} must be a finite number, "
                                 f"got {v!r}")

    def prepare(self, instance: Any) -> "ClaimedBound":
        """Itself: the claimed values do not depend on the instance."""
        return self

    def values(self, served: np.ndarray) -> dict[str, float]:
        """The claimed values as given (floats, by metric key), whatever was served."""
        return {k: float(v) for k, v in self.claimed.items()}


#: bounds by name
BOUNDS: dict[str, Bound] = {
    "cost-bound": CostModelBound(),
    # total-latency bounds of lpserve.evaluate.interval (models/cost-lp.md)
    "cost-lp": TotalLatencyBound("cost-lp", 30.0, description="time-indexed LP relaxation "
                                 "in the cost model (models/cost-lp.md), 30 s limit"),
    "srpt-bound": TotalLatencyBound("srpt-bound", None, description="per-request floors and "
                                    "SRPT on the additive GPU work (models/cost-lp.md (18))"),
}


def applies(bound: Any, policy: Any) -> bool:
    """Whether prepared ``bound`` holds for ``policy`` (its ``applies_to``, else True)."""
    check = getattr(bound, "applies_to", None)
    return True if check is None else bool(check(policy))


def resolve_bounds(bounds: Sequence[Any] | None) -> list[Bound]:
    """Bound objects from names (:data:`BOUNDS`), bound objects, or ``{"name": ...,
    metric: value}`` dicts (claimed bounds). ``None`` means ``["cost-bound"]``."""
    if bounds is None:
        return [BOUNDS["cost-bound"]]
    if isinstance(bounds, (str, Mapping)) or hasattr(bounds, "prepare"):
        bounds = [bounds]
    out: list[Bound] = []
    for b in bounds:
        if isinstance(b, str):
            if b not in BOUNDS:
                raise KeyError(f"unknown bound {b!r}; known: {', '.join(sorted(BOUNDS))} "
                               f"(or pass a ClaimedBound)")
            out.append(BOUNDS[b])
        elif isinstance(b, Mapping):
            d = dict(b)
            name = d.pop("name", "claimed")
            out.append(ClaimedBound(str(name), d))
        elif hasattr(b, "prepare") and hasattr(b, "name"):
            out.append(b)
        else:
            raise ValueError(f"a bound must be a name, a bound object or a dict, got {b!r}")
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise ValueError(f"bound names must be distinct, got {names}")
    return out


def check_bound(*, policy: str, bound: str, bound_values: Mapping[str, float],
                policy_values: Mapping[str, float], seed: int, n_requests: int,
                scope: str) -> None:
    """Raise :class:`BoundViolation` if a bound exceeds the policy's value of any metric
    both define (beyond :data:`REL_TOL` relative, :data:`ABS_TOL_S` absolute)."""
    for key, lb in bound_values.items():
        v = policy_values.get(key)
        if v is None or not (np.isfinite(v) and np.isfinite(lb)):
            continue
        if v < lb - (ABS_TOL_S + REL_TOL * abs(lb)):
            raise BoundViolation(policy=policy, bound=bound, metric=key, bound_value=lb,
                                 policy_value=v, seed=seed, n_requests=n_requests,
                                 scope=scope)


#: tail metrics with an interval: the per-request cost bound's quantile is a valid lower
#: bound on the same quantile of any schedule (each request's latency is at least its
#: bound, so every order statistic is too; ``proofs/cost-bound.md``), and any simulated
#: schedule's value is an upper bound on the smallest one
QUANTILE_KEYS = ("ttft_s_p99", "e2e_s_p99")


def quantile_intervals(instance: Any, policy_quantiles: Mapping[str, Mapping[str, float]]
                       | None = None) -> dict[str, dict[str, Any]]:
    """Per key of :data:`QUANTILE_KEYS`, the interval around the smallest value any
    non-speculative schedule of ``instance``'s fitting requests achieves: ``lower_s`` (the
    quantile of the per-request cost bounds), ``upper_s`` and ``upper_name`` (the best of
    ``policy_quantiles``: label -> key -> value over every fitting request; NaN and ``""``
    without one) and ``ratio``."""
    sub, _ = fitting_subset(instance)
    prepared = resolve_bounds(["cost-bound"])[0].prepare(sub)
    low = prepared.values(np.ones(len(sub.trace), bool))
    out = {}
    for key in QUANTILE_KEYS:
        lo = float(low.get(key, math.nan))
        ups = {k: float(v[key]) for k, v in (policy_quantiles or {}).items()
               if key in v and math.isfinite(v[key])}
        name = min(ups, key=ups.get) if ups else ""
        up = ups.get(name, math.nan)
        out[key] = {"lower_s": lo, "lower_name": "cost-bound", "upper_s": up,
                    "upper_name": name,
                    "ratio": up / lo if lo > 0 and math.isfinite(up) else math.nan}
    return out


