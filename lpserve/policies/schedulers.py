"""Competitive batch schedulers (``Scheduler.rank``; lower runs first, ``+inf`` holds back).

=================  ===========================================================================
``SJFOracle``      shortest job first by true output length (clairvoyant); with the engine's
                   ``priority_preemption`` and ``remaining=True`` it is SRPT.
``WSPT``           Smith's rule: true length over a per-tenant weight (clairvoyant).
``SJFPredicted``   shortest predicted output first (``predicted_lo``/``predicted_hi``).
``LAS``            least attained service (SETF / foreground-background), time sliced.
``RoundRobin``     least recently served first, time sliced (processor sharing in the limit).
``MemoryCheckedSF`` shortest first with a future-memory check: MC-SF (Jaillet et al.),
                   A_max and A_min (Chen, Ye, Zhou) by the length each assumes.
``SLOAware``       JITServe-style: least slack first among requests that can still meet
                   their SLO, the rest after them as best effort.
=================  ===========================================================================

Single-machine reference disciplines for the classical bounds (fluid, event driven):
:func:`single_machine_flow_times`.

Feng-Yang-Zhang's geometric slicing / batching (GSA / GBA, arXiv 2601.22996) is not
provided: their phase lengths, pipeline offsets and large-memory regime are not stated in
the parts of the paper lpserve could consult (its abstract and summaries), so no faithful
rule can be written.
"""
from __future__ import annotations

import abc
import math
from typing import Any

import numpy as np

from lpserve.policy import Claim, Meta, Scheduler, SchedulerView, tick_index

_PROOF_CLASSIC = "proofs/srpt-wspt-classical.md"
_PROOF_RR = "proofs/sched-round-robin.md"
_PROOF_SETF = "proofs/sched-setf-speed.md"
_PROOF_MCSF = "proofs/mcsf-memory-safety.md"
_PROOF_LB = "proofs/sched-kv-lower-bound.md"
_RUNNING_RANK = -1.0e18  # a started, non-preemptible request always keeps its place


def _check_pos(policy: str, field: str, value: Any) -> float:
    v = float(value)
    if not v > 0 or not math.isfinite(v):
        raise ValueError(f"{policy}: {field} must be a positive finite number, got {value!r}")
    return v


