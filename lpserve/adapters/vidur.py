"""Vidur adapter: lpserve policies inside Vidur, and lpserve's cost model as Vidur's
execution-time predictor.

Supported Vidur: PyPI ``vidur==0.0.26`` only (GitHub ``microsoft/vidur`` main has another
API). Importing this module checks the installed version and registers, under new enum
keys, four classes in Vidur's registries:

=====================================  ===================================================
``--global_scheduler_config_type``     ``lpserve``: the policy's :class:`~lpserve.policy.Router`
  ``lpserve``                          picks the replica of each arriving request.
``--replica_scheduler_config_type``    ``lpserve_vllm``: Vidur's vLLM replica scheduler
  ``lpserve_vllm``                     (prefill-first, recompute preemption) whose waiting
                                       order and preemption victims come from the policy's
                                       :class:`~lpserve.policy.Scheduler` ranks.
``--execution_time_predictor_config``  ``lpserve_cost``: every batch priced by
  ``_type lpserve_cost``               :func:`lpserve.cost_model` (no profiling data, no
                                       predictor training).
``--request_generator_config_type``    ``lpserve_trace``: requests from a CSV with columns
  ``lpserve_trace``                    ``arrival_s, prompt_tokens, output_tokens``.
=====================================  ===================================================

The policy is named by ``policy`` / ``params_json`` fields of the lpserve configs (CLI:
``--lpserve_global_scheduler_config_policy`` …) or by ``$LPSERVE_POLICY`` /
``$LPSERVE_POLICY_PARAMS``. ``python -m lpserve.adapters.vidur <vidur.main args>`` runs
Vidur's command line with these types available; :func:`simulation_config` and
:func:`run` build and run a configuration from Python.
"""
# no "from __future__ import annotations": Vidur's CLI reads the config dataclasses'
# field types at run time
import importlib.metadata
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SUPPORTED_VIDUR = ("0.0.26",)


def _check_version() -> str:
    try:
        v = importlib.metadata.version("vidur")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ImportError("lpserve.adapters.vidur needs Vidur: pip install vidur==0.0.26 "
                          "(or bash scripts/vidur-env.sh)") from exc
    if v not in SUPPORTED_VIDUR:
        raise ImportError(f"lpserve.adapters.vidur supports vidur {', '.join(SUPPORTED_VIDUR)}; "
                          f"found vidur {v}. Install vidur==0.0.26.")
    return v


VIDUR_VERSION = _check_version()

import pandas as pd
from vidur._native.entities import ExecutionTime as ExecutionTimeC
from vidur.config import (
    BaseExecutionTimePredictorConfig,
    BaseGlobalSchedulerConfig,
    BaseRequestGeneratorConfig,
    VllmSchedulerConfig,
)
from vidur.entities import Request
from vidur.execution_time_predictor import (
    BaseExecutionTimePredictor,
    ExecutionTimePredictorRegistry,
)
from vidur.request_generator import RequestGeneratorRegistry
from vidur.request_generator.base_request_generator import BaseRequestGenerator
from vidur.scheduler import GlobalSchedulerRegistry
from vidur.scheduler.global_scheduler.base_global_scheduler import BaseGlobalScheduler
from vidur.scheduler.replica_scheduler.replica_scheduler_registry import (
    ReplicaSchedulerRegistry,
)
from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import (
    VLLMReplicaScheduler,
)
from vidur.types import BaseIntEnum, ReplicaId

from lpserve.adapters import _order
from lpserve.adapters._vidur_names import cluster_of as _cluster_of
from lpserve.adapters._vidur_names import lpserve_keys as _lpserve_keys
from lpserve.policy import RouterView


# Vidur's key enums cannot be extended; new enums with values no Vidur key uses.
class LpserveGlobalSchedulerType(BaseIntEnum):
    """Vidur key of the ``lpserve`` global scheduler (a value no Vidur key uses)."""
    LPSERVE = 101


