"""The interface every cost model shares (:class:`CostModel`) and input checking."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

ArrayLike = Sequence[int] | np.ndarray


def as_tokens(values: Any, field: str) -> np.ndarray:
    """``values`` as an int64 1-D array of non-negative integers, or a clear error."""
    arr = np.asarray(values if values is not None else [])
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{field} must be a 1-D array of token counts, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{field} must hold integers, got dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.integer):
        bad = arr[~np.isfinite(arr) | (arr != np.round(arr))] if arr.size else arr
        if bad.size:
            raise ValueError(f"{field} must hold integers, got {bad[0]!r}")
    if (arr < 0).any():
        raise ValueError(f"{field} must be >= 0, got {arr[arr < 0][0]!r}")
    return arr.astype(np.int64)


def check_batch(prefill_tokens: Any, prefill_cached: Any,
                decode_context: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated int64 arrays of a batch; ``prefill_cached`` defaults to zeros."""
    pt = as_tokens(prefill_tokens, "prefill_tokens")
    pc = (np.zeros_like(pt) if prefill_cached is None
          else as_tokens(prefill_cached, "prefill_cached"))
    if pc.shape != pt.shape:
        raise ValueError(f"prefill_cached has {pc.size} entries but prefill_tokens has {pt.size}")
    dc = as_tokens(decode_context, "decode_context")
    return pt, pc, dc


def check_ratio(compression_ratio: Any, field: str = "compression_ratio") -> float:
    """``compression_ratio`` as a float, finite and > 1 (full KV bytes / compressed bytes)."""
    try:
        r = float(compression_ratio)
    except (TypeError, ValueError):
        raise ValueError(f"{field} must be a number > 1, got {compression_ratio!r}") from None
    if isinstance(compression_ratio, bool) or not np.isfinite(r) or r <= 1.0:
        raise ValueError(f"{field} must be a finite number > 1, got {compression_ratio!r}")
    return r


