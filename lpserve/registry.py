"""Name -> policy factory (layer 5), and name resolution for ``lp.simulate("name")``.

Registering a policy puts it under the conformance suite (``tests/conformance``).
"""
from __future__ import annotations

from typing import Any, Callable

from lpserve.opt.rebalance import AssignmentRebalancer
from lpserve.policies import baselines as B
from lpserve.policies import disagg as DG
from lpserve.policies import fairness as FR
from lpserve.policies import kvcompress as KC
from lpserve.policies import lyapunov as LY
from lpserve.policies import mlfq as MQ
from lpserve.policies import programs as PG
from lpserve.policies import rebalancers as RB
from lpserve.policies import schedulers as SC
from lpserve.policies import speculation as SP
from lpserve.policies import wait as WT
from lpserve.policy import Policy

#: rebalancer kind -> class, for the ``rebalance-*`` policies
REBALANCERS = {"none": RB.NoMigration, "llumnix": RB.LlumnixFreeness,
               "lp": AssignmentRebalancer}
_REBALANCER_KNOBS = {"period_s", "threshold_blocks", "source_below_blocks", "max_moves",
                     "cost_weight", "min_gain_s", "default_remaining_tokens", "max_candidates",
                     "time_limit_s"}


def rebalanced(kind: str) -> Callable[..., Policy]:
    """Factory of the ``vllm-v0`` engine (Llumnix extends vLLM's V0 scheduler) behind round
    robin with the ``kind`` rebalancer
    (:data:`REBALANCERS`); the rebalancer's parameters and any engine field are keyword
    arguments."""
    if kind not in REBALANCERS:
        raise KeyError(f"unknown rebalancer {kind!r}; known: {', '.join(REBALANCERS)}")

    def factory(**params: Any) -> Policy:
        knobs = {k: params.pop(k) for k in list(params) if k in _REBALANCER_KNOBS}
        params.setdefault("name", f"rebalance-{kind}")
        pol = B.engine_policy("vllm-v0", **params)
        return pol.with_(rebalancer=REBALANCERS[kind](**knobs), meta=None)

    factory.__name__ = f"rebalance_{kind}"
    return factory


# the round model of MC-SF / A_max / A_min: new requests join the running batch (mixed)
_MCSF_ENGINE = dict(batching="mixed", watermark=0.0, prefix_caching=False)
# FastServe's proactive KV swapping needs the overlapped host link (the default is serial)
_FASTSERVE_ENGINE = dict(transfers="overlap", proactive_swap=True)

