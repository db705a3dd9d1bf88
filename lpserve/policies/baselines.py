"""Baseline engines as named policies, with their documented defaults.

=============  ==============================================================================
``vllm``       vLLM today (the V1 engine, vLLM >= 0.8): FCFS, chunked prefill always on
               (decode-first: running requests first, then new prompts in chunks within
               the token budget), automatic prefix caching, recompute preemption of the
               newest running request, no watermark, and the online server's batch
               defaults for the cluster's GPU: 2,048 tokens and 256 sequences per
               iteration (A100, and GPUs under 70 GiB), 8,192 tokens and 1,024 sequences
               (H100, H200, H20, B200, MI300X); see
               :func:`lpserve.policy.engine.vllm_v1_batch_defaults`.
``vllm-v0``    vLLM's V0 scheduler (vLLM <= 0.7 default): FCFS, prefill-first iterations
               (whole prompts of newly admitted requests, decodes paused), blocks
               allocated as tokens are produced, recompute preemption of the newest running
               request, 1% watermark, 256 sequences, 4096 tokens per iteration, automatic
               prefix caching. A prompt above the token budget is never scheduled: it is
               rejected (``prompt_exceeds_token_budget``).
``vllm-chunked``  vLLM V0 with chunked prefill (``--enable-chunked-prefill``): decode-first,
               stall-free chunks within a 2048-token budget, otherwise as ``vllm-v0``.
``sarathi``    Sarathi-Serve: decode-first, stall-free chunked prefill with a 512-token
               budget (the paper's chunk size), 256 sequences, recompute preemption.
``orca``       Orca: iteration-level scheduling that mixes decodes and whole prefills in one
               iteration; KV reserved for the maximum sequence length (4096 tokens) at
               admission, so nothing is ever preempted; 128 sequences; no prefix caching.
``static``     Request-level batching as FasterTransformer: a batch of up to 32 requests is
               admitted into an empty engine and runs until its longest request finishes;
               KV reserved for 4096 tokens per request.
=============  ==============================================================================

Every factory accepts :class:`~lpserve.policy.EngineConfig` fields as keyword arguments
(``max_num_seqs=128``, ``preemption="swap"`` …) and ``router=`` (a router name or object).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from lpserve.policies import routers as R
from lpserve.policies import routers_deployed as RD
from lpserve.policies import routers_preble as RP
from lpserve.policy import FCFS, LRU, EngineConfig, Evictor, HardwareDefaults, Policy, Router

#: the names of every EngineConfig field (a factory keyword argument that configures the engine)
ENGINE_FIELDS = {f.name for f in fields(EngineConfig)}

ROUTERS = {
    "round-robin": R.RoundRobin,
    "random": R.RandomRouter,
    "least-outstanding": R.LeastOutstanding,
    "least-kv": R.LeastKVLoad,
    "power-of-two": R.PowerOfTwo,
    "prefix-affinity": R.PrefixAffinity,
    "autellix-lb": R.ProgramAffinity,
    # the KV-aware routers people deploy (routers_deployed.py, routers_preble.py)
    "dynamo-kv": RD.DynamoKV,
    "llm-d": RD.LlmdScheduler,
    "sglang-cache-aware": RD.SGLangCacheAware,
    "preble": RP.Preble,
}

ENGINE_DEFAULTS: dict[str, dict[str, Any]] = {
    # vLLM V1: EngineArgs defaults (vllm/engine/arg_utils.py): chunked prefill and prefix
    # caching on for generative models; the server's batch limits (2048 tokens, 256
    # sequences: vLLM's values when the device is unknown, and on A100 and small GPUs)
    # become 8192 / 1024 on >= 70 GiB GPUs other than the A100 (HARDWARE_DEFAULTS)
    "vllm": dict(batching="decode-first", chunked_prefill=True, max_num_seqs=256,
                 max_num_batched_tokens=2048, preemption="recompute", watermark=0.0,
                 prefix_caching=True),
    "vllm-v0": dict(batching="prefill-first", max_num_seqs=256, max_num_batched_tokens=4096,
                    preemption="recompute", watermark=0.01, prefix_caching=True),
    "vllm-chunked": dict(batching="decode-first", chunked_prefill=True, max_num_seqs=256,
                         max_num_batched_tokens=2048, preemption="recompute", watermark=0.01,
                         prefix_caching=True),
    "sarathi": dict(batching="decode-first", chunked_prefill=True, max_num_seqs=256,
                    max_num_batched_tokens=512, preemption="recompute", watermark=0.01,
                    prefix_caching=True),
    "orca": dict(batching="mixed", max_num_seqs=128, max_num_batched_tokens=1 << 20,
                 reserve_tokens=4096, max_model_len=4096, watermark=0.0, prefix_caching=False),
    "static": dict(batching="static", max_num_seqs=32, max_num_batched_tokens=1 << 20,
                   reserve_tokens=4096, max_model_len=4096, watermark=0.0,
                   prefix_caching=False),
}


#: engine -> (hardware profile, fields set by the GPU unless the user sets them)
HARDWARE_DEFAULTS: dict[str, tuple[str, frozenset]] = {
    "vllm": ("vllm-v1", frozenset({"max_num_batched_tokens", "max_num_seqs"})),
}


def _router(spec: Any) -> Router:
    if isinstance(spec, Router):
        return spec
    if isinstance(spec, str):
        if spec not in ROUTERS:
            raise KeyError(f"unknown router {spec!r}; known: {', '.join(sorted(ROUTERS))}")
        return ROUTERS[spec]()
    raise ValueError(f"router must be a name or a Router, got {spec!r}")


def engine_policy(engine: str, *, router: Any = "round-robin",
                  decode_router: Any = "round-robin", evictor: Evictor | str | None = None,
                  name: str | None = None, **params: Any) -> Policy:
    """A baseline engine (``ENGINE_DEFAULTS[engine]`` overridden by ``params``) with FCFS.

    ``evictor`` is an :class:`Evictor` or a name of
    :func:`lpserve.policies.evictors_kv.make_evictor` (``"knapsack"``, ``"radix-lru"``, ...).
    """
    if engine not in ENGINE_DEFAULTS:
        raise KeyError(f"unknown engine {engine!r}; known: {', '.join(ENGINE_DEFAULTS)}")
    bad = sorted(set(params) - ENGINE_FIELDS)
    if bad:
        raise ValueError(f"{engine}: unknown parameter(s) {bad}; engine parameters: "
                         f"{sorted(ENGINE_FIELDS)}, plus router, decode_router, evictor")
    cfg = EngineConfig(**{**ENGINE_DEFAULTS[engine], **params})
    if isinstance(evictor, str):
        from lpserve.policies.evictors_kv import make_evictor
        evictor = make_evictor(evictor)
    hd = None
    if engine in HARDWARE_DEFAULTS:
        profile, hw_fields = HARDWARE_DEFAULTS[engine]
        hd = HardwareDefaults(profile, hw_fields).without(params)
    return Policy(router=_router(router), scheduler=FCFS(), evictor=evictor or LRU(),
                  engine=cfg, decode_router=_router(decode_router), name=name or engine,
                  hardware_defaults=hd)


def vllm(**params: Any) -> Policy:
    """vLLM V1 (chunked prefill, decode-first, V1's server batch defaults for the cluster's
    GPU; see the module docstring) behind a round-robin router; ``params`` override
    :class:`~lpserve.policy.EngineConfig` fields and the router."""
    return engine_policy("vllm", **params)


def vllm_v0(**params: Any) -> Policy:
    """vLLM's V0 prefill-first scheduler (see the module docstring)."""
    return engine_policy("vllm-v0", **params)