class TickCached(Scheduler):
    """Base of schedulers whose ranks change with time or carry state: they decide only
    at events and quantum ticks. ``rank`` recomputes (``_rank``) when the replica's
    candidates or running flags changed or a new ``quantum_s`` tick began since its last
    decision, and otherwise repeats the last ranks. The engine may consult a scheduler at
    any iteration end (other replicas' arrivals split its decode runs; the reference mode
    asks every iteration), so this keeps results independent of how often it is asked."""

    @abc.abstractmethod
    def _rank(self, view: SchedulerView) -> np.ndarray:
        """Fresh ranks of ``view``'s candidates (called only when a decision is due)."""

    def rank(self, view: SchedulerView) -> np.ndarray:
        """Ranks of ``view``'s candidates (float64 ``(n,)``, lower runs first): fresh from
        ``_rank`` when this replica's candidates or running flags changed or a new ``quantum_s``
        tick began since the last call, else a copy of the last ranks."""
        cache = self.__dict__.setdefault("_tick_cache", {})
        q = self.quantum_s
        tick = tick_index(view.now_s, q) if q else 0
        key = (tick, view.request.tobytes(), view.running.tobytes())
        hit = cache.get(view.replica)
        if hit is not None and hit[0] == key:
            return hit[1].copy()
        r = np.asarray(self._rank(view), np.float64)
        cache[view.replica] = (key, r.copy())
        return r

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget the cached ranks of every replica."""
        self.__dict__["_tick_cache"] = {}


# ====================================================================== clairvoyant
class SJFOracle(Scheduler):
    """Shortest (remaining) job first by true output length.

    ``remaining=False`` ranks by total output tokens (SJF); ``remaining=True`` by output
    tokens still to produce (SRPT when the engine preempts by priority). Ties: queue order.
    """

    def __init__(self, remaining: bool = True) -> None:
        self.remaining = bool(remaining)
        self.name = "srpt-oracle" if remaining else "sjf-oracle"
        claims = (Claim("SRPT minimizes total flow time on one preemptive machine "
                        "(1|r_j,pmtn|sum F_j)", _PROOF_CLASSIC,
                        "tests/properties/test_sched_classical.py::"
                        "test_srpt_in_simulator_equals_brute_force_optimum"),) \
            if remaining else ()
        self.meta = Meta(clairvoyant=True, claims=claims)

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        return "sjf", [0.0], [int(self.remaining)]

    def rank(self, view: SchedulerView) -> np.ndarray:
        """True output tokens still to produce (``remaining``) or in total, float64
        ``(n,)``; lower runs first."""
        out = view.output_tokens.astype(np.float64)
        return out - view.generated_tokens if self.remaining else out.copy()


class WSPT(Scheduler):
    """Smith's rule: rank = true output tokens / weight, weight looked up by tenant
    (``weights[tenant]``, default 1.0 for unknown tenants)."""

    name = "wspt-oracle"
    meta = Meta(clairvoyant=True, claims=(Claim(
        "Smith's rule minimizes total weighted completion time with all jobs at 0 "
        "(1||sum w_j C_j)", _PROOF_CLASSIC,
        "tests/properties/test_sched_classical.py::test_wspt_in_simulator_is_optimal"),))

    def __init__(self, weights: dict[int, float] | None = None) -> None:
        self.weights = dict(weights or {})
        for k, w in self.weights.items():
            _check_pos("wspt-oracle", f"weights[{k}]", w)

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        ten = sorted(self.weights)
        return "wspt", [float(self.weights[t]) for t in ten] or [0.0], [len(ten), *ten]

    def rank(self, view: SchedulerView) -> np.ndarray:
        """True output tokens divided by the tenant's weight, float64 ``(n,)``: the
        largest weight per token runs first."""
        w = np.array([self.weights.get(int(t), 1.0) for t in view.tenant], np.float64)
        return view.output_tokens.astype(np.float64) / w


# ====================================================================== predicted
def predicted_tokens(view: SchedulerView, which: str) -> np.ndarray | None:
    """Predicted output tokens per candidate: ``"lo"``, ``"hi"`` or ``"mid"`` of the
    view's interval; ``None`` when the view carries no predictions."""
    if view.predicted_lo is None or view.predicted_hi is None:
        return None
    lo = view.predicted_lo.astype(np.float64)
    hi = view.predicted_hi.astype(np.float64)
    return {"lo": lo, "hi": hi, "mid": 0.5 * (lo + hi)}[which]


class SJFPredicted(Scheduler):
    """Shortest predicted job first: rank = predicted output tokens (``which`` end of the
    interval) minus tokens already generated (floored at 1 so an under-predicted request
    keeps a finite rank). Without predictions in the view every rank is the arrival time,
    so the policy is FCFS."""

    name = "sjf-predicted"
    reads_predictions = True

    def __init__(self, which: str = "mid") -> None:
        if which not in ("lo", "hi", "mid"):
            raise ValueError(f"sjf-predicted: which must be 'lo', 'hi' or 'mid', got {which!r}")
        self.which = which

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        return "sjf-predicted", [0.0], [("lo", "hi", "mid").index(self.which)]

    def rank(self, view: SchedulerView) -> np.ndarray:
        """Predicted output tokens minus tokens generated, floored at 1, float64 ``(n,)``;
        ``arrival_s`` (FCFS) when the view has no predictions."""
        p = predicted_tokens(view, self.which)
        if p is None:
            return view.arrival_s.astype(np.float64).copy()
        return np.maximum(p - view.generated_tokens, 1.0)


# ====================================================================== time sliced
class LAS(TickCached):
    """Least attained service (SETF): rank = output tokens generated so far (attained
    decode service) in buckets of ``service_quantum_tokens``, ties by queue order.
    ``quantum_s`` makes the engine re-rank at least that often, so a running request is
    preempted (with ``priority_preemption``) once a waiting one is a whole bucket behind
    it. With buckets of one token LAS shares the engine like processor sharing and swaps
    a request in and out every iteration; larger buckets bound that churn."""

    name = "las"
    meta = Meta(claims=(Claim(
        "SETF on a (1+eps)-speed machine is (1 + 1/eps)-competitive for total flow time "
        "against speed-1 SRPT", _PROOF_SETF,
        "tests/properties/test_sched_classical.py::test_las_policy_is_setf_in_the_simulator"),))

    def __init__(self, quantum_s: float = 0.05, service_quantum_tokens: int = 32) -> None:
        self.quantum_s = _check_pos("las", "quantum_s", quantum_s)
        self.service_quantum_tokens = int(_check_pos("las", "service_quantum_tokens",
                                                     service_quantum_tokens))

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        return "las", [self.quantum_s], [self.service_quantum_tokens]

    def _rank(self, view: SchedulerView) -> np.ndarray:
        return np.floor_divide(view.generated_tokens, self.service_quantum_tokens).astype(
            np.float64)


