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
    """Factory of the ``vllm`` engine behind round robin with the ``kind`` rebalancer
    (:data:`REBALANCERS`); the rebalancer's parameters and any engine field are keyword
    arguments."""
    if kind not in REBALANCERS:
        raise KeyError(f"unknown rebalancer {kind!r}; known: {', '.join(REBALANCERS)}")

    def factory(**params: Any) -> Policy:
        knobs = {k: params.pop(k) for k in list(params) if k in _REBALANCER_KNOBS}
        params.setdefault("name", f"rebalance-{kind}")
        pol = B.engine_policy("vllm", **params)
        return pol.with_(rebalancer=REBALANCERS[kind](**knobs), meta=None)

    factory.__name__ = f"rebalance_{kind}"
    return factory


# the round model of MC-SF / A_max / A_min: new requests join the running batch (mixed)
_MCSF_ENGINE = dict(batching="mixed", watermark=0.0, prefix_caching=False)

POLICIES: dict[str, Callable[..., Policy]] = {
    "vllm": B.vllm,
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
    "fastserve": SC.scheduled(MQ.MLFQ, "fastserve", preemptive=True, entry="prefill"),
    "mlfq-predicted": SC.scheduled(MQ.MLFQ, "mlfq-predicted", preemptive=True,
                                   entry="predicted"),
    "fastserve-adaptive": SC.scheduled(MQ.MLFQ, "fastserve-adaptive", preemptive=True,
                                       entry="prefill", adaptive_starvation=True),
    "plas": SC.scheduled(PG.ProgramScheduler, "plas", preemptive=True, mode="plas"),
    "atlas": SC.scheduled(PG.ProgramScheduler, "atlas", preemptive=True, mode="atlas"),
    "plas-mlfq": SC.scheduled(PG.ProgramScheduler, "plas-mlfq", preemptive=True,
                              mode="plas", two_level=True),
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
    # the KV-aware routers people deploy, behind the vllm engine (routers_deployed.py,
    # routers_preble.py)
    "vllm+dynamo-kv": B.routed("dynamo-kv"),
    "vllm+llm-d": B.routed("llm-d"),
    "vllm+sglang-cache-aware": B.routed("sglang-cache-aware"),
    "vllm+preble": B.routed("preble"),
}


def policy_names() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(POLICIES)


def make_policy(name: str, **params: Any) -> Policy:
    """A fresh policy by registered name; ``params`` go to its factory."""
    if not isinstance(name, str) or name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; registered: {', '.join(policy_names())}")
    return POLICIES[name](**params)


def simulate(instance: Any, policy: str | Policy, seed: int = 0, **options: Any) -> Any:
    """``lp.simulate``: :func:`lpserve.sim.simulate` where ``policy`` may also be a
    registered name (made fresh by :func:`make_policy`); ``options`` (``reference``,
    ``check``, ``predictor``) go to the simulator. Returns its
    :class:`~lpserve.sim.Result`."""
    from lpserve.sim import simulate as run

    if isinstance(policy, str):
        policy = make_policy(policy)
    return run(instance, policy, seed, **options)
