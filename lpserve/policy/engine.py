"""How one replica batches, reserves KV memory and preempts: :class:`EngineConfig`."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

import numpy as np

from lpserve.policy.hooks import BudgetController, PreemptionDecider, SpeculationDecider

__all__ = ["BATCHING_MODES", "DECISION_FIELDS", "ENGINE_TEXT_FIELDS", "HARDWARE_PROFILES",
           "HardwareDefaults",
           "LINK_ORDERS", "PREEMPTION_MODES", "TRANSFER_MODES", "EngineConfig",
           "parse_engine_value", "vllm_v1_batch_defaults"]

BATCHING_MODES = ("prefill-first", "decode-first", "mixed", "static")
PREEMPTION_MODES = ("recompute", "swap", "compress-swap")
TRANSFER_MODES = ("overlap", "serial")
LINK_ORDERS = ("fifo", "priority", "rmlq", "llf")
#: EngineConfig fields that are a policy's own decisions, not the machine's: a comparison
#: that runs several policies on one engine (``lp.compare(shared_engine=...)``) keeps
#: these from each policy and takes every other field from the shared engine
DECISION_FIELDS = ("priority_preemption", "budget_controller", "preemption_decider",
                   "speculation", "proactive_swap", "proactive_free_blocks", "link_order")


@dataclass(frozen=True)
class EngineConfig:
    """How one replica batches, reserves KV memory and preempts.

    Attributes:
        batching: ``"prefill-first"`` (vLLM V0: an iteration is either whole prefills of
            newly admitted requests or decodes of all running ones), ``"decode-first"``
            (Sarathi-Serve / vLLM chunked prefill: running decodes first, then prefill
            chunks within the token budget), ``"mixed"`` (Orca: decodes plus whole prefills
            in one iteration), ``"static"`` (request-level batching: admit only into an
            empty batch, which then runs until all of its requests finish).
        max_num_seqs: most requests in the running batch.
        max_num_batched_tokens: token budget of one iteration (prefill tokens + decodes).
        chunked_prefill: split prompts into chunks to fit the token budget (decode-first).
        preemption: ``"recompute"`` (drop KV, re-prefill later), ``"swap"`` (copy KV to
            host memory over PCIe, priced by the cost model; recompute when host is full)
            or ``"compress-swap"`` (quantize the KV by ``compression_ratio`` on the GPU,
            then swap the smaller copy; models/kv-compression-swap.md).
        compression_ratio: full / compressed KV bytes of ``"compress-swap"`` (4.0: FP16
            KV, the cost model's default KV dtype, to INT4; 2.0 from FP8 KV); finite, > 1.
        compression_accuracy_cost: quality loss per context token swapped compressed, a
            stated parameter (>= 0) that is reported, not simulated: timing ignores it.
        preemption_decider: ``None`` or a :class:`~lpserve.policy.hooks.PreemptionDecider`
            choosing recompute, swap or compress-swap per victim (replacing ``preemption``).
        reserve_tokens: ``None`` allocates KV blocks as tokens are produced; an integer
            reserves blocks for that many tokens at admission (Orca / static: the maximum
            sequence length).
        max_model_len: requests with ``prompt + output`` above it are rejected on arrival
            (the engine validates ``max_tokens`` as vLLM does); ``None`` for no limit.
        watermark: share of KV blocks kept free when admitting a new request (vLLM: 0.01).
        prefix_caching: keep full prompt blocks hashed after release and reuse them.
        evict_batch_blocks: cached blocks reclaimed at once when the plain free pool runs
            out (a low-watermark reclaim; LRU order is unaffected by the batch size).
        budget_controller: ``None`` or a :class:`~lpserve.policy.hooks.BudgetController` that sets the prefill
            token budget of every decode-first iteration (capped by
            ``max_num_batched_tokens``) and observes every iteration's time.
        priority_preemption: before admitting, preempt (by ``preemption``) the worst-ranked
            running requests whose rank is strictly worse than that of a better-ranked
            waiting request that cannot be admitted (batch full or KV memory short);
            needed by preemptive schedulers (SRPT, LAS, MLFQ, round robin).
        speculation: ``None`` or a speculation decider
            (:class:`~lpserve.policy.hooks.SpeculationDecider`): speculative
            decoding with a draft model on every pure-decode step (lpserve's simulator
            only; ``models/speculative-decoding.md``). Not combinable with
            ``budget_controller``.
        transfers: how swap copies use the replica's host (PCIe) link
            (``models/simulator.md`` (26)-(31)): ``"serial"`` (default, vLLM V0's blocking
            swap: the copy time is added to the next iteration) or ``"overlap"`` (a modern engine's copy stream: swap-outs and swap-ins are
            queued on the link and run concurrently with iterations; a swapped-out
            request's GPU blocks are freed when its copy ends, a swapped-in one runs once
            its KV is resident). Serial is the default: at low PCIe bandwidth overlapped copies queue up behind MLFQ's
            starvation promotions (``models/simulator.md``, "Why serial is the
            default").
        proactive_swap: FastServe's proactive KV swapping (needs ``transfers="overlap"``):
            a request preempted by priority keeps its KV on the GPU (only one whose KV
            has host room is preempted); the engine keeps ``proactive_free_blocks``
            blocks free for arrivals by swapping out the lowest-priority such requests
            ahead of need, into free host memory only, and swaps in the best-ranked
            swapped-out ones while that space allows (``models/simulator.md`` (30)).
        proactive_free_blocks: the free-block target of ``proactive_swap``; ``None`` takes
            FastServe's ``max(max batch size, minimum free threshold)``, i.e.
            ``max(max_num_seqs, watermark blocks)``.
        schedule_ahead: vLLM's async scheduling (on by default since vLLM 0.14): the
            batch of each iteration is fixed when the previous iteration starts, so a
            request that joins a replica while an iteration runs first waits for the
            iteration after the next one; a replica with nothing running admits it at once
            (``models/simulator.md`` (32)).
        link_order: which queued copy a free link starts next: ``"fifo"`` (issue order),
            ``"priority"`` (the scheduler's rank of the copy's request when it was issued),
            ``"llf"`` (least laxity first: the request's SLO deadline minus the copy time)
            or ``"rmlq"`` (MFS's reverse multi-level queue: laxity levels, promoted as the
            laxity shrinks; ``models/simulator.md`` (31)).
        kv_offload_gib: vLLM's CPU KV offload (``--kv-offloading-size``, native backend):
            GiB of host memory per replica (every tensor-parallel rank together) holding
            copies of computed prompt blocks in LRU order; a prompt that misses the GPU
            prefix cache loads the following blocks found there over the host link
            before its prefill (``models/simulator.md`` (35)). 0 (default) for none.
            Needs ``prefix_caching`` and ``batching="decode-first"``.
    """

    batching: str = "prefill-first"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = False
    preemption: str = "recompute"
    reserve_tokens: int | None = None
    max_model_len: int | None = None
    watermark: float = 0.01
    prefix_caching: bool = True
    evict_batch_blocks: int = 32
    budget_controller: Any = None
    priority_preemption: bool = False
    speculation: Any = None
    compression_ratio: float = 4.0
    compression_accuracy_cost: float = 0.0
    preemption_decider: Any = None
    transfers: str = "serial"
    proactive_swap: bool = False
    proactive_free_blocks: int | None = None
    link_order: str = "fifo"
    schedule_ahead: bool = False
    kv_offload_gib: float = 0.0

    def __post_init__(self) -> None:
        from lpserve.cost.base import check_ratio  # the cost package loads numba

        check_ratio(self.compression_ratio, "EngineConfig.compression_ratio")
        c = self.compression_accuracy_cost
        if isinstance(c, bool) or not isinstance(c, (int, float, np.number)) or \
                not (np.isfinite(c) and c >= 0):
            raise ValueError("EngineConfig.compression_accuracy_cost must be a finite number "
                             f">= 0, got {c!r}")
        if self.preemption_decider is not None and not isinstance(self.preemption_decider,
                                                                   PreemptionDecider):
            raise ValueError("EngineConfig.preemption_decider must be None or a "
                             f"PreemptionDecider, got {self.preemption_decider!r}")
        for k, modes in (("batching", BATCHING_MODES), ("preemption", PREEMPTION_MODES),
                         ("transfers", TRANSFER_MODES), ("link_order", LINK_ORDERS)):
            if getattr(self, k) not in modes:
                raise ValueError(f"EngineConfig.{k} must be one of {modes}, "
                                 f"got {getattr(self, k)!r}")
        for k in ("max_num_seqs", "max_num_batched_tokens", "evict_batch_blocks"):
            v = getattr(self, k)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"EngineConfig.{k} must be a positive integer, got {v!r}")
        for k in ("reserve_tokens", "max_model_len"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, (int, np.integer)) or v < 1):
                raise ValueError(f"EngineConfig.{k} must be None or a positive integer, "
                                 f"got {v!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"EngineConfig.watermark must be in [0, 1), got {self.watermark}")
        if self.budget_controller is not None and not isinstance(self.budget_controller,
                                                                  BudgetController):
            raise ValueError("EngineConfig.budget_controller must be None or a "
                             f"BudgetController, got {self.budget_controller!r}")
        if self.speculation is not None:
            if not isinstance(self.speculation, SpeculationDecider):
                raise ValueError("EngineConfig.speculation must be None or a "
                                 f"SpeculationDecider, got {self.speculation!r}")
            if self.budget_controller is not None:
                raise ValueError("EngineConfig.speculation cannot be combined with "
                                 "EngineConfig.budget_controller")
        if not isinstance(self.schedule_ahead, (bool, np.bool_)):
            raise ValueError(f"EngineConfig.schedule_ahead must be a bool, got "
                             f"{self.schedule_ahead!r}")
        if not isinstance(self.proactive_swap, (bool, np.bool_)):
            raise ValueError(f"EngineConfig.proactive_swap must be a bool, got "
                             f"{self.proactive_swap!r}")
        if self.proactive_swap and self.transfers != "overlap":
            raise ValueError("EngineConfig.proactive_swap needs transfers='overlap', got "
                             f"{self.transfers!r}")
        v = self.proactive_free_blocks
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                              or v < 0):
            raise ValueError("EngineConfig.proactive_free_blocks must be None or an integer "
                             f">= 0, got {v!r}")
        g = self.kv_offload_gib
        if isinstance(g, bool) or not isinstance(g, (int, float, np.number)) or \
                not (np.isfinite(g) and g >= 0):
            raise ValueError("EngineConfig.kv_offload_gib must be a finite number >= 0, "
                             f"got {g!r}")
        if g > 0 and not (self.prefix_caching and self.batching == "decode-first"):
            raise ValueError("EngineConfig.kv_offload_gib needs prefix_caching=True and "
                             f"batching='decode-first', got prefix_caching="
                             f"{self.prefix_caching!r}, batching={self.batching!r}")
        if self.chunked_prefill and self.batching != "decode-first":
            raise ValueError("EngineConfig.chunked_prefill needs batching='decode-first', "
                             f"got {self.batching!r}")

    def describe(self) -> str:
        """Every machine field, exactly (no rounding, no field left out), then the
        decisions set: ``"decode-first, chunked prefill, 2048 tokens/iteration, 256 seqs,
        recompute preemption, prefix caching, watermark 0, ..."``."""
        prefill = "chunked prefill" if self.chunked_prefill else "whole prefills"
        parts = [f"{self.batching}, {prefill}",
                 f"{self.max_num_batched_tokens} tokens/iteration",
                 f"{self.max_num_seqs} seqs", f"{self.preemption} preemption"]
        if self.preemption == "compress-swap":
            parts.append(f"compression {self.compression_ratio:g}x")
        parts += ["prefix caching" if self.prefix_caching else "no prefix caching",
                  f"watermark {self.watermark:g}"]
        if self.reserve_tokens is not None:
            parts.append(f"reserve {self.reserve_tokens} tokens")
        if self.max_model_len is not None:
            parts.append(f"max_model_len {self.max_model_len}")
        if self.preemption != "recompute" or self.preemption_decider is not None or \
                self.proactive_swap:
            parts.append(f"{self.transfers} swaps")
        if self.schedule_ahead:
            parts.append("schedule-ahead")
        if self.kv_offload_gib:
            parts.append(f"CPU KV offload {self.kv_offload_gib:g} GiB")
        if self.evict_batch_blocks != 32:
            parts.append(f"evict {self.evict_batch_blocks} blocks at once")
        if self.priority_preemption:
            parts.append("preempts by rank")
        if self.proactive_swap:
            n = self.proactive_free_blocks
            parts.append("proactive swap" + (f" ({n} free blocks)" if n is not None else ""))
        if self.link_order != "fifo":
            parts.append(f"{self.link_order} link order")
        for k in ("budget_controller", "preemption_decider", "speculation"):
            hook = getattr(self, k)
            if hook is not None:
                parts.append(f"{k.replace('_', ' ')} {getattr(hook, 'name', type(hook).__name__)}")
        return ", ".join(parts)

    def machine_fields(self) -> dict[str, Any]:
        """The fields that are not :data:`DECISION_FIELDS`: what a shared engine sets."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in DECISION_FIELDS}

    def updated(self, overrides: Mapping[str, Any], *, where: str = "engine") -> "EngineConfig":
        """A copy with ``overrides`` (field -> value; text values such as ``"131072"``,
        ``"true"`` or ``"none"`` are parsed by :func:`parse_engine_value`) applied and
        validated. Errors name ``where`` (e.g. the CLI flag) and the key."""
        known = [f.name for f in fields(EngineConfig)]
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in known:
                raise ValueError(f"{where}: unknown engine parameter {key!r}; EngineConfig "
                                 f"fields: {', '.join(ENGINE_TEXT_FIELDS)}"
                                 f" (objects, set in Python only: {', '.join(_OBJECT_FIELDS)})")
            changes[key] = parse_engine_value(key, value, where) if isinstance(value, str) \
                else _typed(key, value, where)
        try:
            return replace(self, **changes)
        except ValueError as exc:
            keys = ", ".join(f"{k}={overrides[k]!r}" for k in changes)
            raise ValueError(f"{where} ({keys}): {exc}") from None


#: EngineConfig fields that take an object (a hook): not settable from text
_OBJECT_FIELDS = ("budget_controller", "speculation", "preemption_decider")
#: EngineConfig fields settable from text (``--engine key=value``, grid ``[engine]``) ->
#: value kind: ``int``, ``int?`` (an integer or ``none``), ``float``, ``bool`` or the
#: tuple of allowed strings
ENGINE_TEXT_FIELDS: dict[str, Any] = {
    "batching": BATCHING_MODES, "max_num_seqs": "int", "max_num_batched_tokens": "int",
    "chunked_prefill": "bool", "preemption": PREEMPTION_MODES, "reserve_tokens": "int?",
    "max_model_len": "int?", "watermark": "float", "prefix_caching": "bool",
    "evict_batch_blocks": "int", "priority_preemption": "bool", "compression_ratio": "float",
    "compression_accuracy_cost": "float", "transfers": TRANSFER_MODES,
    "proactive_swap": "bool", "proactive_free_blocks": "int?", "link_order": LINK_ORDERS,
    "schedule_ahead": "bool", "kv_offload_gib": "float",
}
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def parse_engine_value(key: str, text: str, where: str = "engine") -> Any:
    """The typed value of engine field ``key`` written as ``text`` (``"131072"`` or
    ``"128_000"`` for integers, ``"none"`` for an unset optional integer, ``"true"`` /
    ``"false"`` for flags); a ValueError names ``where``, the key and the text."""
    if key in _OBJECT_FIELDS:
        raise ValueError(f"{where}: engine parameter {key!r} takes an object (a "
                         f"{key.replace('_', ' ')} hook) and cannot be set from text; build "
                         "the Policy in Python (policy.with_(engine={...}))")
    kind = ENGINE_TEXT_FIELDS.get(key)
    if kind is None:
        raise ValueError(f"{where}: unknown engine parameter {key!r}; EngineConfig fields: "
                         f"{', '.join(ENGINE_TEXT_FIELDS)}")
    t = text.strip()
    low = t.lower()
    bad = f"{where}: {key}={text!r}"
    if isinstance(kind, tuple):
        if t not in kind:
            raise ValueError(f"{bad}: must be one of {', '.join(kind)}")
        return t
    if kind == "bool":
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{bad}: must be true or false")
    if kind == "int?" and low == "none":
        return None
    if kind in ("int", "int?"):
        try:
            return int(t)
        except ValueError:
            raise ValueError(f"{bad}: must be an integer"
                             + (" or none" if kind == "int?" else "")) from None
    try:
        return float(t)
    except ValueError:
        raise ValueError(f"{bad}: must be a number") from None


def _typed(key: str, value: Any, where: str) -> Any:
    """A value given in Python: integers must not be booleans (``True`` is not 1 token)."""
    kind = ENGINE_TEXT_FIELDS.get(key)
    if kind in ("int", "int?") and isinstance(value, bool):
        raise ValueError(f"{where}: {key}={value!r}: must be an integer, not a boolean")
    if kind == "bool" and not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{where}: {key}={value!r}: must be True or False")
    return value

# ============================================================== hardware-dependent defaults
def vllm_v1_batch_defaults(gpu: str) -> dict[str, int]:
    """vLLM V1's online-serving (OpenAI API server) defaults of ``max_num_batched_tokens``
    and ``max_num_seqs`` on catalog GPU ``gpu``.

    vLLM's ``EngineArgs`` (``vllm/engine/arg_utils.py``, the default-setting step of
    ``create_engine_config``) picks 8,192 tokens and 1,024 sequences on a device with at
    least 70 GiB of memory whose name does not contain ``"a100"`` (H100, H200, MI300X,
    B200: "use larger default values"), and 2,048 tokens and 256 sequences otherwise (the
    A100 is excluded because the larger budget lowered its throughput, vLLM PR #17885).
    The offline ``LLM`` class uses 16,384 / 8,192 tokens instead; lpserve simulates a
    server, so it takes the server's values.
    """
    from lpserve.cost.catalog import get_gpu  # the cost package loads numba

    spec = get_gpu(gpu)
    large = spec.memory_gib >= 70.0 and "a100" not in spec.key.lower()
    return ({"max_num_batched_tokens": 8192, "max_num_seqs": 1024} if large
            else {"max_num_batched_tokens": 2048, "max_num_seqs": 256})


#: profile name -> function of the catalog GPU returning EngineConfig fields
HARDWARE_PROFILES = {"vllm-v1": vllm_v1_batch_defaults}


@dataclass(frozen=True)
class HardwareDefaults:
    """Engine fields an engine sets by the GPU it runs on, for a policy whose user left
    them at the engine's default.

    :meth:`lpserve.policy.Policy.bind` replaces ``fields`` of the policy's
    :class:`EngineConfig` by ``HARDWARE_PROFILES[profile](cluster.gpu)`` when a run starts;
    the configured values (the engine's fallback when the device is unknown) hold
    elsewhere. A field the user changes later (``Policy.with_``) leaves ``fields``.

    Attributes:
        profile: a key of :data:`HARDWARE_PROFILES` (``"vllm-v1"``).
        fields: the :class:`EngineConfig` fields still at the engine's default.
    """

    profile: str
    fields: frozenset = frozenset()

    def __post_init__(self) -> None:
        if self.profile not in HARDWARE_PROFILES:
            raise ValueError(f"HardwareDefaults.profile must be one of "
                             f"{sorted(HARDWARE_PROFILES)}, got {self.profile!r}")
        object.__setattr__(self, "fields", frozenset(self.fields))
        bad = sorted(self.fields - {f for f in EngineConfig.__dataclass_fields__})
        if bad:
            raise ValueError(f"HardwareDefaults.fields: not EngineConfig fields: {bad}")

    def for_cluster(self, cluster: Any) -> dict[str, Any]:
        """The EngineConfig changes for ``cluster``'s GPU (only the fields in ``fields``)."""
        vals = HARDWARE_PROFILES[self.profile](cluster.gpu)
        return {k: v for k, v in vals.items() if k in self.fields}

    def without(self, changed: Any) -> "HardwareDefaults | None":
        """These defaults less the fields in ``changed``; ``None`` when none is left."""
        left = self.fields - set(changed)
        return HardwareDefaults(self.profile, left) if left else None