class RoundRobin(TickCached):
    """Round robin: rank = the last time the request was seen running (its arrival if
    never), so the least recently served runs first; re-ranked every ``quantum_s``.
    State: last-served time per request id."""

    name = "round-robin-sched"
    meta = Meta(claims=(Claim(
        "Processor sharing is (2 - 2/(n+1))-competitive for total completion time with all "
        "jobs at 0, exactly 2n/(n+1) on n equal jobs", _PROOF_RR,
        "tests/properties/test_sched_classical.py::test_round_robin_within_two_of_opt"),))

    def __init__(self, quantum_s: float = 0.5) -> None:
        self.quantum_s = _check_pos("round-robin-sched", "quantum_s", quantum_s)
        self._served: dict[int, float] = {}

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget the cached ranks and every request's last-served time."""
        super().reset(cluster, rng)
        self._served = {}

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        return "round-robin", [self.quantum_s], [0]

    def _rank(self, view: SchedulerView) -> np.ndarray:
        req = view.request.tolist()
        run = view.running.tolist()
        out = np.empty(len(req), np.float64)
        # served "in this quantum": the tick start, so the rank does not depend on when
        # within the quantum the engine happens to ask
        tick_s = tick_index(view.now_s, self.quantum_s) * self.quantum_s
        for k, i in enumerate(req):
            if run[k]:
                self._served[i] = tick_s
            out[k] = self._served.get(i, float(view.arrival_s[k]))
        return out


# ====================================================================== memory checked
def future_memory_fits(base_tokens: np.ndarray, remaining: np.ndarray, capacity_tokens: float,
                       slack_tokens: float = 0.0) -> bool:
    """Whether requests holding ``base_tokens[k] + d`` tokens ``d`` iterations from now,
    for ``d = 1 .. remaining[k]``, fit in ``capacity_tokens`` at every future iteration
    (each active request also charged ``slack_tokens``). The load only rises between
    completions, so it is checked at each ``remaining`` value (``models/schedule-ip.md``
    (10))."""
    if base_tokens.size == 0:
        return True
    order = np.argsort(-remaining, kind="stable")
    rem = remaining[order]
    base = base_tokens[order]
    cnt = np.arange(1, rem.size + 1)
    load = np.cumsum(base) + cnt * (rem + slack_tokens)  # requests with remaining >= rem[k]
    # only the last entry of each group of equal remaining values counts all of them
    last = np.r_[rem[1:] != rem[:-1], True]
    return bool(np.all(load[last] <= capacity_tokens))