POLICIES: dict[str, Callable[..., Policy]] = {
    "vllm": B.vllm,
    "vllm-v0": B.vllm_v0,
    "vllm-chunked": B.vllm_chunked,
    "sarathi": B.sarathi,
    "orca": B.orca,
    "static": B.static,
    "vllm+random": B.routed("random"),
    "vllm+least-outstanding": B.routed("least-outstanding"),
    "vllm+least-kv": B.routed("least-kv"),
    "vllm+power-of-two": B.routed("power-of-two"),
    "vllm+prefix-affinity": B.routed("prefix-affinity"),
    # per-victim preemption: compressed swaps and the cost-based decider (kvcompress.py)
    "vllm-compress-swap": KC.vllm_compress_swap,
    "vllm-preempt-decider": KC.vllm_preempt_decider,
    # competitive schedulers (lpserve/policies/schedulers.py, mlfq.py, programs.py)
    "sjf-oracle": SC.scheduled(SC.SJFOracle, "sjf-oracle", remaining=False),
    "srpt-oracle": SC.scheduled(SC.SJFOracle, "srpt-oracle", preemptive=True),
    "wspt-oracle": SC.scheduled(SC.WSPT, "wspt-oracle"),
    "sjf-predicted": SC.scheduled(SC.SJFPredicted, "sjf-predicted"),
    "las": SC.scheduled(SC.LAS, "las", preemptive=True),
    "rr-sched": SC.scheduled(SC.RoundRobin, "rr-sched", preemptive=True),
    "mcsf": SC.scheduled(SC.MemoryCheckedSF, "mcsf", assume="hi",
                         engine_defaults=_MCSF_ENGINE),
    "mcsf-oracle": SC.scheduled(SC.MemoryCheckedSF, "mcsf-oracle", assume="oracle",
                                engine_defaults=_MCSF_ENGINE),
    "a-max": SC.scheduled(SC.MemoryCheckedSF, "a-max", assume="hi",
                          engine_defaults=_MCSF_ENGINE),
    "a-min": SC.scheduled(SC.MemoryCheckedSF, "a-min", assume="lo",
                          engine_defaults=_MCSF_ENGINE),
    "slo-aware": SC.scheduled(SC.SLOAware, "slo-aware", preemptive=True),
    "mlfq": SC.scheduled(MQ.MLFQ, "mlfq", preemptive=True, entry="first"),
    # FastServe: skip-join MLFQ with its proactive KV swapping on the overlapped host link
    "fastserve": SC.scheduled(MQ.MLFQ, "fastserve", preemptive=True, entry="prefill",
                              engine_defaults=_FASTSERVE_ENGINE),
    "mlfq-predicted": SC.scheduled(MQ.MLFQ, "mlfq-predicted", preemptive=True,
                                   entry="predicted"),
    "fastserve-adaptive": SC.scheduled(MQ.MLFQ, "fastserve-adaptive", preemptive=True,
                                       entry="prefill", adaptive_starvation=True,
                                       engine_defaults=_FASTSERVE_ENGINE),
    "plas": SC.scheduled(PG.ProgramScheduler, "plas", preemptive=True, mode="plas"),
    "atlas": SC.scheduled(PG.ProgramScheduler, "atlas", preemptive=True, mode="atlas"),
    "plas-mlfq": SC.scheduled(PG.ProgramScheduler, "plas-mlfq", preemptive=True,
                              mode="plas", two_level=True),
    # Autellix: ATLAS (PLAS on chains) behind its program-aware load balancer
    "autellix": SC.scheduled(PG.ProgramScheduler, "autellix", preemptive=True, mode="atlas",
                             engine_defaults={"router": "autellix-lb"}),
    "vllm+autellix-lb": B.routed("autellix-lb"),
    # drift-plus-penalty prefill control (lpserve/policies/lyapunov.py, disagg.py)
    "lyapunov": LY.lyapunov,
    "lyapunov-disagg": DG.lyapunov_disagg,
    # speculative decoding with a draft model (lpserve/policies/speculation.py)
    "spec-never": SP.speculative("never", "spec-never"),
    "spec-fixed": SP.speculative("fixed", "spec-fixed"),
    "spec-ucb": SP.speculative("ucb", "spec-ucb"),
    "spec-acceptance-ucb": SP.speculative("acceptance-ucb", "spec-acceptance-ucb"),
    "spec-oracle": SP.speculative("oracle", "spec-oracle"),
    # live migration between replicas (lpserve/policies/rebalancers.py)
    "rebalance-llumnix": rebalanced("llumnix"),
    "rebalance-lp": rebalanced("lp"),
    # fair sharing across tenants and tiered shedding (lpserve/policies/fairness.py)
    "vtc": FR.fair_policy(FR.VTC, "vtc"),
    "tiered-vtc": FR.fair_policy(FR.TieredShedding, "tiered-vtc"),
    # fluid-guided threshold admission (lpserve/policies/wait.py, lpserve/opt/fluid.py)
    "wait": SC.scheduled(WT.WAIT, "wait", engine_defaults=_MCSF_ENGINE),
    # session-aware KV eviction (lpserve/policies/evictors_sessions.py)
    **{f"vllm-chunked+{k}": B.evicting(k)
       for k in ("ttl-pin", "reuse-decay", "tail-lru", "return-knapsack")},
    # the KV-aware routers people deploy, behind the vllm engine (routers_deployed.py,
    # routers_preble.py)
    "vllm+dynamo-kv": B.routed("dynamo-kv"),
    "vllm+llm-d": B.routed("llm-d"),
    "vllm+sglang-cache-aware": B.routed("sglang-cache-aware"),
    "vllm+preble": B.routed("preble"),
}


# ================================================= why a policy's engine differs from vllm's
#: what a registered policy's default engine is, for a policy whose engine differs from
#: ``vllm``'s: why (``lpserve list policies`` prints it), and which EngineConfig fields are
#: its own decision beyond :data:`~lpserve.policy.engine.DECISION_FIELDS` (kept when a
#: comparison runs it on a shared engine; ``"all"`` for a policy that is an engine)
_ENGINE_IS_POLICY = "the engine is the policy: {}; a comparison keeps it"
_PREEMPTIVE = ("preempts by rank, which needs swap preemption (vLLM V1 only recomputes): "
               "registered on the prefill-first V0 engine (4,096-token budget) with swap, "
               "recompute when host memory is full")