class CostModel(ABC):
    """Per-iteration time of a batch on one replica, and KV-cache sizes and transfers.

    A batch is given as arrays: prefill chunks (``prefill_tokens[i]`` tokens in this
    iteration, ``prefill_cached[i]`` tokens already in KV before it) and decode requests
    (``decode_context[j]`` tokens of context). An empty batch takes 0 s.

    Attributes:
        params: flat float64 array the numba kernels read
            (``lpserve.cost._kernels.iteration_time(params, ...)``).
        kind: int kind code stored in ``params[0]`` (0 analytic, 1 table, 2 unit-round).
        frontend_latency_s: seconds the serving front end adds to every request's TTFT
            and E2E and to the release of its dependants (HTTP, tokenization and
            streaming around the engine; ``models/simulator.md`` (33)); 0 unless a
            calibration fitted to serving measurements sets it.
    """

    params: np.ndarray
    kind: int
    frontend_latency_s: float = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that prices one swap (or one quantization) its own way, without its
        own array method, gets the default array method, which asks its scalar method
        once per count: a parent's vectorized table never stands in for a child's price."""
        super().__init_subclass__(**kwargs)
        for scalar in ("swap_time_s", "kv_quantize_time_s"):
            vector = scalar.replace("_time_s", "_times_s")
            if scalar in cls.__dict__ and vector not in cls.__dict__:
                setattr(cls, vector, CostModel.__dict__[vector])

    def batch_time_s(self, prefill_tokens: ArrayLike = (), prefill_cached: ArrayLike | None = None,
                     decode_context: ArrayLike = ()) -> float:
        """Seconds of one iteration of the batch (0.0 for an empty batch)."""
        from lpserve.cost import _kernels

        pt, pc, dc = check_batch(prefill_tokens, prefill_cached, decode_context)
        return float(_kernels.iteration_time(self.params, pt, pc, dc))

    def batch_times_s(self, batches: Sequence[dict[str, ArrayLike]]) -> np.ndarray:
        """Times (s) of many batches, each a dict of the :meth:`batch_time_s` arguments.

        Evaluated in one call of the vectorized kernel; shape ``(len(batches),)``.
        """
        from lpserve.cost import _kernels

        pts, pcs, dcs = [], [], []
        for b in batches:
            pt, pc, dc = check_batch(b.get("prefill_tokens", ()), b.get("prefill_cached"),
                                     b.get("decode_context", ()))
            pts.append(pt)
            pcs.append(pc)
            dcs.append(dc)
        po = np.concatenate([[0], np.cumsum([a.size for a in pts])]).astype(np.int64)
        do = np.concatenate([[0], np.cumsum([a.size for a in dcs])]).astype(np.int64)
        out = np.zeros(len(batches))
        cat = (lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64))
        _kernels.batch_times(self.params, cat(pts), cat(pcs), po, cat(dcs), do, out)
        return out

    def prefill_alone_s(self, tokens: ArrayLike, cached: ArrayLike | None = None) -> np.ndarray:
        """Times (s) of one-chunk batches: chunk ``k`` of ``tokens[k]`` new tokens after
        ``cached[k]`` (default 0) cached ones, alone; one kernel call, shape ``(n,)``."""
        from lpserve.cost import _kernels

        pt = as_tokens(tokens, "tokens")
        pc = np.zeros_like(pt) if cached is None else as_tokens(cached, "cached")
        if pc.shape != pt.shape:
            raise ValueError(f"cached must have the shape of tokens {pt.shape}, got {pc.shape}")
        off = np.arange(pt.size + 1, dtype=np.int64)
        out = np.zeros(pt.size)
        _kernels.batch_times(self.params, pt, pc, off, np.zeros(0, np.int64),
                             np.zeros(pt.size + 1, np.int64), out)
        return out

    def decode_alone_s(self, decode_context: ArrayLike) -> np.ndarray:
        """Times (s) of one-decode batches at each context (tokens), shape ``(n,)``."""
        from lpserve.cost import _kernels

        dc = as_tokens(decode_context, "decode_context")
        out = np.zeros(dc.size)
        _kernels.batch_times(self.params, np.zeros(0, np.int64), np.zeros(0, np.int64),
                             np.zeros(dc.size + 1, np.int64), dc,
                             np.arange(dc.size + 1, dtype=np.int64), out)
        return out

    def decode_run_s(self, decode_context: ArrayLike, n_iters: int) -> float:
        """Total seconds of ``n_iters`` decode iterations, each context growing by 1."""
        from lpserve.cost import _kernels

        dc = as_tokens(decode_context, "decode_context")
        if not isinstance(n_iters, (int, np.integer)) or n_iters < 0:
            raise ValueError(f"n_iters must be a non-negative integer, got {n_iters!r}")
        return float(_kernels.decode_run(self.params, dc, int(n_iters)))

    @abstractmethod
    def breakdown(self, prefill_tokens: ArrayLike = (), prefill_cached: ArrayLike | None = None,
                  decode_context: ArrayLike = ()) -> dict[str, Any]:
        """``time_s`` and its parts (seconds): ``linear_s``, ``attention_s``,
        ``communication_s``, ``overhead_s``, with what bounds each part."""

    @property
    @abstractmethod
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes of one token over the whole replica."""

    @abstractmethod
    def kv_capacity_tokens(self, gpu_memory_fraction: float = 0.9) -> int:
        """Tokens of KV cache that fit in the replica at this memory fraction."""

    def kv_capacity_blocks(self, block_tokens: int = 16, gpu_memory_fraction: float = 0.9) -> int:
        """Whole paged-KV blocks of ``block_tokens`` tokens that fit."""
        if not isinstance(block_tokens, (int, np.integer)) or block_tokens < 1:
            raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
        return int(self.kv_capacity_tokens(gpu_memory_fraction) // int(block_tokens))

    @abstractmethod
    def swap_time_s(self, n_blocks: int, block_tokens: int = 16) -> float:
        """Seconds to move ``n_blocks`` KV blocks between GPU and host memory (one way)."""

    def swap_times_s(self, n_blocks: np.ndarray, block_tokens: int = 16) -> np.ndarray:
        """:meth:`swap_time_s` of every count in ``n_blocks`` (int64 ``(K,)``), float64
        ``(K,)``: the simulator's price table. The built-in models compute it in one numpy
        expression with the scalar's floating-point operations in the same order, so the
        two give the same floats; this default asks the scalar method once per count."""
        return np.array([float(self.swap_time_s(int(k), block_tokens)) for k in n_blocks],
                        np.float64)

    def kv_quantize_times_s(self, n_blocks: np.ndarray, block_tokens: int = 16,
                            compression_ratio: float = 4.0) -> np.ndarray:
        """:meth:`kv_quantize_time_s` of every count in ``n_blocks`` (int64 ``(K,)``),
        float64 ``(K,)``; as :meth:`swap_times_s`, the same floats as the scalar."""
        return np.array([float(self.kv_quantize_time_s(int(k), block_tokens,
                                                       compression_ratio))
                         for k in n_blocks], np.float64)

    @classmethod
    def _check_counts(cls, values: Any, field: str) -> np.ndarray:
        a = np.asarray(values)
        if a.ndim != 1 or not (a.dtype.kind in "iu" and (a.size == 0 or a.min() >= 0)):
            raise ValueError(f"{field} must be a 1-d array of non-negative integers, got "
                             f"{a.dtype} of shape {a.shape}")
        return a.astype(np.int64)

    def kv_quantize_time_s(self, n_blocks: int, block_tokens: int = 16,
                           compression_ratio: float = 4.0) -> float:
        """Seconds to quantize (or dequantize) ``n_blocks`` KV blocks on the GPU by
        ``compression_ratio`` (models/kv-compression-swap.md (3)). Cost models without a
        memory bandwidth cannot price it and raise a ValueError naming themselves."""
        raise ValueError(f"cost model {type(self).__name__} has no KV quantize time; "
                         "preemption='compress-swap' needs one (AnalyticCost, TableCost "
                         "and UnitRoundCost give it)")

    @abstractmethod
    def transfer_time_s(self, n_tokens: int, link_gbps: float | None = None) -> float:
        """Seconds to send the KV of ``n_tokens`` tokens to another replica."""

    @staticmethod
    def _check_fraction(gpu_memory_fraction: float) -> float:
        f = float(gpu_memory_fraction)
        if not 0.0 < f <= 1.0:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {gpu_memory_fraction!r}")
        return f

    @staticmethod
    def _check_count(value: Any, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{field} must be a non-negative integer, got {value!r}")
        return int(value)