class MemoryCheckedSF(TickCached):
    """Shortest first with a future-memory check; started requests are never preempted
    by rank (they rank first) and the longest feasible prefix of the waiting requests in
    length order is released, the rest held back (``+inf``).

    ``assume`` is the output length each request is planned with:

    * ``"oracle"`` — the true length (MC-SF with exact predictions; clairvoyant);
    * ``"hi"`` — the interval's upper end ``u`` (MC-SF with õ = u, and A_max);
    * ``"lo"`` — A_min: the pseudo lower bound ``max(l, generated)``, raised while the
      request decodes; memory can then run out, and the engine's memory preemption evicts
      the running request with the largest pseudo length first (its rank).

    Without predictions in the view, ``default_tokens`` stands in for the interval; a
    planned peak above the whole memory is cut to the memory, and an idle replica always
    releases its first waiting request (the engine admits or rejects it). The
    plan is redone at events and every ``quantum_s`` (as the round model redoes it every
    round: a request that does not fit now may fit later, when the running requests' peaks
    are nearer). Run it with ``batching="mixed"`` (new requests join the running batch in
    the same iteration, as in the round model).
    Memory is the replica's ``total_blocks * block_tokens`` tokens; each request is
    charged ``block_tokens - 1`` extra tokens for block rounding, so with ``"oracle"`` or
    ``"hi"`` (and u >= the truth) the engine never runs out of KV memory.
    """

    def __init__(self, assume: str = "hi", default_tokens: int = 2048,
                 max_batch: int = 256, quantum_s: float = 0.05) -> None:
        if assume not in ("oracle", "hi", "lo"):
            raise ValueError(f"memory-checked SF: assume must be 'oracle', 'hi' or 'lo', "
                             f"got {assume!r}")
        self.assume = assume
        self.reads_predictions = assume != "oracle"
        self.default_tokens = int(_check_pos("mcsf", "default_tokens", default_tokens))
        self.max_batch = int(_check_pos("mcsf", "max_batch", max_batch))
        self.quantum_s = _check_pos("mcsf", "quantum_s", quantum_s)
        self.name = {"oracle": "mcsf-oracle", "hi": "mcsf", "lo": "a-min"}[assume]
        claims = (Claim("MC-SF never exceeds KV memory when planned lengths are >= the true "
                        "ones, and its total latency is >= OPT", _PROOF_MCSF,
                        "tests/properties/test_sched_mcsf.py::"
                        "test_mcsf_policy_never_preempts_and_is_not_below_opt"),
                  Claim("no deterministic online algorithm is O(1)-competitive in the KV "
                        "model: an adversary forces a ratio growing like sqrt(n)", _PROOF_LB,
                        "tests/properties/test_sched_mcsf.py::"
                        "test_lower_bound_adversary_ratio_grows_with_n")) \
            if assume != "lo" else ()
        self.meta = Meta(clairvoyant=assume == "oracle", claims=claims)

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        return "mcsf", [self.quantum_s], [("oracle", "hi", "lo").index(self.assume),
                                          self.default_tokens, self.max_batch]

    def _planned(self, view: SchedulerView) -> np.ndarray:
        if self.assume == "oracle":
            return view.output_tokens.astype(np.float64)
        p = predicted_tokens(view, self.assume)
        if p is None:
            p = np.full(len(view), float(self.default_tokens))
        if self.assume == "lo":
            p = np.maximum(p, view.generated_tokens + 1.0)
        return p

    def _rank(self, view: SchedulerView) -> np.ndarray:
        n = len(view)
        cap = float(view.total_blocks * view.block_tokens)
        slack = float(view.block_tokens - 1)
        gen = view.generated_tokens.astype(np.float64)
        # a planned peak above the whole memory could never start: plan with the memory
        # (the request may then outgrow its plan, and the engine preempts)
        plan = np.minimum(self._planned(view), cap - slack - view.prompt_tokens)
        plan = np.maximum(plan, gen + 1.0)
        ctx = view.prompt_tokens.astype(np.float64) + gen
        run = view.running
        out = np.full(n, math.inf)
        if self.assume == "lo":
            out[run] = plan[run]  # the largest pseudo length is the memory victim
        else:
            out[run] = _RUNNING_RANK
        rem = np.maximum(plan - gen, 1.0)
        base = [ctx[run] + 0.0]
        rems = [rem[run]]
        wait = np.flatnonzero(~run)
        order = wait[np.lexsort((wait, view.arrival_s[wait], plan[wait]))]
        seats = self.max_batch - int(run.sum())
        b_all, r_all = np.concatenate(base), np.concatenate(rems)
        for j in order[:max(seats, 0)]:
            b2 = np.r_[b_all, ctx[j]]
            r2 = np.r_[r_all, rem[j]]
            if not future_memory_fits(b2, r2, cap, slack):
                if b_all.size == 0:  # idle replica: release it and let the engine decide
                    out[j] = plan[j]
                break
            b_all, r_all = b2, r2
            out[j] = plan[j]
        return out