def vllm_chunked(**params: Any) -> Policy:
    """vLLM with chunked prefill: decode-first, stall-free chunks within a 2048-token
    budget, otherwise as :func:`vllm_v0`; ``params`` override engine fields and the router."""
    return engine_policy("vllm-chunked", **params)


def sarathi(**params: Any) -> Policy:
    """Sarathi-Serve: decode-first, stall-free chunked prefill with a 512-token budget,
    256 sequences, recompute preemption; ``params`` override engine fields and the router."""
    return engine_policy("sarathi", **params)


def orca(**params: Any) -> Policy:
    """Orca: mixed iterations of decodes and whole prefills, KV reserved for 4096 tokens
    at admission (never preempts), 128 sequences, no prefix caching; ``params`` override
    engine fields and the router."""
    return engine_policy("orca", **params)


def static(**params: Any) -> Policy:
    """Request-level (static) batching: up to 32 requests admitted into an empty engine
    run until the longest finishes, KV reserved for 4096 tokens each; ``params`` override
    engine fields and the router."""
    return engine_policy("static", **params)


def routed(router: str):
    """Factory of the ``vllm`` engine behind the named router (registered per router)."""

    def factory(**params: Any) -> Policy:
        params.setdefault("name", f"vllm+{router}")
        return engine_policy("vllm", router=router, **params)

    factory.__name__ = f"vllm_{router.replace('-', '_')}"
    return factory


def evicting(evictor: str, engine: str = "vllm-chunked"):
    """Factory of ``engine`` with the named session-aware evictor (registered per evictor);
    the evictor's parameters (``SessionEvictorSpec`` fields) and any engine field are
    keyword arguments."""
    from lpserve.policies.evictors_sessions import SESSION_SPECS, SessionEvictorSpec

    if evictor not in SESSION_SPECS:
        raise KeyError(f"unknown session-aware evictor {evictor!r}; known: "
                       f"{', '.join(SESSION_SPECS)}")
    knobs = set(SessionEvictorSpec.__dataclass_fields__) - {"name", "mode", "online"}

    def factory(**params: Any) -> Policy:
        from lpserve.policies.evictors_kv import make_evictor

        ev = make_evictor(evictor, **{k: params.pop(k) for k in list(params) if k in knobs})
        params.setdefault("name", f"{engine}+{evictor}")
        return engine_policy(engine, evictor=ev, **params)

    factory.__name__ = f"{engine.replace('-', '_')}_{evictor.replace('-', '_')}"
    return factory
