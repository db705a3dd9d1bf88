"""Per-victim preemption: recompute, swap, or compress-and-swap (models/kv-compression-swap.md).

When a replica preempts a running request (the victim) it either drops its KV and
recomputes it later (``"recompute"``), copies it to host memory over PCIe (``"swap"``),
or first quantizes it on the GPU by ``compression_ratio`` (e.g. FP16 -> INT4: 4) and
copies the smaller KV (``"compress-swap"``), dequantizing it on swap-in. This module holds
the timing and size equations, shared by the simulator and the deciders, and the
contract of a :class:`PreemptionDecider`: a role called once per victim with a
:class:`PreemptionView` that returns one of :data:`PREEMPTION_CHOICES`.

Compression does not change timing beyond the equations below; its accuracy cost
(``EngineConfig.compression_accuracy_cost`` per context token swapped compressed) is only
counted and reported (``Result.stats["compression_quality_loss"]``).
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

PREEMPTION_CHOICES = ("recompute", "swap", "compress-swap")


def compressed_host_blocks(held_blocks: int, compression_ratio: float) -> int:
    """models/kv-compression-swap.md (2): host blocks of a victim's compressed KV,
    ``ceil(held_blocks / ratio)`` (rounded up per request)."""
    return int(math.ceil(int(held_blocks) / float(compression_ratio) - 1e-12))


def swap_one_way_s(cost: Any, held_blocks: int, block_tokens: int, mode: str,
                   compression_ratio: float) -> float:
    """Seconds to move a victim's ``held_blocks`` KV blocks one way (out or in).

    ``"swap"``: models/kv-compression-swap.md (1), the cost model's PCIe time of the full
    blocks. ``"compress-swap"``: (4), the PCIe time of ``1/ratio`` of the bytes (exact,
    not rounded to blocks) plus the GPU (de)quantize pass (3).
    """
    full = float(cost.swap_time_s(int(held_blocks), int(block_tokens)))
    if mode == "swap":
        return full
    if mode == "compress-swap":
        return full / float(compression_ratio) + float(cost.kv_quantize_time_s(
            int(held_blocks), int(block_tokens), float(compression_ratio)))
    raise ValueError(f"mode must be 'swap' or 'compress-swap', got {mode!r}")


def tipping_bandwidth_gbps(bandwidth_gbps: Any, mean_latency_s: Any,
                           recompute_mean_s: float) -> float:
    """The bandwidth where a swap mode's measured mean latency crosses recompute's.

    ``bandwidth_gbps`` (descending) and ``mean_latency_s`` are a sweep of the same length;
    the crossing is interpolated log-linearly in bandwidth between the two sweep points
    around it. ``inf`` if the mode is never better than recompute, 0 if never worse.
    """
    bw = [float(b) for b in bandwidth_gbps]
    mean = [float(m) for m in mean_latency_s]
    if len(bw) != len(mean) or not bw:
        raise ValueError(f"tipping_bandwidth_gbps: {len(bw)} bandwidths but {len(mean)} "
                         f"latencies")
    if mean[0] >= recompute_mean_s:
        return math.inf
    for k in range(1, len(bw)):
        if mean[k] >= recompute_mean_s:
            a, b = math.log(bw[k - 1]), math.log(bw[k])
            f = (recompute_mean_s - mean[k - 1]) / (mean[k] - mean[k - 1])
            return math.exp(a + f * (b - a))
    return 0.0


@dataclass(frozen=True)
class PreemptionView:
    """One victim about to be preempted, with the cost model's prices of each choice.

    Attributes:
        now_s: simulated time (s); replica: replica index; request: trace index.
        context_tokens: tokens of KV the victim holds (computed so far).
        held_blocks: GPU KV blocks it holds; block_tokens: tokens per block.
        host_free_blocks: free host blocks (full-size blocks of ``block_tokens`` tokens).
        compression_ratio: full / compressed KV bytes; compression_accuracy_cost: quality
            loss per context token swapped compressed (a stated parameter, unitless).
        recompute_s: (5) seconds to prefill ``context_tokens`` again in an iteration alone.
        swap_s: (1) seconds out plus in at full size; compress_swap_s: (4) out plus in of
            the compressed KV including quantize and dequantize.
        swap_host_blocks: host blocks a full swap needs (``held_blocks``);
            compress_host_blocks: (2) host blocks a compressed swap needs.
    """

    now_s: float
    replica: int
    request: int
    context_tokens: int
    held_blocks: int
    block_tokens: int
    host_free_blocks: int
    compression_ratio: float
    compression_accuracy_cost: float
    recompute_s: float
    swap_s: float
    compress_swap_s: float
    swap_host_blocks: int
    compress_host_blocks: int

    @property
    def quality_loss(self) -> float:
        """Accuracy cost of a compressed swap of this victim (``cost x context_tokens``)."""
        return self.compression_accuracy_cost * self.context_tokens


class PreemptionDecider(abc.ABC):
    """Chooses, per victim, ``"recompute"``, ``"swap"`` or ``"compress-swap"``.

    Set as ``EngineConfig.preemption_decider``; its choice replaces
    ``EngineConfig.preemption`` for that victim. A swap whose host blocks do not fit in
    ``host_free_blocks`` falls back to recompute (the engine never exceeds host memory).
    """

    name: str = "decider"

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Prepare for a new run (deciders here are deterministic and keep no state)."""

    @abc.abstractmethod
    def decide(self, view: PreemptionView) -> str:
        """One of :data:`PREEMPTION_CHOICES` for the victim of ``view``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
