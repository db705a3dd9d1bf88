"""The policy contract (layer 3): what a policy is, what it sees and what it returns.

=================  ===========================================================================
``roles``          the three roles (:class:`Router`, :class:`Scheduler`, :class:`Evictor`),
                   their common base :class:`Role`, :class:`Meta` and :class:`Claim`, the
                   default roles and the function lifters
``engine``         :class:`EngineConfig`: how a replica batches, reserves KV and preempts
``views``          the read-only views the roles decide on
``hooks``          the optional engine hooks (budget controller, preemption decider,
                   speculation decider, rebalancer, predictor) and their views
``checks``         the one check of every role's and hook's output
=================  ===========================================================================

A :class:`Policy` bundles one of each role plus an :class:`EngineConfig` and optionally a
rebalancer. Every public name of the submodules is importable from ``lpserve.policy``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from lpserve.policy.engine import (
    BATCHING_MODES,
    DECISION_FIELDS,
    HARDWARE_PROFILES,
    PREEMPTION_MODES,
    EngineConfig,
    HardwareDefaults,
    vllm_v1_batch_defaults,
)
from lpserve.policy.hooks import (
    DEFAULT_DRAFT,
    PREEMPTION_CHOICES,
    BudgetController,
    BudgetView,
    DecodeRunView,
    IterationView,
    Prediction,
    Predictor,
    PredictorView,
    PreemptionDecider,
    PreemptionView,
    Rebalancer,
    RebalanceView,
    SpeculationDecider,
    StepContext,
    StepResult,
)
from lpserve.policy.roles import (
    ENGINES,
    FCFS,
    LRU,
    Claim,
    Evictor,
    Meta,
    PolicyError,
    Role,
    RoundRobin,
    Router,
    Scheduler,
    as_evictor,
    as_router,
    as_scheduler,
    next_tick_s,
    tick_index,
)
from lpserve.policy.views import EvictorView, RequestEvent, RouterView, SchedulerView

__all__ = ["BATCHING_MODES", "DECISION_FIELDS", "DEFAULT_DRAFT", "ENGINES", "HARDWARE_PROFILES",
           "PREEMPTION_CHOICES", "PREEMPTION_MODES", "BudgetController", "BudgetView",
           "Claim", "DecodeRunView", "EngineConfig", "Evictor", "EvictorView", "FCFS",
           "HardwareDefaults", "IterationView", "LRU", "Meta",
           "Policy", "PolicyError", "Prediction", "PreemptionDecider", "PreemptionView",
           "Predictor", "PredictorView", "RebalanceView", "Rebalancer", "RequestEvent", "Role",
           "RoundRobin", "Router", "RouterView", "Scheduler", "SchedulerView",
           "SpeculationDecider", "StepContext", "StepResult", "as_evictor", "as_router",
           "as_scheduler", "next_tick_s", "tick_index", "vllm_v1_batch_defaults"]

#: The parts :meth:`Policy.reset` resets, in the order their generators are spawned.
PARTS = ("router", "scheduler", "evictor", "decode_router", "rebalancer",
         "preemption_decider", "budget_controller", "speculation")


@dataclass(frozen=True)
class Policy:
    """One router, scheduler and evictor plus the engine they drive.

    ``decode_router`` routes the decode phase of disaggregated clusters (defaults to a
    fresh round robin). ``rebalancer`` (``None``: no migration), a
    :class:`~lpserve.policy.hooks.Rebalancer`, moves decoding requests between replicas
    of the decoding pool. ``meta`` is derived from the roles when not given: clairvoyant or
    stochastic if any role is. ``hardware_defaults`` (a
    :class:`~lpserve.policy.engine.HardwareDefaults`) names the engine fields left at a
    GPU-dependent default, set for the cluster by :meth:`bind` when a run starts.
    """

    router: Router = field(default_factory=RoundRobin)
    scheduler: Scheduler = field(default_factory=FCFS)
    evictor: Evictor = field(default_factory=LRU)
    engine: EngineConfig = field(default_factory=EngineConfig)
    decode_router: Router = field(default_factory=RoundRobin)
    name: str = "custom"
    meta: Meta | None = None
    rebalancer: Rebalancer | None = None
    hardware_defaults: HardwareDefaults | None = None

    def __post_init__(self) -> None:
        for role, cls in (("router", Router), ("scheduler", Scheduler),
                          ("evictor", Evictor), ("decode_router", Router)):
            v = getattr(self, role)
            if not isinstance(v, cls):
                lifter = {"router": as_router, "decode_router": as_router,
                          "scheduler": as_scheduler, "evictor": as_evictor}[role]
                if not callable(v):
                    raise ValueError(f"Policy.{role} must be a {cls.__name__} or a function, "
                                     f"got {v!r}")
                object.__setattr__(self, role, lifter(v))
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"Policy.engine must be an EngineConfig, got {self.engine!r}")
        hd = self.hardware_defaults
        if hd is not None and not isinstance(hd, HardwareDefaults):
            raise ValueError(f"Policy.hardware_defaults must be None or HardwareDefaults, "
                             f"got {hd!r}")
        rb = self.rebalancer
        if rb is not None and not (isinstance(rb, Rebalancer) and float(rb.period_s) > 0):
            raise ValueError(f"Policy.rebalancer must be None or a Rebalancer with period_s "
                             f"> 0, got {rb!r} (period_s={getattr(rb, 'period_s', None)!r})")
        if self.meta is None:  # from the roles, the rebalancer and the speculation decider
            metas = [r.meta for r in self.roles()]
            if rb is not None:
                metas.append(rb.meta)
            if self.engine.speculation is not None:
                metas.append(self.engine.speculation.meta)
            engines = set(ENGINES)
            for m in metas:
                engines &= set(m.engines)
            object.__setattr__(self, "meta", Meta(
                online=all(m.online for m in metas),
                clairvoyant=any(m.clairvoyant for m in metas),
                stochastic=any(m.stochastic for m in metas),
                engines=tuple(e for e in ENGINES if e in engines),
                claims=tuple(c for m in metas for c in m.claims),
            ))

    def roles(self) -> tuple[Router, Scheduler, Evictor, Router]:
        """The four roles: router, scheduler, evictor, decode router."""
        return (self.router, self.scheduler, self.evictor, self.decode_router)

    def parts(self) -> tuple[Role | None, ...]:
        """Every role and hook in :data:`PARTS` order (``None`` where a hook is unset)."""
        eng = self.engine
        return (self.router, self.scheduler, self.evictor, self.decode_router,
                self.rebalancer, eng.preemption_decider, eng.budget_controller,
                eng.speculation)

    @property
    def reads_predictions(self) -> list[str]:
        """``"role 'name'"`` of every part that declares ``reads_predictions`` (empty when
        the policy never reads predicted output lengths)."""
        return [f"{role} {part.name!r}" for role, part in zip(PARTS, self.parts())
                if part is not None and getattr(part, "reads_predictions", False)]

    def with_(self, **changes: Any) -> "Policy":
        """A copy with fields changed (``engine`` may be a dict of EngineConfig changes).

        Engine fields changed here are the user's: they leave ``hardware_defaults``."""
        eng = changes.get("engine")
        if isinstance(eng, dict):
            changes["engine"] = replace(self.engine, **eng)
        hd = self.hardware_defaults
        if "engine" in changes and hd is not None and "hardware_defaults" not in changes:
            new = changes["engine"]
            changes["hardware_defaults"] = hd.without(
                f for f in hd.fields if getattr(new, f) != getattr(self.engine, f)
                or (isinstance(eng, dict) and f in eng))
        if "meta" not in changes:
            changes["meta"] = None
        return replace(self, **changes)

    def bind(self, cluster: Any, slo: Any, tiers: tuple = ()) -> "Policy":
        """The policy as it runs on an instance with ``cluster``, ``slo`` (an
        :class:`~lpserve.instance.SLO`) and service ``tiers``: the engine fields of ``hardware_defaults`` set for
        the cluster's GPU, and :meth:`Role.bind` called on every part, which takes the
        parameters that mirror the instance and that the user left unset. The simulator
        calls it once per run, before :meth:`reset`; returns ``self`` when the engine
        stays as configured."""
        eng = self.engine_on(cluster)
        pol = self if eng is self.engine else replace(self, engine=eng)
        for part in pol.parts():
            if part is not None:
                part.bind(cluster, slo, tiers)
        return pol

    def engine_on(self, cluster: Any) -> EngineConfig:
        """The :class:`EngineConfig` this policy runs with on ``cluster``: the fields of
        ``hardware_defaults`` set for the cluster's GPU (``self.engine`` itself when none
        changes)."""
        hd = self.hardware_defaults
        if hd is None:
            return self.engine
        ch = {k: v for k, v in hd.for_cluster(cluster).items() if getattr(self.engine, k) != v}
        return replace(self.engine, **ch) if ch else self.engine

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Reset every role and hook for a new run on ``cluster``.

        Each part of :data:`PARTS` gets its own generator, spawned from ``rng`` in that
        order (always all eight, so a missing hook never shifts another part's stream).
        """
        for part, child in zip(self.parts(), rng.spawn(len(PARTS))):
            if part is not None:
                part.reset(cluster, child)