class LpserveReplicaSchedulerType(BaseIntEnum):
    """Vidur key of the ``lpserve_vllm`` replica scheduler."""
    LPSERVE_VLLM = 101


class LpservePredictorType(BaseIntEnum):
    """Vidur key of the ``lpserve_cost`` execution-time predictor."""
    LPSERVE_COST = 101


class LpserveRequestGeneratorType(BaseIntEnum):
    """Vidur key of the ``lpserve_trace`` request generator."""
    LPSERVE_TRACE = 101


_POLICY_HELP = ("lpserve policy: a registered name or 'module:attr' (default: "
                "$LPSERVE_POLICY)")
_PARAMS_HELP = "lpserve policy parameters as a JSON object (default: $LPSERVE_POLICY_PARAMS)"


def _spec(policy: str, params_json: str) -> tuple[str, dict[str, Any]]:
    cfg = {_order.CONFIG_POLICY_KEY: policy} if policy else {}
    if policy and params_json not in ("", "{}"):
        cfg[_order.CONFIG_PARAMS_KEY] = params_json
    return _order.policy_spec(cfg)


# ================================================================================ configs
@dataclass
class LpserveGlobalSchedulerConfig(BaseGlobalSchedulerConfig):
    """``--global_scheduler_config_type lpserve``: route with the router of ``policy``
    (``params_json`` its parameters)."""
    policy: str = field(default="", metadata={"help": _POLICY_HELP})
    params_json: str = field(default="{}", metadata={"help": _PARAMS_HELP})

    @staticmethod
    def get_type():
        """The registry key of :class:`LpserveGlobalScheduler`."""
        return LpserveGlobalSchedulerType.LPSERVE


@dataclass
class LpserveVllmSchedulerConfig(VllmSchedulerConfig):
    """``--replica_scheduler_config_type lpserve_vllm``: Vidur's vLLM scheduler options
    plus the lpserve ``policy``, its ``params_json`` and an optional ``record_views`` file."""
    policy: str = field(default="", metadata={"help": _POLICY_HELP})
    params_json: str = field(default="{}", metadata={"help": _PARAMS_HELP})
    record_views: str = field(default="", metadata={
        "help": "append every ranking to this JSON-lines file (default: $LPSERVE_RECORD_VIEWS)"})

    @staticmethod
    def get_type():
        """The registry key of :class:`LpserveVllmReplicaScheduler`."""
        return LpserveReplicaSchedulerType.LPSERVE_VLLM


@dataclass
class LpserveCostPredictorConfig(BaseExecutionTimePredictorConfig):
    """``--execution_time_predictor_config_type lpserve_cost``: the catalog ``gpu`` and
    ``llm`` to price batches with (derived from Vidur's device and model when empty)."""
    gpu: str = field(default="", metadata={
        "help": "lpserve GPU key (default: from --replica_config_device, a100 -> a100-80gb)"})
    llm: str = field(default="", metadata={
        "help": "lpserve LLM key (default: from --replica_config_model_name)"})

    @staticmethod
    def get_type():
        """The registry key of :class:`LpserveCostPredictor`."""
        return LpservePredictorType.LPSERVE_COST


@dataclass
class LpserveTraceRequestGeneratorConfig(BaseRequestGeneratorConfig):
    """``--request_generator_config_type lpserve_trace``: the CSV ``trace_file`` to
    replay (see :func:`write_trace_csv`)."""
    trace_file: str = field(default="", metadata={
        "help": "CSV with columns arrival_s, prompt_tokens, output_tokens"})

    @staticmethod
    def get_type():
        """The registry key of :class:`LpserveTraceRequestGenerator`."""
        return LpserveRequestGeneratorType.LPSERVE_TRACE


