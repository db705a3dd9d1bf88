"""Fair sharing across tenants: the Virtual Token Counter (VTC) of Sheng et al. (OSDI'24),
its weighted variant, and a tier-aware admission / shedding scheduler built on it.

=================  ===========================================================================
``VTC``            one counter per tenant (``view.tenant``) and replica of the service it
                   received, ``(w_p * prompt tokens admitted + w_q * output tokens produced)
                   / weight``; the waiting requests run in the order VTC would admit them:
                   repeatedly the oldest waiting request of the tenant with the smallest
                   counter, that counter raised by the request's prompt charge. A tenant
                   whose queue was empty is lifted to the smallest counter of the tenants
                   still waiting (or, when nobody waits, to the counter of the last tenant
                   to leave), so idle time earns no credit. Never holds a request back
                   (work conserving). ``weights`` gives weighted VTC.
``TieredShedding`` strict priority across tenant tiers, VTC order within a tier, and per
                   tier an admission cap (a request arriving to a tier with ``max_waiting``
                   admissible requests already waiting is shed) and a deadline
                   (``shed_after_s``: a request that waited longer can no longer meet its
                   tier's TTFT objective and is shed). Shed requests are held back for good
                   (rank ``+inf``; the run reports them ``held_back``).
=================  ===========================================================================

Exact accounting. A VTC object is both the scheduler and the engine's
:class:`~lpserve.policy.hooks.BudgetController` (it leaves every budget unchanged): the
engine tells it every iteration's produced tokens (``observe``, ``observe_decode_run``), so
the counters equal the service delivered at every decision, including the last tokens of
requests that finished since (a view no longer shows those). :func:`fair_policy` wires
both; a VTC used without the hook (an external engine) falls back to the generated tokens
its views show, which misses the tokens a request produced after it was last seen.
In the compiled engine (``lpserve/sim/_vtc_kernels.py``) the twin credits the same
service at each decision from the engine's per-request arrays, and after the run
:meth:`VTC.restore_service` sets the counters :meth:`VTC.counter` reports; with
``record=True``, a VTC that is not its engine's budget controller, a rebalancer or a
disaggregated cluster, VTC ranks (and meters) in Python, asked in pauses of the compiled
replicas.

Decisions are taken only when the candidates or their running flags change
(:class:`~lpserve.policies.schedulers.TickCached`), so the fast and the reference
simulation give identical results. Counters are per replica. The service-difference bound
and its proof: ``proofs/fairness-vtc.md``.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Mapping

import numpy as np

from lpserve.policies.schedulers import TickCached
from lpserve.policy import BudgetController, Claim, Meta, SchedulerView, tick_index

__all__ = ["VTC", "TieredShedding", "fair_policy", "vtc_bound"]

_PROOF = "proofs/fairness-vtc.md"
_RUNNING_RANK = -1.0e18
_TIER_SCALE = 1.0e9


def _positive(policy: str, field: str, value: Any) -> float:
    v = float(value)
    if isinstance(value, bool) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"{policy}: {field} must be a finite number > 0, got {value!r}")
    return v


def _tenant_map(policy: str, field: str, mapping: Mapping[Any, Any] | None,
                check: Any) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for k, v in dict(mapping or {}).items():
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise ValueError(f"{policy}: {field} keys must be tenant ids (int), got {k!r}")
        out[int(k)] = check(policy, f"{field}[{k}]", v)
    return out


def vtc_bound(max_prompt_tokens: int, max_output_tokens: int, max_running: int, *,
              input_price: float = 1.0, output_price: float = 2.0,
              weight: float = 1.0) -> float:
    """``U`` of ``proofs/fairness-vtc.md`` (1): the most a backlogged tenant's counter can
    exceed the smallest counter of the backlogged tenants,
    ``(w_p * L + w_q * R * O) / weight`` for prompts of at most ``L`` tokens, outputs of at
    most ``O`` tokens and at most ``R`` requests of one tenant running at once on a replica.
    Two tenants backlogged over an interval receive (weighted) service within ``2 U``."""
    for name, v in (("max_prompt_tokens", max_prompt_tokens),
                    ("max_output_tokens", max_output_tokens), ("max_running", max_running)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"vtc_bound: {name} must be a positive integer, got {v!r}")
    return (float(input_price) * max_prompt_tokens
            + float(output_price) * max_running * max_output_tokens) / float(weight)


class _Replica:
    """Counters of one replica: admitted prompt and produced output tokens per tenant
    (integers, so runs that observe the same iterations in different groupings agree to
    the bit), the lift offsets, and the waiting set at the last decision."""

    def __init__(self) -> None:
        self.prompt: dict[int, int] = {}
        self.output: dict[int, int] = {}
        self.offset: dict[int, float] = {}
        self.waiting: dict[int, int] = {}      # request -> tenant at the last decision
        self.last_left = 0.0


class VTC(TickCached, BudgetController):
    """Virtual Token Counter (see the module docstring).

    Args:
        weights: ``{tenant: weight}`` (> 0; unlisted tenants weigh 1): weighted VTC, where
            tenant ``f``'s counter grows by ``cost / weights[f]``.
        input_price: ``w_p``, the charge per prompt token (1, as the paper's experiments).
        output_price: ``w_q``, the charge per output token (2, OpenAI's price ratio the
            paper uses).
        record: keep a log of every decision (:attr:`log`: time, replica, counters and
            backlogged tenants), for tests and benchmarks.
    """

    name = "vtc"
    meta = Meta(claims=(Claim(
        "two tenants backlogged on one replica over an interval receive service within "
        "2 U, U = (w_p L + w_q R O) / weight; VTC never holds a request back",
        _PROOF, "tests/properties/test_fairness_vtc.py::"
        "test_vtc_service_difference_within_bound_on_adversarial_arrivals"),))

    def __init__(self, weights: Mapping[int, float] | None = None, input_price: float = 1.0,
                 output_price: float = 2.0, record: bool = False) -> None:
        self.weights = _tenant_map(self.name, "weights", weights, _positive)
        self.input_price = _positive(self.name, "input_price", input_price)
        self.output_price = _positive(self.name, "output_price", output_price)
        self.record = bool(record)
        self._fresh()

    def _fresh(self) -> None:
        self._req: dict[int, list] = {}   # request -> [tenant, prompt, charged, output]
        self._rep: dict[int, _Replica] = {}
        self.observed = 0                 # engine observations (0: no hook installed)
        self.log: list[dict[str, Any]] = []

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget every replica's per-tenant counters, every request's charges, the
        observation count and the log of the last run."""
        super().reset(cluster, rng)
        self._fresh()

    def kernel_spec(self) -> tuple[str, list[float], list[int]] | None:
        """The compiled twin's kind and quantum (its parameters over the run's tenants come
        from :func:`lpserve.sim._vtc_kernels.vtc_params`), or None with ``record`` (the
        decision log is kept in Python only). A compiled run meters the service from the
        engine's arrays, so :attr:`observed` stays 0 there."""
        return None if self.record else ("vtc", [float(self.quantum_s or 0.0)], [])

    def restore_service(self, state: Mapping[int, Mapping[str, Any]],
                        shed: Any = ()) -> None:
        """Set every replica's counters from a compiled run's final service
        (:func:`lpserve.sim._vtc_kernels.final_service`), so :meth:`counter` and
        :meth:`service` report that run; ``shed``: the requests it shed (none for
        plain VTC)."""
        self._rep = {}
        for r, rec in state.items():
            st = self._rep[int(r)] = _Replica()
            st.prompt, st.output = dict(rec["prompt"]), dict(rec["output"])
            st.offset, st.last_left = dict(rec["offset"]), float(rec["last_left"])

    # ------------------------------------------------------------------ counters
    def _weight(self, tenant: int) -> float:
        return self.weights.get(tenant, 1.0)

    def counter(self, replica: int, tenant: int) -> float:
        """Tenant ``tenant``'s counter on ``replica``: weighted service plus lift."""
        st = self._rep.get(replica)
        if st is None:
            return 0.0
        cost = (self.input_price * st.prompt.get(tenant, 0)
                + self.output_price * st.output.get(tenant, 0))
        return cost / self._weight(tenant) + st.offset.get(tenant, 0.0)

    def service(self, replica: int) -> dict[int, tuple[int, int]]:
        """``{tenant: (prompt tokens admitted, output tokens produced)}`` on ``replica``."""
        st = self._rep.get(replica)
        if st is None:
            return {}
        return {t: (st.prompt.get(t, 0), st.output.get(t, 0))
                for t in sorted(set(st.prompt) | set(st.output))}

    def _state(self, replica: int) -> _Replica:
        st = self._rep.get(replica)
        if st is None:
            st = self._rep[replica] = _Replica()
        return st

    def _charge_prompt(self, rec: list, replica: int) -> None:
        if not rec[2]:
            rec[2] = True
            st = self._state(replica)
            st.prompt[rec[0]] = st.prompt.get(rec[0], 0) + rec[1]

    def _charge_output(self, rec: list, replica: int, n: int) -> None:
        if n > 0:
            rec[3] += n
            st = self._state(replica)
            st.output[rec[0]] = st.output.get(rec[0], 0) + n

    # ------------------------------------------------------------------ engine hook
    def _produced(self, replica: int, requests: Any, n: int) -> None:
        self.observed += 1
        for i in requests.tolist():
            rec = self._req.get(i)
            if rec is None:  # cannot happen: a request is ranked before it runs
                raise RuntimeError(f"{self.name}: request {i} produced tokens before any "
                                   "view showed it")
            self._charge_prompt(rec, replica)  # admitted: its prompt is service received
            self._charge_output(rec, replica, n)

    def observe(self, view: Any) -> None:
        """Credit each request that produced a token in the iteration of ``view``."""
        self._produced(int(view.replica[1]), view.produced_request, 1)

    def observe_decode_run(self, view: Any, n_iters: int) -> None:
        """Credit ``n_iters`` tokens to every request of the decode run."""
        self._produced(int(view.replica[1]), view.request, int(n_iters))

    # ------------------------------------------------------------------ decisions
    def _groups(self, view: SchedulerView, waiting: list[int]) -> list[list[int]]:
        """Positions of the waiting candidates in the groups that share one VTC order
        (one group: every waiting candidate)."""
        return [waiting]

    def _rank(self, view: SchedulerView) -> np.ndarray:
        rep = int(view.replica)
        st = self._state(rep)
        req = view.request.tolist()
        ten = view.tenant.tolist()
        run = view.running.tolist()
        gen = view.generated_tokens.tolist()
        prompt = view.prompt_tokens.tolist()
        recs = []
        for k, i in enumerate(req):
            rec = self._req.get(i)
            if rec is None:
                rec = self._req[i] = [int(ten[k]), int(prompt[k]), False, 0]
            if run[k]:
                self._charge_prompt(rec, rep)
                self._charge_output(rec, rep, int(gen[k]) - rec[3])  # only without the hook
            recs.append(rec)
        waiting = [k for k in range(len(req)) if not run[k]]
        self._lift(st, rep, {req[k]: recs[k][0] for k in self._admissible(view, waiting)})
        out = np.full(len(req), _RUNNING_RANK)
        for k in waiting:
            out[k] = math.inf
        for group in self._groups(view, waiting):
            self._order(view, rep, group, recs, out)
        if self.record:
            self.log.append({"now_s": float(view.now_s), "replica": rep,
                             "service": self.service(rep),
                             "backlogged": sorted(set(st.waiting.values())),
                             "counters": {t: self.counter(rep, t)
                                          for t in sorted(set(st.waiting.values()))}})
        return out

    def _admissible(self, view: SchedulerView, waiting: list[int]) -> list[int]:
        """Waiting positions that count as backlog (all of them here)."""
        return waiting

    def _lift(self, st: _Replica, rep: int, now: dict[int, int]) -> None:
        """Update the backlogged set and lift the tenants that (re)joined it."""
        prev = st.waiting
        stay = {t for i, t in now.items() if i in prev}
        joined = set(now.values()) - stay
        left = set(prev.values()) - stay
        if stay:
            floor = min(self.counter(rep, t) for t in stay)
        else:
            if left:
                st.last_left = max(st.last_left, max(self.counter(rep, t) for t in left))
            floor = st.last_left
        for t in sorted(joined):
            c = self.counter(rep, t)
            if c < floor:
                st.offset[t] = st.offset.get(t, 0.0) + (floor - c)
        st.waiting = now

    def _order(self, view: SchedulerView, rep: int, group: list[int], recs: list,
               out: np.ndarray) -> None:
        """Ranks ``0, 1, ...`` for ``group`` in VTC admission order (each pick raises the
        picked tenant's virtual counter by the request's prompt charge)."""
        if not group:
            return
        arr = view.arrival_s
        queues: dict[int, list[int]] = {}
        for k in sorted(group, key=lambda k: (float(arr[k]), int(view.request[k]))):
            queues.setdefault(recs[k][0], []).append(k)
        heap = [(self.counter(rep, t), float(arr[q[0]]), t) for t, q in queues.items()]
        heapq.heapify(heap)
        pos = {t: 0 for t in queues}
        rank = 0
        while heap:
            c, _, t = heapq.heappop(heap)
            k = queues[t][pos[t]]
            out[k] = float(rank)
            rank += 1
            pos[t] += 1
            if not recs[k][2]:
                c += self.input_price * recs[k][1] / self._weight(t)
            if pos[t] < len(queues[t]):
                heapq.heappush(heap, (c, float(arr[queues[t][pos[t]]]), t))


class TieredShedding(VTC):
    """Strict priority across tenant tiers, VTC within a tier, admission caps and deadline
    shedding per tier (see the module docstring).

    Args:
        tiers: ``{tenant: tier}`` (0 is served first; unlisted tenants are in tier 0).
        max_waiting: ``{tier: n}``: a request that arrives while ``n`` admissible requests
            of its tier wait is shed (unlisted tiers: no cap).
        shed_after_s: ``{tier: seconds}``: a waiting request older than this is shed (set
            it to the tier's TTFT objective; unlisted tiers: never).
        quantum_s: how often deadlines are checked (s).
        weights, input_price, output_price, record: as :class:`VTC`.
    """

    name = "tiered-vtc"
    meta = Meta()

    def __init__(self, tiers: Mapping[int, int] | None = None,
                 max_waiting: Mapping[int, int] | None = None,
                 shed_after_s: Mapping[int, float] | None = None, quantum_s: float = 0.1,
                 weights: Mapping[int, float] | None = None, input_price: float = 1.0,
                 output_price: float = 2.0, record: bool = False) -> None:
        def tier_id(policy: str, field: str, v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{policy}: {field} must be a tier index >= 0, got {v!r}")
            return int(v)

        def cap(policy: str, field: str, v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{policy}: {field} must be an integer >= 0, got {v!r}")
            return int(v)

        self.tiers = _tenant_map(self.name, "tiers", tiers, tier_id)
        self.max_waiting = _tenant_map(self.name, "max_waiting", max_waiting, cap)
        self.shed_after_s = _tenant_map(self.name, "shed_after_s", shed_after_s, _positive)
        self.quantum_s = _positive(self.name, "quantum_s", quantum_s)
        super().__init__(weights=weights, input_price=input_price,
                         output_price=output_price, record=record)

    def _fresh(self) -> None:
        super()._fresh()
        self.shed: set[int] = set()       # requests shed (held back for good)
        self._known: dict[int, set[int]] = {}

    # its own class attribute (the compiled engine uses only a class's own twin); the
    # twin reads the tiers, caps and deadlines from the scheduler
    kernel_spec = VTC.kernel_spec

    def restore_service(self, state: Mapping[int, Mapping[str, Any]],
                        shed: Any = ()) -> None:
        """As :meth:`VTC.restore_service`, and :attr:`shed` from the compiled run."""
        super().restore_service(state)
        self.shed = {int(i) for i in shed}

    def _tier(self, tenant: int) -> int:
        return self.tiers.get(int(tenant), 0)

    def _admissible(self, view: SchedulerView, waiting: list[int]) -> list[int]:
        rep = int(view.replica)
        known = self._known.setdefault(rep, set())
        # deadlines are checked at the tick's start, whenever in it the engine asks
        now = tick_index(view.now_s, self.quantum_s) * self.quantum_s
        req, ten, arr = view.request, view.tenant, view.arrival_s
        counts: dict[int, int] = {}
        fresh = []
        for k in waiting:
            i = int(req[k])
            if i in self.shed:
                continue
            tier = self._tier(ten[k])
            limit = self.shed_after_s.get(tier)
            if limit is not None and now - float(arr[k]) > limit:
                self.shed.add(i)
                continue
            if i in known:
                counts[tier] = counts.get(tier, 0) + 1
            else:
                fresh.append(k)
        # arrivals since the last decision, oldest first, against their tier's cap
        for k in sorted(fresh, key=lambda k: (float(arr[k]), int(req[k]))):
            tier = self._tier(ten[k])
            known.add(int(req[k]))
            c = self.max_waiting.get(tier)
            if c is not None and counts.get(tier, 0) >= c:
                self.shed.add(int(req[k]))
                continue
            counts[tier] = counts.get(tier, 0) + 1
        known.intersection_update(int(i) for i in req.tolist())
        return [k for k in waiting if int(req[k]) not in self.shed]

    def _groups(self, view: SchedulerView, waiting: list[int]) -> list[list[int]]:
        by_tier: dict[int, list[int]] = {}
        for k in waiting:
            if int(view.request[k]) not in self.shed:
                by_tier.setdefault(self._tier(view.tenant[k]), []).append(k)
        return [by_tier[t] for t in sorted(by_tier)]

    def _rank(self, view: SchedulerView) -> np.ndarray:
        out = super()._rank(view)
        for k in range(len(view)):
            if not view.running[k] and math.isfinite(out[k]):
                out[k] += self._tier(view.tenant[k]) * _TIER_SCALE
        return out


def fair_policy(make_scheduler: Any, name: str, engine: str = "vllm-v0"):
    """Registry factory: the ``engine`` baseline with ``make_scheduler(**kw)`` as its
    scheduler *and* its budget controller (exact service accounting). Keyword arguments
    that are :class:`~lpserve.policy.EngineConfig` fields (or ``router``) configure the
    engine; the rest go to the scheduler."""
    from lpserve.policies.baselines import ENGINE_FIELDS, engine_policy

    def factory(**params: Any):
        eng = {k: v for k, v in params.items()
               if k in ENGINE_FIELDS or k in ("router", "decode_router", "evictor")}
        kw = {k: v for k, v in params.items() if k not in eng}
        if "budget_controller" in eng:
            raise ValueError(f"policy {name!r}: the scheduler is the budget controller "
                             "(it meters every iteration); budget_controller cannot be set")
        try:
            sched = make_scheduler(**kw)
        except TypeError as exc:
            raise ValueError(f"policy {name!r}: bad scheduler parameter(s) {sorted(kw)}: "
                             f"{exc}") from None
        pol = engine_policy(engine, name=name, budget_controller=sched, **eng)
        return pol.with_(scheduler=sched)

    factory.__name__ = name.replace("-", "_")
    return factory