# ====================================================================== SLO aware
class SLOAware(TickCached):
    """JITServe-style just-in-time ordering under SLOs.

    Each request's deadline is ``arrival + ttft_s + (planned - 1) * tpot_s`` (a streaming
    request: its last token's due time) or ``arrival + e2e_s`` (a deadline request),
    whichever is earlier, with ``planned`` its predicted output (interval upper end, else
    ``default_tokens``); its slack is ``deadline - now - (planned - generated) *
    iteration_s``. Requests that can still meet the deadline (slack >= 0) run least slack
    first, so each gets service just in time rather than early; late ones follow, oldest
    first, then requests without any deadline. Re-ranked every ``quantum_s``.

    ``ttft_s``, ``tpot_s`` and ``e2e_s`` left at ``None`` (the default) are the instance's
    SLO, per tenant the SLO of its service tier (``Instance.tiers``), taken by
    :meth:`bind` when a run starts; one set here applies to every request. A run where no
    request has a finite target is refused. ``iteration_s`` is the time of one decode
    iteration assumed for the slack. After :meth:`bind`, ``tenant_targets`` maps a tenant
    to its ``(ttft_s, tpot_s, e2e_s)``.
    """

    name = "slo-aware"
    reads_predictions = True
    KEYS = ("ttft_s", "tpot_s", "e2e_s")

    def __init__(self, ttft_s: float | None = None, tpot_s: float | None = None,
                 iteration_s: float = 0.05, default_tokens: int = 256,
                 quantum_s: float = 0.1, e2e_s: float | None = None) -> None:
        self.target = {k: None if v is None else _check_pos(self.name, k, v)
                       for k, v in (("ttft_s", ttft_s), ("tpot_s", tpot_s), ("e2e_s", e2e_s))}
        self.ttft_s, self.tpot_s, self.e2e_s = (self.target[k] for k in self.KEYS)
        self.iteration_s = _check_pos(self.name, "iteration_s", iteration_s)
        self.default_tokens = int(_check_pos(self.name, "default_tokens", default_tokens))
        self.quantum_s = _check_pos(self.name, "quantum_s", quantum_s)
        self._slo: Any = None
        self.tenant_targets: dict[int, tuple[float, float, float]] = {}

    def bind(self, cluster: Any, slo: Any, tiers: tuple = ()) -> None:
        """Targets the user left unset from ``slo`` and, per tenant, from ``tiers``."""
        self._slo = slo

        def pick(src: Any) -> tuple[float, float, float]:
            return tuple(float(self.target[k]) if self.target[k] is not None
                         else float(getattr(src, k, math.inf)) for k in self.KEYS)

        self.ttft_s, self.tpot_s, self.e2e_s = pick(slo)
        self.tenant_targets = {int(u): pick(t.slo) for t in tiers for u in t.tenants}

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Reset the base scheduler; raise ``ValueError`` when neither the user nor the
        instance (:meth:`bind`) gave a finite target for any tenant."""
        super().reset(cluster, rng)
        rows = [(self.ttft_s, self.tpot_s, self.e2e_s), *self.tenant_targets.values()]
        finite = any(r[2] is not None and math.isfinite(r[2]) or
                     (r[0] is not None and r[1] is not None and math.isfinite(r[0])
                      and math.isfinite(r[1])) for r in rows)
        if not finite:
            raise ValueError(
                f"{self.name}: no SLO target: ttft_s/tpot_s (or e2e_s) are not set and the "
                f"instance's SLO leaves them infinite ({self._slo or 'no SLO given'}); give "
                "the instance lp.SLO(ttft_s=..., tpot_s=...) or set them")

    def _targets(self, view: SchedulerView) -> tuple[np.ndarray, ...]:
        n = len(view)
        base = [np.full(n, math.inf if v is None else float(v))
                for v in (self.ttft_s, self.tpot_s, self.e2e_s)]
        if self.tenant_targets:
            for k, u in enumerate(view.tenant.tolist()):
                row = self.tenant_targets.get(int(u))
                if row is not None:
                    for j in range(3):
                        base[j][k] = row[j]
        return tuple(base)

    def kernel_spec(self) -> tuple[str, list[float], list[int]] | None:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`);
        ``None`` (ranked in Python) with per-tenant tier targets, which the twin lacks."""
        if self.tenant_targets:
            return None
        return "slo-aware", [self.quantum_s, self.ttft_s, self.tpot_s, self.iteration_s,
                             float(self.default_tokens), self.e2e_s], [0]

    def _rank(self, view: SchedulerView) -> np.ndarray:
        p = predicted_tokens(view, "hi")
        plan = np.full(len(view), float(self.default_tokens)) if p is None else p
        gen = view.generated_tokens.astype(np.float64)
        plan = np.maximum(plan, gen + 1.0)
        ttft, tpot, e2e = self._targets(view)
        with np.errstate(invalid="ignore"):
            stream = view.arrival_s + ttft + (plan - 1.0) * tpot
        deadline = np.fmin(np.where(np.isnan(stream), np.inf, stream), view.arrival_s + e2e)
        slack = deadline - view.now_s - (plan - gen) * self.iteration_s
        late = slack < 0
        out = np.where(late, 1.0e12 + view.arrival_s, slack)
        return np.where(np.isinf(deadline), 2.0e12 + view.arrival_s, out)