# ================================================================================ cost model
def batch_arrays(batch: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(prefill_tokens, prefill_cached, decode_context)`` of a Vidur batch.

    A request whose prefill is incomplete (or that gets more than one query token)
    prefills ``q`` tokens on top of ``kv - q`` already in KV; the others decode with a
    context of ``kv`` tokens.
    """
    pt, pc, dc = [], [], []
    for r, q, kv in zip(batch.requests, batch.num_q_tokens, batch.num_kv_tokens):
        if q > 1 or not r.is_prefill_complete:
            pt.append(q)
            pc.append(kv - q)
        else:
            dc.append(kv)
    return (np.asarray(pt, np.int64), np.asarray(pc, np.int64), np.asarray(dc, np.int64))


class LpserveCostPredictor(BaseExecutionTimePredictor):
    """Vidur execution-time predictor backed by lpserve's calibrated analytic cost model.

    The whole iteration time is reported as one per-layer component of Vidur's
    ``ExecutionTime`` (``model_time = layers x block time``), so Vidur's totals equal
    :meth:`lpserve.cost.CostModel.batch_time_s` of the batch.
    """

    def __init__(self, predictor_config, replica_config, cache_config) -> None:
        super().__init__(predictor_config, replica_config, cache_config)
        from lpserve.cost import cost_model

        if replica_config.num_pipeline_stages != 1:
            raise ValueError("lpserve_cost predictor prices whole replicas; "
                             f"num_pipeline_stages={replica_config.num_pipeline_stages} "
                             "is not supported (use 1)")
        gpu, llm = _lpserve_keys(predictor_config.gpu, predictor_config.llm, replica_config)
        self.cost = cost_model(gpu=gpu, llm=llm, tp=replica_config.tensor_parallel_size)
        self.gpu, self.llm = gpu, llm

    def batch_time_s(self, batch: Any) -> float:
        """Seconds of one iteration of the Vidur ``batch``
        (:meth:`lpserve.cost.CostModel.batch_time_s` of its :func:`batch_arrays`)."""
        pt, pc, dc = batch_arrays(batch)
        return self.cost.batch_time_s(prefill_tokens=pt, prefill_cached=pc, decode_context=dc)

    def get_execution_time(self, batch: Any, pipeline_stage: int) -> ExecutionTimeC:
        """Vidur's ``ExecutionTime`` of ``batch``: the iteration time in ms divided
        over the stage's layers and carried in one per-layer slot, so Vidur's total equals
        :meth:`batch_time_s`. Refuses KV-parallel batches."""
        if hasattr(batch, "batch_mapping"):
            raise ValueError("lpserve_cost predictor does not price KV-parallel batches")
        per_layer_ms = self.batch_time_s(batch) * 1e3 / self._num_layers_per_pipeline_stage
        parts = [0.0] * 14
        parts[3] = per_layer_ms  # attention_prefill slot carries the whole layer time
        return ExecutionTimeC(self._num_layers_per_pipeline_stage, *parts)

    # Vidur's per-operation hooks are abstract in its base class and must exist, but this
    # predictor overrides get_execution_time, which prices the whole batch, so Vidur never
    # reaches them. Reaching one means Vidur's call path changed: fail loudly.
    def _unused(self, batch: Any) -> float:
        raise RuntimeError("lpserve_cost predictor: Vidur called a per-operation timing hook; "
                           "this predictor prices whole batches in get_execution_time "
                           f"(supported: vidur=={VIDUR_VERSION})")

    _get_attention_layer_pre_proj_execution_time = _unused
    _get_attention_layer_post_proj_execution_time = _unused
    _get_attention_rope_execution_time = _unused
    _get_attention_kv_cache_save_execution_time = _unused
    _get_attention_decode_execution_time = _unused
    _get_attention_prefill_execution_time = _unused
    _get_mlp_layer_up_proj_execution_time = _unused
    _get_mlp_layer_down_proj_execution_time = _unused
    _get_mlp_layer_act_execution_time = _unused
    _get_tensor_parallel_communication_time = _unused
    _get_pipeline_parallel_communication_time = _unused
    _get_mlp_norm_layer_act_execution_time = _unused
    _get_attn_norm_layer_act_execution_time = _unused
    _get_add_layer_act_execution_time = _unused
    _get_kv_parallel_communication_time = _unused


# ================================================================================ requests
class LpserveTraceRequestGenerator(BaseRequestGenerator):
    """Requests from a CSV (``arrival_s, prompt_tokens, output_tokens``), in file order, so
    Vidur's request ids are the row numbers in a fresh process."""

    def generate_requests(self) -> list[Request]:
        """One Vidur ``Request`` per CSV row, in file order (arrival in s, prompt and
        output tokens); a ValueError names a missing file or column."""
        path = self.config.trace_file
        if not path or not os.path.exists(path):
            raise ValueError(f"lpserve_trace request generator: trace_file {path!r} not found")
        df = pd.read_csv(path)
        need = ["arrival_s", "prompt_tokens", "output_tokens"]
        missing = [c for c in need if c not in df.columns]
        if missing:
            raise ValueError(f"lpserve_trace request generator: {path} lacks column(s) "
                             f"{missing}; has {list(df.columns)}")
        return [Request(arrived_at=float(a), num_prefill_tokens=int(p), num_decode_tokens=int(o))
                for a, p, o in df[need].itertuples(index=False)]


def write_trace_csv(trace: Any, path: str) -> str:
    """Write an :class:`lpserve.Trace` as the CSV the ``lpserve_trace`` generator reads."""
    pd.DataFrame({"arrival_s": np.asarray(trace.arrival_s, np.float64),
                  "prompt_tokens": np.asarray(trace.prompt_tokens, np.int64),
                  "output_tokens": np.asarray(trace.output_tokens, np.int64)}).to_csv(
        path, index=False)
    return path


# ================================================================================ schedulers
class LpserveGlobalScheduler(BaseGlobalScheduler):
    """Routes each arriving request with the lpserve policy's router."""

    def __init__(self, config, replicas) -> None:
        super().__init__(config, replicas)
        gcfg = config.cluster_config.global_scheduler_config
        spec, params = _spec(gcfg.policy, gcfg.params_json)
        self.policy_name = spec
        self.router = _order.resolve_router(spec, params)
        cc = config.cluster_config
        self.router.reset(_cluster_of(cc.replica_config, cc.cache_config, cc.num_replicas),
                          np.random.default_rng(config.seed))
        self._ids = sorted(replicas, key=lambda r: r.id)

    def _replica_state(self) -> dict[str, np.ndarray]:
        s = [self._replica_schedulers[i] for i in self._ids]
        waiting = np.array([x.num_pending_requests for x in s], np.int64)
        running = np.array([len(x._allocation_map) for x in s], np.int64)
        return {"outstanding": waiting + running, "waiting": waiting, "running": running,
                "used_blocks": np.array([x.num_allocated_blocks for x in s], np.int64),
                "total_blocks": np.array([x._cache_config.num_blocks for x in s], np.int64)}

    def schedule(self) -> list[tuple[ReplicaId, Request]]:
        """Route every queued request (sorted by arrival) in one router call: a
        :class:`~lpserve.policy.RouterView` with Vidur's request ids and each replica's
        outstanding, waiting, running and KV-block counts; returns ``(replica id, request)``
        pairs after the routes are checked."""
        self.sort_requests()
        reqs, self._request_queue = self._request_queue, []
        if not reqs:
            return []
        n = len(reqs)
        view = RouterView(
            now_s=max(r.arrived_at for r in reqs), n_replicas=len(self._ids),
            phase="colocated", request=[r.id for r in reqs],
            arrival_s=[r.arrived_at for r in reqs],
            prompt_tokens=[r.num_prefill_tokens for r in reqs],
            tenant=np.full(n, -1), session_id=np.full(n, -1), predicted_lo=None,
            predicted_hi=None, output_tokens=None, block_keys=tuple(),
            replica_state=self._replica_state, cached_tokens=np.zeros((n, len(self._ids))))
        out = _order.checked_routes(self.router, view, self.policy_name)
        return [(self._ids[int(k)], r) for k, r in zip(out, reqs)]


class LpserveVllmReplicaScheduler(VLLMReplicaScheduler):
    """Vidur's vLLM replica scheduler with the lpserve policy choosing the order.

    At every batch decision the waiting queue and the running requests are ranked in one
    view: waiting requests are admitted in rank order (``+inf`` held back), and when KV
    memory runs out the worst-ranked running request is preempted (recompute) first.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self._config
        spec, params = _spec(getattr(cfg, "policy", ""), getattr(cfg, "params_json", "{}"))
        self.policy_name = spec
        self.scheduler = _order.resolve_scheduler(spec, params)
        self.scheduler.reset(_cluster_of(self._replica_config, self._cache_config, 1),
                             np.random.default_rng(int(self._request_generator_config.seed)))
        self._prompt0: dict[int, int] = {}
        self.recorder = _order.ViewRecorder(
            getattr(cfg, "record_views", "") or os.environ.get(_order.ENV_RECORD),
            engine=f"vidur-{VIDUR_VERSION}", policy=spec, params=params)
        self.n_rankings = 0

    def add_request(self, request: Request) -> None:
        """Remember the request's original prompt length (Vidur folds decoded tokens into
        the prefill on a restart), then queue it as Vidur does."""
        self._prompt0.setdefault(request.id, request.num_prefill_tokens)
        super().add_request(request)

    def _view(self, cand: list, n_wait: int, time: float) -> Any:
        """One view of the waiting (first ``n_wait``) and running candidates."""
        p0 = self._prompt0
        prompt = [p0.get(r.id, r.num_prefill_tokens) for r in cand]
        processed = [r.num_processed_tokens for r in cand]
        prefill = [r.num_prefill_tokens for r in cand]
        return _order.view_from_columns(
            {"request": [r.id for r in cand], "arrival_s": [r.arrived_at for r in cand],
             "prompt_tokens": prompt,
             # tokens decoded before restarts (folded into the prefill) + since
             "generated_tokens": [f - q + (c - f if c > f else 0)
                                  for q, f, c in zip(prompt, prefill, processed)],
             "computed_tokens": processed,
             "running": [False] * n_wait + [True] * (len(cand) - n_wait),
             "preemptions": [r.num_restarts for r in cand],
             "first_scheduled_s": [r._scheduled_at if (r.scheduled or r.num_restarts)
                                   else math.nan for r in cand]},
            now_s=float(time), replica=int(self._replica_id.id),
            free_blocks=int(self._cache_config.num_blocks - self._num_allocated_blocks),
            total_blocks=int(self._cache_config.num_blocks),
            block_tokens=int(self._cache_config.block_size))

    def _apply_policy(self, time: float) -> list[Request]:
        """Sort waiting and running lists by rank; return the held-back waiting requests
        (removed from the queue for this decision)."""
        waiting, running = self._request_queue, self._preempted_requests
        if not waiting and not running:
            return []
        cand = waiting + running
        view = self._view(cand, len(waiting), time)
        d = _order.decide(self.scheduler, view, self.policy_name)
        self.n_rankings += 1
        self._request_queue = [cand[i] for i in d.waiting]
        self._preempted_requests = [cand[i] for i in d.running]
        held = [cand[i] for i in d.held]
        if self.recorder.path is not None:
            view_kw = dict(now_s=view.now_s, replica=view.replica,
                           free_blocks=view.free_blocks, total_blocks=view.total_blocks,
                           block_tokens=view.block_tokens)
            self.recorder.record(_order.records_from_view(view), view_kw, d, applied={
                "waiting": [int(r.id) for r in self._request_queue],
                "running": [int(r.id) for r in self._preempted_requests],
                "held": [int(r.id) for r in held]})
        return held

    @staticmethod
    def _restart(request: Request) -> None:
        # vidur 0.0.26's Request.restart() leaves the per-stage counters of the previous
        # run in place, which trips an assertion at the request's next stage end
        request.restart()
        request._num_stage_processed_tokens = 0
        request._is_prefill_stage_complete = False

    def _get_next_batch(self, time: float):
        held = self._apply_policy(time)
        try:
            return self._vllm_batch()
        finally:
            self._request_queue.extend(held)

    def _vllm_batch(self):
        # Vidur's VLLMReplicaScheduler._get_next_batch, with the running list kept in the
        # policy's order (not re-sorted by arrival), so the victim is the worst-ranked.
        from vidur.entities.batch import Batch

        requests, num_q, num_kv, total_q = [], [], [], 0
        while self._request_queue:
            request = self._request_queue[0]
            q = self._get_request_next_num_q_tokens(request)
            if not self._can_allocate_request(request):
                break
            if total_q + q > self._config.max_tokens_in_batch:
                break
            if len(self._allocation_map) == self._config.batch_size_cap:
                break
            if len(requests) == self._max_micro_batch_size:
                break
            self._request_queue.pop(0)
            self._allocate_request(request)
            requests.append(request)
            num_q.append(q)
            num_kv.append(request.num_processed_tokens + q)
            total_q += q
        if requests:
            return Batch(self._replica_id, requests, num_q, num_kv)

        while self._preempted_requests:
            if len(requests) == self._max_micro_batch_size:
                break
            request = self._preempted_requests.pop(0)
            while not self._can_allocate_request(request):
                victim = self._preempted_requests.pop(-1) if self._preempted_requests \
                    else request
                self._restart(victim)
                self.free(victim.id)
                self._request_queue = [victim] + self._request_queue
                if victim is request:
                    break
            else:
                self._allocate_request(request)
                q = self._get_request_next_num_q_tokens(request)
                requests.append(request)
                num_q.append(q)
                num_kv.append(request.num_processed_tokens + q)
        if not requests:
            return None
        return Batch(self._replica_id, requests, num_q, num_kv)


# ================================================================================ wiring
def register() -> None:
    """Register the lpserve classes in Vidur's registries (idempotent; done on import)."""
    GlobalSchedulerRegistry.register(LpserveGlobalSchedulerType.LPSERVE, LpserveGlobalScheduler)
    ReplicaSchedulerRegistry.register(LpserveReplicaSchedulerType.LPSERVE_VLLM,
                                      LpserveVllmReplicaScheduler)
    ExecutionTimePredictorRegistry.register(LpservePredictorType.LPSERVE_COST,
                                            LpserveCostPredictor)
    RequestGeneratorRegistry.register(LpserveRequestGeneratorType.LPSERVE_TRACE,
                                      LpserveTraceRequestGenerator)