_NON_PREEMPTIVE = ("a non-preemptive order, registered on the prefill-first V0 engine "
                   "(4,096-token budget), where whole-prompt admission is the decision the "
                   "classical SJF/WSPT results are about")
_ROUND_MODEL = ("the round model of MC-SF / WAIT: new requests join the running batch "
                "whole (mixed batching), memory counted per request (no prefix caching, "
                "no watermark); its claims are proved and tested on this engine")
_ENGINE_NOTES: dict[str, tuple[str, Any]] = {
    "vllm": ("", "all"),  # the reference: its engine is the policy
    "vllm-v0": (_ENGINE_IS_POLICY.format("vLLM V0's prefill-first scheduler"), "all"),
    "vllm-chunked": (_ENGINE_IS_POLICY.format("vLLM V0 with chunked prefill"), "all"),
    "sarathi": (_ENGINE_IS_POLICY.format("Sarathi-Serve's 512-token chunk budget"), "all"),
    "orca": (_ENGINE_IS_POLICY.format("Orca's iteration-level batching with KV reserved "
                                      "at admission"), "all"),
    "static": (_ENGINE_IS_POLICY.format("request-level batching"), "all"),
    "vllm-compress-swap": ("compressed swap preemption is the policy (vLLM V1 only "
                           "recomputes): the V0 engine with compress-swap",
                           ("preemption", "compression_ratio", "compression_accuracy_cost")),
    "vllm-preempt-decider": ("the decider chooses recompute, swap or compress-swap per "
                             "victim (vLLM V1 only recomputes): the V0 engine", ()),
    **{n: (_PREEMPTIVE, ()) for n in ("srpt-oracle", "las", "rr-sched", "slo-aware", "mlfq",
                                      "mlfq-predicted", "plas", "atlas", "plas-mlfq",
                                      "autellix")},
    **{n: (_PREEMPTIVE + ", with FastServe's proactive swapping on the overlapped host "
           "link", ("transfers",)) for n in ("fastserve", "fastserve-adaptive")},
    **{n: (_NON_PREEMPTIVE, ()) for n in ("sjf-oracle", "sjf-predicted", "wspt-oracle")},
    **{n: (_ROUND_MODEL, ()) for n in ("mcsf", "mcsf-oracle", "a-max", "a-min", "wait")},
    **{n: ("speculates on pure-decode steps only; on the prefill-first V0 engine every "
           "decode iteration is one", ()) for n in ("spec-never", "spec-fixed", "spec-ucb",
                                                   "spec-acceptance-ucb", "spec-oracle")},
    **{n: ("Llumnix extends vLLM V0's scheduler: the V0 engine", ())
       for n in ("rebalance-llumnix", "rebalance-lp")},
    **{n: ("VTC's service bound (proofs/fairness-vtc.md) is proved and tested on the "
           "prefill-first V0 engine, where a prompt is charged whole at admission", ())
       for n in ("vtc", "tiered-vtc")},
    **{n: ("its budget controller sets the prefill chunk of each decode-first iteration: "
           "vLLM's chunked engine as of V0 (watermark 0.01, no GPU-set batch limits)", ())
       for n in ("lyapunov", "lyapunov-disagg")},
    **{f"vllm-chunked+{k}": ("the session-aware evictors are measured on vLLM's chunked "
                             "engine as of V0 (watermark 0.01, no GPU-set batch limits)", ())
       for k in ("ttl-pin", "reuse-decay", "tail-lru", "return-knapsack")},
}


def engine_note(name: str) -> str | None:
    """Why registered policy ``name`` runs on an engine other than ``vllm``'s (``None``
    when it runs on vllm's)."""
    note = _ENGINE_NOTES.get(name)
    return note[0] or None if note is not None else None


def owned_engine_fields(name: str) -> tuple[str, ...] | None:
    """The EngineConfig fields registered policy ``name`` keeps when a comparison runs it
    on a shared engine: :data:`~lpserve.policy.engine.DECISION_FIELDS`, plus those its
    engine note names; ``None`` for a policy that is an engine (it keeps every field)."""
    from lpserve.policy import DECISION_FIELDS

    note = _ENGINE_NOTES.get(name)
    owns = () if note is None else note[1]
    return None if owns == "all" else DECISION_FIELDS + tuple(owns)


def policy_names() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(POLICIES)


