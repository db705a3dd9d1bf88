"""Speculative decoding inside the simulator (``EngineConfig.speculation``).

When a policy's engine has a speculation decider (:mod:`lpserve.policies.speculation`),
every pure-decode step of a colocated or decode replica is a speculative step
(:mod:`lpserve.sim._spec_kernels`) instead of a run of decode iterations: the decider
picks an arm ``(k, draft)``, the draft proposes ``k`` tokens per sequence (``k`` draft
iterations over the batch), the target verifies ``k + 1`` positions per sequence in one
iteration, and each sequence keeps its accepted prefix plus one target token. Here: the
run's draft cost models, acceptance rates and counters (:class:`SpecRunner`), the KV
sizing with the drafts loaded (:func:`speculation_memory`), and the
:class:`~lpserve.policy.StepContext` a decider written in Python is shown in a pause
(:func:`step_context`).

Equations (cited as ``(n)``) are those of ``models/speculative-decoding.md``: draft
memory (1)-(3), draft prefill and lag (4), step time (5)-(6), blocks (7), tokens (8)-(9),
decider rewards (10)-(11).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.cost import iteration_time
from lpserve.cost.speculation import batch_bucket
from lpserve.policy import StepContext

__all__ = ["SpecRunner", "batch_class", "speculation_memory", "step_context"]

_EMPTY = np.zeros(0, np.int64)


def speculation_memory(target: Any, drafts: list[Any], gpu_memory_fraction: float,
                       host_memory_gb: float, block_tokens: int, where: str
                       ) -> tuple[int, int, float]:
    """KV blocks on one replica with the target and every draft loaded, eq. (1)-(3):
    ``(total_blocks, host_blocks, kv_scale)``, where ``kv_scale`` is the KV bytes per
    token of all models over the target's. ``where`` names the policy in errors."""
    f = float(gpu_memory_fraction)
    # (1) bytes left for KV on one GPU: the target's and every draft's weights loaded
    free = f * target.gpu.memory_bytes - target.weight_bytes_per_gpu \
        - sum(d.weight_bytes_per_gpu for d in drafts)
    if free <= 0:
        raise ValueError(f"{where}: target {target.llm.key} and draft(s) "
                         f"{[d.llm.key for d in drafts]} weights exceed "
                         f"gpu_memory_fraction={f} of {target.gpu.key} at tp={target.tp}")
    # (2) KV bytes per token per GPU: the target's plus every draft's (lockstep)
    kv = target.kv_bytes_per_token_per_gpu + sum(d.kv_bytes_per_token_per_gpu for d in drafts)
    # (3) blocks of b tokens, each holding target and draft KV of its positions
    total_blocks = int(int(free // kv) // block_tokens)
    kv_scale = kv / target.kv_bytes_per_token_per_gpu
    block_bytes = float(target.kv_bytes_per_token) * kv_scale * block_tokens
    return total_blocks, int(host_memory_gb * 1e9 // block_bytes), float(kv_scale)


class SpecRunner:
    """Speculative decoding of one run: draft cost models, acceptance rates, counters.

    ``rates`` has shape ``(n_requests, n_drafts)``; ``draft_computed`` (int64
    ``(n_requests,)``, in the state) counts the tokens of each request's context that the
    draft has in its KV. ``seeds`` spawns each replica's generator of acceptance draws.
    The KV sizing with the drafts loaded is :func:`speculation_memory`.
    """

    def __init__(self, decider: Any, target: Any, state: Any, seeds: np.random.SeedSequence,
                 policy_name: str) -> None:
        """``decider``: the policy's speculation decider (its draft models and arms);
        ``target``: the target model's analytic cost model; ``state``: the run's
        :class:`~lpserve.sim.state.State` (its ``draft_computed``); ``seeds``: spawns each
        replica's acceptance draws. Raises ValueError (naming ``policy_name``) for a cost
        model without weights and KV bytes, or a draft the GPU cannot hold."""
        from lpserve.cost import cost_model

        where = f"policy {policy_name!r}: EngineConfig.speculation"
        self.who = f"policy {policy_name!r} (speculation {decider.name!r})"
        self.decider = decider
        if not hasattr(target, "weight_bytes_per_gpu") or not hasattr(target, "gpu"):
            raise ValueError(f"{where} needs an analytic cost model (weights and KV bytes "
                             f"per GPU); the instance's cost model is {type(target).__name__}")
        drafts = []
        for d in decider.drafts:
            try:
                drafts.append(cost_model(gpu=target.gpu, llm=d, tp=target.tp))
            except ValueError as exc:
                raise ValueError(f"{where}: draft {d!r} does not fit: {exc}") from None
        self.drafts = drafts
        self.target_params = np.ascontiguousarray(target.params, dtype=np.float64)
        self.draft_params = [np.ascontiguousarray(d.params, dtype=np.float64) for d in drafts]
        try:
            self.rates = decider.rates_for(state.tenant)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        self.seeds = seeds
        self.state = state
        # (4) a decider that may speculate has the draft prefill with the target
        self.eager = decider.max_k >= 1
        self.counts = {"steps": 0, "speculative_steps": 0, "draft_tokens": 0,
                       "accepted_tokens": 0, "emitted_tokens": 0, "sequence_steps": 0}

    def replica_rng(self) -> np.random.Generator:
        """The acceptance draws of the next replica built: a generator of its own spawned
        from the run's seeds (in the order the replicas are built)."""
        return np.random.default_rng(self.seeds.spawn(1)[0])

    def summary(self) -> dict[str, Any]:
        """Counters of the run: steps, speculative steps, drafted/accepted/emitted tokens,
        ``accepted_fraction`` (accepted / drafted) and ``tokens_per_sequence_step``."""
        c = dict(self.counts)
        c["accepted_fraction"] = (c["accepted_tokens"] / c["draft_tokens"]
                                  if c["draft_tokens"] else float("nan"))
        c["tokens_per_sequence_step"] = (c["emitted_tokens"] / c["sequence_steps"]
                                          if c["sequence_steps"] else float("nan"))
        return c

    # ------------------------------------------------------------------ step time
    def step_timer(self, c: np.ndarray, lag: np.ndarray):
        """``arm -> seconds`` of one step for contexts ``c`` and draft lags ``lag``."""
        P = self.target_params
        memo: dict[tuple[int, int], float] = {}

        def draft_iter_s(d: int, i: int) -> float:
            """Seconds of draft ``d``'s ``i``-th iteration (the first one catching up)."""
            key = (d, i)
            t = memo.get(key)
            if t is None:
                D = self.draft_params[d]
                if i == 0 and lag.any():  # (5) catch-up: lag + 1 tokens on the draft's KV
                    late = lag > 0
                    t = float(iteration_time(D, lag[late] + 1, c[late] - lag[late], c[~late]))
                else:
                    t = float(iteration_time(D, _EMPTY, _EMPTY, c + i))
                memo[key] = t
            return t

        def timer(arm: Any) -> float:
            """Seconds of one step of ``arm``: its ``k`` draft iterations, then the
            target's verification of ``k + 1`` tokens per request (``k = 0``: one decode)."""
            if arm.k == 0:  # plain decoding, the iteration the fast path would run
                return float(iteration_time(P, _EMPTY, _EMPTY, c))
            t = 0.0
            for i in range(arm.k):
                t += draft_iter_s(arm.draft, i)
            # (6) verification: a chunk of k + 1 tokens on top of each context
            return t + float(iteration_time(P, np.full(c.size, arm.k + 1, np.int64), c,
                                            _EMPTY))

        return timer


def batch_class(tenant: np.ndarray) -> int:
    """The request class of a batch: its most common tenant (ties: the smallest id)."""
    vals, counts = np.unique(np.asarray(tenant, np.int64), return_counts=True)
    return int(vals[int(np.argmax(counts))])


def step_context(run: SpecRunner, replica: tuple[str, int], tenant: np.ndarray,
                 idx: np.ndarray, c: np.ndarray, lag: np.ndarray) -> StepContext:
    """What the decider of ``run`` sees before a speculative step of replica ``replica``:
    the decode batch ``idx`` (int64 request ids) at contexts ``c`` with draft lags ``lag``
    (int64, same shape); ``tenant`` is every request's tenant (the state's column)."""
    dec = run.decider
    ten = tenant[idx]
    return StepContext((batch_class(ten), batch_bucket(idx.size, dec.bucket_edges)),
                       idx.size, dec.arms, run.step_timer(c, lag),
                       run.rates[idx] if dec.meta.clairvoyant else None, ten,
                       replica=replica)