register()


def simulation_config(*, policy: str, params: dict[str, Any] | None = None,
                      output_dir: str, trace_csv: str | None = None,
                      synthetic: dict[str, Any] | None = None, num_replicas: int = 1,
                      model_name: str = "meta-llama/Llama-2-7b-hf", device: str = "a100",
                      network_device: str = "a100_dgx", tp: int = 1,
                      batch_size_cap: int = 128, max_tokens_in_batch: int = 4096,
                      num_blocks: int | None = None, lpserve_router: bool = True,
                      lpserve_cost: bool = True, record_views: str = "",
                      seed: int = 42) -> Any:
    """A Vidur ``SimulationConfig`` that runs ``policy`` (router and replica scheduler)
    on ``trace_csv`` (see :func:`write_trace_csv`) or Vidur's synthetic generator
    (``synthetic``: ``num_requests``, ``qps``, ``min_tokens``, ``max_tokens``,
    ``prefill_to_decode_ratio``), priced by lpserve's cost model unless
    ``lpserve_cost=False``. ``num_blocks`` overrides the KV blocks per replica (Vidur
    derives them from GPU memory otherwise). Chrome traces and plots are off."""
    from vidur.config import (
        CacheConfig,
        ClusterConfig,
        MetricsConfig,
        PoissonRequestIntervalGeneratorConfig,
        ReplicaConfig,
        RoundRobinGlobalSchedulerConfig,
        SimulationConfig,
        SyntheticRequestGeneratorConfig,
        UniformRequestLengthGeneratorConfig,
    )

    params_json = json.dumps(params or {})
    if (trace_csv is None) == (synthetic is None):
        raise ValueError("simulation_config: give exactly one of trace_csv and synthetic")
    if trace_csv is not None:
        gen: Any = LpserveTraceRequestGeneratorConfig(seed=seed, trace_file=trace_csv)
    else:
        s = dict(synthetic)
        unknown = sorted(set(s) - {"num_requests", "qps", "min_tokens", "max_tokens",
                                   "prefill_to_decode_ratio"})
        if unknown:
            raise ValueError(f"simulation_config: unknown synthetic key(s) {unknown}")
        gen = SyntheticRequestGeneratorConfig(
            seed=seed, num_requests=int(s.get("num_requests", 10000)),
            length_generator_config=UniformRequestLengthGeneratorConfig(
                seed=seed, min_tokens=int(s.get("min_tokens", 512)),
                max_tokens=int(s.get("max_tokens", 2048)),
                prefill_to_decode_ratio=float(s.get("prefill_to_decode_ratio", 3.0))),
            interval_generator_config=PoissonRequestIntervalGeneratorConfig(
                seed=seed, qps=float(s.get("qps", 3.0))))
    predictor = LpserveCostPredictorConfig() if lpserve_cost else None
    os.makedirs(output_dir, exist_ok=True)
    kw: dict[str, Any] = {}
    if predictor is not None:
        kw["execution_time_predictor_config"] = predictor
    return SimulationConfig(
        seed=seed,
        cluster_config=ClusterConfig(
            num_replicas=num_replicas,
            replica_config=ReplicaConfig(model_name=model_name, device=device,
                                         network_device=network_device,
                                         tensor_parallel_size=tp, num_pipeline_stages=1),
            cache_config=CacheConfig(num_blocks=num_blocks),
            global_scheduler_config=(LpserveGlobalSchedulerConfig(policy=policy,
                                                                  params_json=params_json)
                                     if lpserve_router else RoundRobinGlobalSchedulerConfig()),
            replica_scheduler_config=LpserveVllmSchedulerConfig(
                batch_size_cap=batch_size_cap, max_tokens_in_batch=max_tokens_in_batch,
                policy=policy, params_json=params_json, record_views=record_views)),
        request_generator_config=gen,
        metrics_config=MetricsConfig(output_dir=output_dir, enable_chrome_trace=False,
                                     store_plots=False, write_json_trace=False),
        **kw)


def reset_entity_ids() -> None:
    """Restart Vidur's class-level id counters (requests, replicas, batches, ...) at 0,
    as in a fresh process. Vidur's metrics index replicas by id, so a second simulation
    in one process needs this; it also makes request ids equal trace rows."""
    from vidur.entities.base_entity import BaseEntity

    stack = [BaseEntity]
    while stack:
        cls = stack.pop()
        if "_id" in vars(cls) or cls is not BaseEntity:
            cls._id = -1
        stack.extend(cls.__subclasses__())


def run(config: Any) -> Any:
    """Run a Vidur ``SimulationConfig`` (entity ids restarted, see
    :func:`reset_entity_ids`); returns the finished ``Simulator`` (its request metrics
    are in ``<output_dir>/request_metrics.csv``)."""
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    reset_entity_ids()
    set_seeds(config.seed)
    sim = Simulator(config)
    sim.run()
    return sim


def main(argv: list[str] | None = None) -> None:
    """``vidur.main`` with the lpserve types registered."""
    import sys

    from vidur.config import SimulationConfig

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    run(SimulationConfig.create_from_cli_args())


if __name__ == "__main__":
    main()
