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

from lpserve.policy.engine import BATCHING_MODES, PREEMPTION_MODES, EngineConfig
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

__all__ = ["BATCHING_MODES", "DEFAULT_DRAFT", "ENGINES", "PREEMPTION_CHOICES",
           "PREEMPTION_MODES", "BudgetController", "BudgetView", "Claim", "DecodeRunView",
           "EngineConfig", "Evictor", "EvictorView", "FCFS", "IterationView", "LRU", "Meta",
           "Policy", "PolicyError", "Prediction", "PreemptionDecider", "PreemptionView",
           "Predictor", "PredictorView", "RebalanceView", "Rebalancer", "RequestEvent", "Role",
           "RoundRobin", "Router", "RouterView", "Scheduler", "SchedulerView",
           "SpeculationDecider", "StepContext", "StepResult", "as_evictor", "as_router",
           "as_scheduler", "next_tick_s", "tick_index"]

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
    stochastic if any role is.
    """

    router: Router = field(default_factory=RoundRobin)
    scheduler: Scheduler = field(default_factory=FCFS)
    evictor: Evictor = field(default_factory=LRU)
    engine: EngineConfig = field(default_factory=EngineConfig)
    decode_router: Router = field(default_factory=RoundRobin)
    name: str = "custom"
    meta: Meta | None = None
    rebalancer: Rebalancer | None = None

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

    def with_(self, **changes: Any) -> "Policy":
        """A copy with fields changed (``engine`` may be a dict of EngineConfig changes)."""
        eng = changes.get("engine")
        if isinstance(eng, dict):
            changes["engine"] = replace(self.engine, **eng)
        if "meta" not in changes:
            changes["meta"] = None
        return replace(self, **changes)

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Reset every role and hook for a new run on ``cluster``.

        Each part of :data:`PARTS` gets its own generator, spawned from ``rng`` in that
        order (always all eight, so a missing hook never shifts another part's stream).
        """
        for part, child in zip(self.parts(), rng.spawn(len(PARTS))):
            if part is not None:
                part.reset(cluster, child)
