"""Preemption arithmetic: KV bytes and seconds of recompute, swap and compress-and-swap
(``models/kv-compression-swap.md``), shared by the simulator and the preemption deciders.

A victim's KV is dropped and recomputed (``"recompute"``), copied to host memory over
PCIe (``"swap"``), or first quantized on the GPU by ``compression_ratio`` (e.g. FP16 ->
INT4: 4) and the smaller copy moved (``"compress-swap"``), dequantized on swap-in.
Compression changes timing only through these equations; its accuracy cost is counted
and reported by the simulator, not simulated.
"""
from __future__ import annotations

import math
from typing import Any

__all__ = ["compressed_host_blocks", "swap_one_way_s", "tipping_bandwidth_gbps"]


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