def make_policy(name: str, **params: Any) -> Policy:
    """A fresh policy by registered name; ``params`` go to its factory."""
    if not isinstance(name, str) or name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; registered: {', '.join(policy_names())}")
    return POLICIES[name](**params)


def policy_from_spec(spec: str) -> Policy:
    """The policy a command line names: a registered name, or ``module:attr`` for a
    user's own (``attr`` a :class:`Policy`, or a callable taking no argument that returns
    one; the current folder is importable, as for ``python -m``). Errors name the spec."""
    if spec in POLICIES:
        return make_policy(spec)
    if ":" not in spec:
        raise KeyError(f"unknown policy {spec!r}; registered: {', '.join(policy_names())} "
                       "(or MODULE:ATTR for your own)")
    import importlib
    import os
    import sys

    mod_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(mod_name), attr)
    except ImportError as exc:
        raise ValueError(f"policy {spec!r}: cannot import {mod_name!r} ({exc})"[:300]) from None
    except AttributeError:
        raise ValueError(f"policy {spec!r}: module {mod_name!r} has no {attr!r}") from None
    if not isinstance(obj, Policy) and callable(obj):
        obj = obj()
    if not isinstance(obj, Policy):
        raise ValueError(f"policy {spec!r}: {attr!r} is a {type(obj).__name__}, not a Policy "
                         "(or a callable returning one)")
    return obj


class MissingPredictions(ValueError):
    """A policy that decides on predicted output lengths was asked to run on a trace
    without predictions and no predictor: it would silently run its fallback."""


def resolve_predictor(predictor: Any, where: str = "predictor") -> tuple[Any, bool]:
    """``(Predictor or None, given)`` from ``None`` (not given), ``"none"`` (no predictor,
    on purpose), a spec ``"NAME[:key=value,...]"`` or a Predictor object."""
    if predictor is None:
        return None, False
    if isinstance(predictor, str):
        if predictor.strip().lower() == "none":
            return None, True
        from lpserve.policies.predictors import parse_predictor

        return parse_predictor(predictor, where), True
    return predictor, True


def check_predictions(instance: Any, policy: Policy, predictor_given: bool) -> None:
    """Raise :class:`MissingPredictions` when ``policy`` reads predicted output lengths,
    ``instance``'s trace carries none and no predictor was given."""
    readers = policy.reads_predictions
    tr = instance.trace
    if not readers or predictor_given or (tr.predicted_lo is not None
                                          and tr.predicted_hi is not None):
        return
    raise MissingPredictions(
        f"policy {policy.name!r} decides on predicted output lengths ({', '.join(readers)} "
        f"reads view.predicted_lo/hi), but trace {tr.name!r} carries no predictions and no "
        "predictor was given, so it would silently run its fallback (see its docstring). "
        "Give a predictor (predictor='history' for online quantiles of completed "
        "requests, 'noisy-oracle:sigma=0.5' for a perturbed truth; on the CLI --predictor), "
        "a trace with predicted_lo/hi, or predictor='none' to run the fallback on purpose")


def simulate(instance: Any, policy: str | Policy, seed: int = 0, *, predictor: Any = None,
             **options: Any) -> Any:
    """``lp.simulate``: :func:`lpserve.sim.simulate` where ``policy`` may also be a
    registered name (made fresh by :func:`make_policy`) and ``predictor`` a spec
    (``"history"``, ``"noisy-oracle:sigma=0.3"``; :func:`resolve_predictor`); ``options``
    (``reference``, ``check``, ``iteration_log``) go to the simulator. Returns its
    :class:`~lpserve.sim.Result`.

    Raises :class:`MissingPredictions` for a policy that reads predictions on a trace
    without them when no predictor is given (``predictor="none"`` runs its fallback on
    purpose), and a :class:`~lpserve.policy.PolicyError` naming the role, field and line
    when a policy writes into its read-only view or reads a field it may not see
    (:func:`~lpserve.policy.checks.explain_policy_error`).
    """
    from lpserve.policy.checks import explain_policy_error
    from lpserve.sim import simulate as run

    if isinstance(policy, str):
        policy = make_policy(policy)
    pred, given = resolve_predictor(predictor)
    if isinstance(policy, Policy) and hasattr(instance, "trace"):
        check_predictions(instance, policy, given)
    try:
        return run(instance, policy, seed, predictor=pred, **options)
    except (ValueError, TypeError, AttributeError) as exc:
        better = explain_policy_error(exc)
        if better is None:
            raise
        raise better from exc