# ====================================================================== single machine
def single_machine_flow_times(discipline: str, release: Any, size: Any,
                              speed: float = 1.0) -> np.ndarray:
    """Flow times ``C_j - r_j`` of one machine of ``speed`` under a fluid discipline.

    ``discipline``: ``"srpt"`` (shortest remaining first), ``"ps"`` (processor sharing:
    equal rates to all jobs present), ``"setf"`` (equal rates to the jobs of least
    attained work), ``"fcfs"``. Event driven and exact up to float rounding.
    """
    if discipline not in ("srpt", "ps", "setf", "fcfs"):
        raise ValueError(f"discipline must be 'srpt', 'ps', 'setf' or 'fcfs', got "
                         f"{discipline!r}")
    r = np.asarray(release, np.float64)
    p = np.asarray(size, np.float64)
    if r.shape != p.shape or r.ndim != 1:
        raise ValueError(f"release and size must be 1-D of one length, got {r.shape}, {p.shape}")
    if np.any(p <= 0):
        raise ValueError(f"size must be > 0, got {p.min()}")
    speed = _check_pos("single_machine_flow_times", "speed", speed)
    n = r.size
    rem, att = p.copy(), np.zeros(n)
    done = np.full(n, np.nan)
    t, eps = 0.0, 1e-12
    order = np.argsort(r, kind="stable")
    while np.isnan(done).any():
        alive = np.flatnonzero((r <= t + eps) & np.isnan(done))
        future = r[np.isnan(done) & (r > t + eps)]
        if alive.size == 0:
            t = float(future.min())
            continue
        rate = np.zeros(n)
        if discipline == "srpt":
            j = alive[np.lexsort((alive, rem[alive]))[0]]
            rate[j] = speed
        elif discipline == "fcfs":
            j = next(k for k in order if k in set(alive.tolist()))
            rate[j] = speed
        elif discipline == "ps":
            rate[alive] = speed / alive.size
        else:
            low = alive[att[alive] <= att[alive].min() + 1e-9]
            rate[low] = speed / low.size
        act = np.flatnonzero(rate > 0)
        dt = float(np.min(rem[act] / rate[act]))
        if future.size:
            dt = min(dt, float(future.min()) - t)
        if discipline == "setf":  # the least-attained group catches up with the next one
            above = att[alive][att[alive] > att[act[0]] + 1e-9]
            if above.size:
                dt = min(dt, (float(above.min()) - att[act[0]]) / rate[act[0]])
        t += dt
        rem[act] -= rate[act] * dt
        att[act] += rate[act] * dt
        fin = act[rem[act] <= 1e-9]
        done[fin] = t
        rem[fin] = 0.0
    return done - r


# ====================================================================== factories
def scheduled(make_scheduler: Any, name: str, *, preemptive: bool = False,
              engine: str = "vllm-v0", engine_defaults: dict[str, Any] | None = None,
              **scheduler_defaults: Any):
    """Registry factory: ``make_scheduler(**kw)`` on the ``engine`` baseline. Keyword
    arguments of the factory that are :class:`~lpserve.policy.EngineConfig` fields (or
    ``router``) configure the engine; the rest go to the scheduler. ``preemptive`` turns on
    ``priority_preemption`` with swap preemption (recompute when host memory is full)."""
    from lpserve.policies.baselines import ENGINE_FIELDS, engine_policy

    eng_fixed = dict(engine_defaults or {})
    if preemptive:
        eng_fixed.update(priority_preemption=True, preemption="swap")

    def factory(**params: Any):
        eng = {k: v for k, v in params.items()
               if k in ENGINE_FIELDS or k in ("router", "decode_router")}
        kw = {**scheduler_defaults,
              **{k: v for k, v in params.items() if k not in eng}}
        try:
            sched = make_scheduler(**kw)
        except TypeError as exc:
            raise ValueError(f"policy {name!r}: bad scheduler parameter(s) {sorted(kw)}: "
                             f"{exc}") from None
        pol = engine_policy(engine, name=name, **{**eng_fixed, **eng})
        return pol.with_(scheduler=sched)

    factory.__name__ = name.replace("-", "_")
    return factory
