"""Which policies a comparison runs, and on which engine (layer 7).

* :data:`BASELINES`, :data:`SOLVED_POLICIES`, :func:`default_policies` -- the policy set of
  ``lpserve gap`` and :func:`~lpserve.evaluate.compare`.
* :func:`resolve_policies` -- names, solved-policy names and Policy objects -> policies,
  each on its engine: same engine, different decision (the first baseline's engine, each
  policy keeping its own decisions; ``shared_engine``), then the user's overrides.
* :func:`describe_policy` -- a row's ``router / scheduler / evictor / exact engine``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from lpserve.evaluate.specs import (
    apply_engine,
    check_engine,
    engine_for,
    shared_engine_overrides,
)

#: baseline heuristics: round robin + FCFS + LRU with whole-prompt prefill (vLLM), the same
#: engine behind join-the-shortest-queue (least outstanding requests), and Sarathi-Serve's
#: fixed 512-token chunked-prefill budget
BASELINES = ("vllm", "vllm+least-outstanding", "sarathi")
#: policies exported from a formulation solved on the instance itself
SOLVED_POLICIES = {
    "lp-index": "vLLM engine behind the routing-fluid LP's dual-index router "
                "(models/routing-lp.md (17))",
    "lp-split": "vLLM engine behind the routing-fluid LP's randomized class split "
                "(models/routing-lp.md (16))",
    "lp-locality": "vLLM engine behind the routing-locality LP's dual-index router: live "
                   "cached tokens, each replica's own speed (models/routing-lp.md (18))",
}
#: registered policies that declare claims join the default set, at most MAX_DISCOVERED:
#: these first when registered (memory-checked shortest first with predicted lengths, and
#: clairvoyant SRPT as a reference), then the others in name order
PREFERRED_PRINCIPLED = ("mcsf", "srpt-oracle")
MAX_DISCOVERED = 2


class PolicyUnavailable(RuntimeError):
    """A policy that must be solved on the instance cannot be built for it (e.g. its LP is
    infeasible at this load); the message says why."""


def solved_policy(name: str, instance: Any) -> Any:
    """A policy of :data:`SOLVED_POLICIES`: solve ``routing-fluid`` (``routing-locality``
    for ``lp-locality``) on ``instance`` and export its router behind the ``vllm`` engine."""
    from lpserve.opt import solve
    from lpserve.opt.routing_lp import export_fluid
    from lpserve.registry import make_policy

    if name not in SOLVED_POLICIES:
        raise KeyError(f"unknown solved policy {name!r}; known: {', '.join(SOLVED_POLICIES)}")
    if name == "lp-locality":
        from lpserve.opt.routing_locality import export_locality

        sol = solve("routing-locality", instance)
        if not sol.solved:
            raise PolicyUnavailable(f"{name}: routing-locality LP did not solve "
                                    f"({sol.message or sol.status.value})")
        pol = make_policy("vllm")
        return pol.with_(router=export_locality(
            sol, instance, chunk_tokens=pol.engine.max_num_batched_tokens), name=name)
    sol = solve("routing-fluid", instance)
    if not sol.solved:
        raise PolicyUnavailable(f"{name}: routing-fluid LP did not solve "
                                f"({sol.message or sol.status.value})")
    kind = "index" if name == "lp-index" else "split"
    return make_policy("vllm").with_(router=export_fluid(sol, instance, kind=kind), name=name)


def default_policies(n_replicas: int = 2) -> list[str]:
    """The baseline heuristics plus the principled policies available: the LP-exported
    router (with several replicas) and registered policies that declare a claim
    (:class:`~lpserve.policy.Claim`, backed by ``proofs/``): :data:`PREFERRED_PRINCIPLED`
    first, at most :data:`MAX_DISCOVERED`. With one replica the routers coincide, so only
    the engines are kept."""
    from lpserve.registry import make_policy, policy_names

    out = list(BASELINES) if n_replicas > 1 else [b for b in BASELINES if "+" not in b]
    if n_replicas > 1:
        out.append("lp-index")
    names = policy_names()
    order = [p for p in PREFERRED_PRINCIPLED if p in names] + \
        [p for p in names if p not in PREFERRED_PRINCIPLED]
    found = [name for name in order if name not in out and make_policy(name).meta.claims]
    return out + found[:MAX_DISCOVERED]


def describe_policy(policy: Any, cluster: Any = None) -> str:
    """``router / scheduler / evictor / engine`` of a policy (the ``description`` column
    of :func:`compare`): its exact engine (:meth:`~lpserve.policy.EngineConfig.describe`)
    as it runs on ``cluster`` (GPU-set fields resolved; without a cluster, the engine's
    fallback values)."""
    e = policy.engine if cluster is None else policy.engine_on(cluster)
    return (f"{policy.router.name} / {policy.scheduler.name} / {policy.evictor.name} / "
            f"{e.describe()}")


def _label(label: Any, spec: Any) -> str:
    if label is not None:
        return str(label)
    return spec if isinstance(spec, str) else str(getattr(spec, "name", spec))


def _build(instance: Any, spec: Any, label: str, skipped: dict[str, str] | None
           ) -> tuple[Any, str] | None:
    """``(Policy, kind)`` of one spec; ``None`` when a solved policy is unavailable and
    ``skipped`` records it."""
    from lpserve.policy import Policy
    from lpserve.registry import make_policy, policy_names

    if isinstance(spec, str):
        if spec in SOLVED_POLICIES:
            try:
                return solved_policy(spec, instance), "principled"
            except PolicyUnavailable as exc:
                if skipped is None:
                    raise
                skipped[label] = str(exc)
                return None
        if spec in policy_names():
            pol = make_policy(spec)
            return pol, "baseline" if spec in BASELINES else \
                ("principled" if pol.meta.claims else "other")
        raise KeyError(f"unknown policy {spec!r}; registered: {', '.join(policy_names())}; "
                       f"solved: {', '.join(SOLVED_POLICIES)}")
    if isinstance(spec, Policy):
        return spec, "principled" if spec.meta.claims else "other"
    raise ValueError(f"a policy must be a registered name or a Policy, got {spec!r}")


def _anchor(built: Sequence[tuple[str, Any, str, Any]], shared_engine: bool | str
            ) -> tuple[str, Any] | None:
    """``(label, Policy)`` whose engine the others share: the first baseline (else the
    first policy) for ``True``, the policy labelled ``shared_engine`` for a text."""
    if shared_engine is False or not built:
        return None
    if isinstance(shared_engine, str):
        for lab, pol, *_ in built:
            if lab == shared_engine:
                return lab, pol
        raise ValueError(f"compare: shared_engine={shared_engine!r} is not a policy of this "
                         f"comparison ({', '.join(b[0] for b in built)})")
    if shared_engine is not True:
        raise ValueError("compare: shared_engine must be True, False or a policy label, "
                         f"got {shared_engine!r}"[:200])
    for lab, pol, kind, _ in built:
        if kind == "baseline":
            return lab, pol
    return built[0][0], built[0][1]


def _owned(spec: Any) -> tuple[str, ...] | None:
    """Engine fields a policy keeps on a shared engine; ``None``: its whole engine (an
    engine baseline, or a Policy object, which carries the engine its user gave it)."""
    from lpserve.policy import DECISION_FIELDS
    from lpserve.registry import owned_engine_fields

    if not isinstance(spec, str):
        return None
    return DECISION_FIELDS if spec in SOLVED_POLICIES else owned_engine_fields(spec)


def resolve_with_sources(instance: Any, policies: Sequence[Any] | Mapping[str, Any],
                         skipped: dict[str, str] | None, engine: Mapping[str, Any] | None,
                         shared_engine: bool | str = True
                         ) -> list[tuple[str, Any, str, str, dict[str, Any], str]]:
    """``(label, Policy, kind, spec, engine overrides, engine source)`` per policy (see
    :func:`resolve_policies`; the source is ``"own"`` or ``"X's"``, with ``" + given"``
    when ``engine`` overrides it)."""
    items = list(policies.items()) if isinstance(policies, Mapping) else \
        [(None, p) for p in policies]
    if not items:
        raise ValueError("compare: give at least one policy")
    check_engine(engine, [_label(lb, sp) for lb, sp in items])
    built = []
    for label, spec in items:
        lab = _label(label, spec)
        got = _build(instance, spec, lab, skipped)
        if got is not None:
            built.append((lab, got[0], got[1], spec))
    if not built:
        raise PolicyUnavailable(f"compare: no policy could be built: {skipped}")
    labels = [x[0] for x in built]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"policy labels must be distinct, got {dup} more than once "
                         "(pass a mapping label -> policy)")
    anchor = _anchor(built, shared_engine)
    out = []
    for lab, pol, kind, spec in built:
        owned = _owned(spec)
        shared: dict[str, Any] = {}
        source = "own"
        if anchor is not None and lab != anchor[0] and owned is not None:
            shared = shared_engine_overrides(anchor[1], pol, owned, instance.cluster)
            source = f"{anchor[0]}'s"
        given = engine_for(engine, lab)
        over = {**shared, **given}
        if given:
            source += " + given"
        try:
            pol = apply_engine(pol, over, where=f"engine of policy {lab!r}")
        except ValueError as exc:
            if not shared:
                raise
            raise ValueError(f"{exc}; it runs on {anchor[0]}'s engine in this comparison: "
                             "give it its own (engine={label: {field: value}}) or "
                             "shared_engine=False") from None
        out.append((lab, pol, kind, spec, over, source))
    return out


def resolve_policies(instance: Any, policies: Sequence[Any] | Mapping[str, Any], *,
                     skipped: dict[str, str] | None = None,
                     engine: Mapping[str, Any] | None = None,
                     shared_engine: bool | str = True) -> list[tuple[str, Any, str]]:
    """``(label, Policy, kind)`` for each registered name, solved-policy name
    (:data:`SOLVED_POLICIES`) or :class:`~lpserve.policy.Policy`; a mapping gives labels.
    ``kind``: ``"baseline"``, ``"principled"`` (claims, or exported from a formulation) or
    ``"other"``. A solved policy that cannot be built raises :class:`PolicyUnavailable`,
    or, when ``skipped`` is a dict, is left out and recorded there (label -> reason).
    ``engine``: EngineConfig overrides, ``{field: value}`` for every policy and
    ``{label: {field: value}}`` for one (:func:`~lpserve.evaluate.specs.engine_for`);
    ``shared_engine`` as in :func:`compare`."""
    return [(lab, pol, kind) for lab, pol, kind, *_ in
            resolve_with_sources(instance, policies, skipped, engine, shared_engine)]


__all__ = ["BASELINES", "MAX_DISCOVERED", "PREFERRED_PRINCIPLED", "SOLVED_POLICIES",
           "PolicyUnavailable", "default_policies", "describe_policy", "resolve_policies",
           "resolve_with_sources", "solved_policy"]
