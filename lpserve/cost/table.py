"""Cost models that are not the analytic roofline: measured tables and unit rounds."""
from __future__ import annotations

import csv
from importlib import resources
from typing import Any, Sequence

import numpy as np

from lpserve.cost import _kernels as K
from lpserve.cost.base import ArrayLike, CostModel, check_batch, check_ratio

Table = tuple[Sequence[float], Sequence[float]]


def _clean_table(table: Table | None, field: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, de-duplicated (median per x), non-decreasing (running max) table."""
    if table is None:
        return np.zeros(0), np.zeros(0)
    x = np.asarray(table[0], dtype=float)
    y = np.asarray(table[1], dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"{field}: x and y must be 1-D of one length, got {x.shape} and {y.shape}")
    if x.size == 0:
        return x, y
    if not (np.isfinite(x).all() and np.isfinite(y).all()) or (x <= 0).any() or (y < 0).any():
        raise ValueError(f"{field}: x must be finite and > 0, y finite and >= 0")
    ux = np.unique(x)
    uy = np.array([np.median(y[x == v]) for v in ux])
    return ux, np.maximum.accumulate(uy)


class TableCost(CostModel):
    """Per-iteration time interpolated from a measured profile (as Vidur does).

    Three per-layer tables, each ``(x, seconds)``, piecewise-linear in ``x``
    (models/cost-model.md (10)):

    - ``linear``: x = tokens in the batch (prefill tokens + decode requests);
    - ``prefill_attention``: x = sum over chunks of ``c * (p + c)`` (chunk c, prefix p);
    - ``decode_attention``: x = sum of decode context lengths.

    Iteration time = ``layers`` x (sum of the three lookups) + ``iter_overhead_s`` +
    ``seq_overhead_s`` x sequences. Tables are sorted, repeated x take their median, and y
    is made non-decreasing by a running maximum. Below the first point a table returns its
    first value (0 at x = 0); past the last it extends its last segment. A missing table
    contributes 0. KV sizes, swaps and transfers come from the analytic model of
    ``gpu`` x ``llm`` at ``tp``.
    """

    kind = K.KIND_TABLE

    def __init__(self, *, linear: Table | None = None, prefill_attention: Table | None = None,
                 decode_attention: Table | None = None, layers: int = 1,
                 iter_overhead_s: float = 0.0, seq_overhead_s: float = 0.0,
                 gpu: str = "a100-80gb", llm: str = "llama-2-7b", tp: int = 1) -> None:
        from lpserve.cost.analytic import AnalyticCost

        if isinstance(layers, bool) or not isinstance(layers, (int, np.integer)) or layers < 1:
            raise ValueError(f"layers must be a positive integer, got {layers!r}")
        for name, v in (("iter_overhead_s", iter_overhead_s), ("seq_overhead_s", seq_overhead_s)):
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        self.tables = {
            "linear": _clean_table(linear, "linear"),
            "prefill_attention": _clean_table(prefill_attention, "prefill_attention"),
            "decode_attention": _clean_table(decode_attention, "decode_attention"),
        }
        if all(t[0].size == 0 for t in self.tables.values()) and iter_overhead_s == 0:
            raise ValueError("TableCost needs at least one non-empty table or an overhead")
        self.layers = int(layers)
        self.iter_overhead_s = float(iter_overhead_s)
        self.seq_overhead_s = float(seq_overhead_s)
        self.sizes = AnalyticCost(gpu=gpu, llm=llm, tp=tp)
        head = [K.KIND_TABLE, self.layers, self.iter_overhead_s, self.seq_overhead_s]
        head += [t[0].size for t in self.tables.values()]
        body = [np.concatenate([x, y]) for x, y in self.tables.values()]
        self.params = np.concatenate([np.asarray(head, dtype=float), *body])

    @classmethod
    def vidur_a100_llama2_7b(cls, tp: int = 1) -> "TableCost":
        """The Vidur A100 Llama-2-7B operator profile shipped in ``lpserve/data/calibration``.

        Linear ops at the given tp; attention measured at tp=1 and divided by tp (heads are
        split evenly). Iteration overhead is not in the profile (0).
        """
        if tp not in (1, 2, 4, 8):
            raise ValueError(f"tp must be one of (1, 2, 4, 8), got {tp!r}")
        base = resources.files("lpserve") / "data" / "calibration"

        def rows(name: str) -> list[dict[str, str]]:
            return list(csv.DictReader((base / name).read_text().splitlines()))

        lin = [r for r in rows("vidur_a100_llama2_7b_linear_ops_summary.csv") if int(r["tp"]) == tp]
        pre = rows("vidur_a100_llama2_7b_prefill_attention_tp1.csv")
        dec = rows("vidur_a100_llama2_7b_decode_attention_tp1.csv")
        return cls(
            linear=([float(r["tokens"]) for r in lin],
                    [float(r["linear_ms_per_layer"]) * 1e-3 for r in lin]),
            prefill_attention=(
                [float(r["prefill_chunk_size"]) * (float(r["kv_cache_size"])
                                                   + float(r["prefill_chunk_size"])) for r in pre],
                [float(r["attn_prefill_median_ms"]) * 1e-3 / tp for r in pre]),
            decode_attention=(
                [float(r["batch_size"]) * float(r["kv_cache_size"]) for r in dec],
                [float(r["attn_decode_median_ms"]) * 1e-3 / tp for r in dec]),
            layers=32, gpu="a100-80gb", llm="llama-2-7b", tp=tp,
        )

    def breakdown(self, prefill_tokens: ArrayLike = (), prefill_cached: ArrayLike | None = None,
                  decode_context: ArrayLike = ()) -> dict[str, Any]:
        """``time_s`` with ``linear_s``, ``attention_s``, ``communication_s`` (0: folded into
        the measured tables) and ``overhead_s``; bounds are ``"measured"``."""
        pt, pc, dc = check_batch(prefill_tokens, prefill_cached, decode_context)
        t = K.iteration_time_ref(self.params, pt, pc, dc)
        live = pt > 0
        n_tokens = float(pt.sum() + dc.size)
        work = float((pt[live].astype(float) * (pc[live] + pt[live])).sum())
        lookup = {k: K.interp_ref(list(x), list(y), v) for (k, (x, y)), v in
                  zip(self.tables.items(), (n_tokens, work, float(dc.sum())))}
        empty = n_tokens == 0
        return {
            "time_s": t,
            "linear_s": 0.0 if empty else self.layers * lookup["linear"],
            "attention_s": 0.0 if empty else self.layers * (lookup["prefill_attention"]
                                                            + lookup["decode_attention"]),
            "communication_s": 0.0,
            "overhead_s": 0.0 if empty else (self.iter_overhead_s + self.seq_overhead_s
                                             * float(live.sum() + dc.size)),
            "linear_bound": "measured", "attention_bound": "measured",
            "communication_bound": "none",
        }

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes of one token over the replica, from the analytic model of the
        same GPU, LLM and tensor-parallel degree (the tables measure time only)."""
        return self.sizes.kv_bytes_per_token

    def kv_capacity_tokens(self, gpu_memory_fraction: float = 0.9) -> int:
        """KV tokens that fit at ``gpu_memory_fraction``, from the analytic model's
        memory accounting."""
        return self.sizes.kv_capacity_tokens(gpu_memory_fraction)

    def swap_time_s(self, n_blocks: int, block_tokens: int = 16) -> float:
        """Seconds to move ``n_blocks`` blocks of ``block_tokens`` tokens between GPU and
        host (one way), priced by the analytic model's PCIe link per GPU."""
        return self.sizes.swap_time_s(n_blocks, block_tokens)

    def swap_times_s(self, n_blocks: np.ndarray, block_tokens: int = 16) -> np.ndarray:
        """:meth:`swap_time_s` for an int64 ``(K,)`` array of counts (the analytic model's)."""
        return self.sizes.swap_times_s(n_blocks, block_tokens)

    def kv_quantize_times_s(self, n_blocks: np.ndarray, block_tokens: int = 16,
                            compression_ratio: float = 4.0) -> np.ndarray:
        """:meth:`kv_quantize_time_s` for an int64 ``(K,)`` array of counts."""
        return self.sizes.kv_quantize_times_s(n_blocks, block_tokens, compression_ratio)

    def kv_quantize_time_s(self, n_blocks: int, block_tokens: int = 16,
                           compression_ratio: float = 4.0) -> float:
        """Seconds to quantize ``n_blocks`` KV blocks by ``compression_ratio``, priced by
        the analytic model's memory bandwidth."""
        return self.sizes.kv_quantize_time_s(n_blocks, block_tokens, compression_ratio)

    def transfer_time_s(self, n_tokens: int, link_gbps: float | None = None) -> float:
        """Seconds to send the KV of ``n_tokens`` tokens to another replica over a link of
        ``link_gbps`` GB/s (the analytic model's default link when None)."""
        return self.sizes.transfer_time_s(n_tokens, link_gbps)

    def __repr__(self) -> str:
        n = {k: v[0].size for k, v in self.tables.items()}
        return f"TableCost(layers={self.layers}, points={n})"


class UnitRoundCost(CostModel):
    """The abstract GPU of the scheduling-theory papers.

    Every non-empty iteration takes one time unit (``batch_time_s`` returns 1.0), memory
    holds ``memory_tokens`` tokens and a request holds prompt + generated tokens, so one
    KV "byte" is one token. Swaps and transfers are free (0.0): the abstract model has no
    memory hierarchy. ``gpu_memory_fraction`` does not change the capacity.
    """

    kind = K.KIND_UNIT_ROUND

    def __init__(self, memory_tokens: int) -> None:
        if isinstance(memory_tokens, bool) or not isinstance(memory_tokens, (int, np.integer)) \
                or memory_tokens < 1:
            raise ValueError(f"memory_tokens must be a positive integer, got {memory_tokens!r}")
        self.memory_tokens = int(memory_tokens)
        self.params = np.array([float(K.KIND_UNIT_ROUND), float(self.memory_tokens)])

    def breakdown(self, prefill_tokens: ArrayLike = (), prefill_cached: ArrayLike | None = None,
                  decode_context: ArrayLike = ()) -> dict[str, Any]:
        """``time_s`` (1.0, or 0.0 when empty), all of it ``overhead_s``."""
        t = self.batch_time_s(prefill_tokens, prefill_cached, decode_context)
        return {"time_s": t, "linear_s": 0.0, "attention_s": 0.0, "communication_s": 0.0,
                "overhead_s": t, "linear_bound": "unit", "attention_bound": "unit",
                "communication_bound": "none"}

    @property
    def kv_bytes_per_token(self) -> float:
        """1.0: one KV "byte" is one token in the abstract model."""
        return 1.0

    def kv_capacity_tokens(self, gpu_memory_fraction: float = 0.9) -> int:
        """``memory_tokens``, whatever the fraction (which is still checked to lie in
        ``(0, 1]``)."""
        self._check_fraction(gpu_memory_fraction)
        return self.memory_tokens

    def swap_time_s(self, n_blocks: int, block_tokens: int = 16) -> float:
        """0.0 seconds: the abstract model has no memory hierarchy (counts are still
        checked)."""
        self._check_count(n_blocks, "n_blocks")
        self._check_count(block_tokens, "block_tokens")
        return 0.0

    def swap_times_s(self, n_blocks: np.ndarray, block_tokens: int = 16) -> np.ndarray:
        """Zeros, float64 ``(K,)`` (the counts are still checked)."""
        n = self._check_counts(n_blocks, "n_blocks")
        self._check_count(block_tokens, "block_tokens")
        return np.zeros(n.size, np.float64)

    def kv_quantize_times_s(self, n_blocks: np.ndarray, block_tokens: int = 16,
                            compression_ratio: float = 4.0) -> np.ndarray:
        """Zeros, float64 ``(K,)`` (the counts and ratio are still checked)."""
        n = self._check_counts(n_blocks, "n_blocks")
        self._check_count(block_tokens, "block_tokens")
        check_ratio(compression_ratio)
        return np.zeros(n.size, np.float64)

    def kv_quantize_time_s(self, n_blocks: int, block_tokens: int = 16,
                           compression_ratio: float = 4.0) -> float:
        """0.0: the abstract model prices no memory traffic (as its swaps)."""
        self._check_count(n_blocks, "n_blocks")
        self._check_count(block_tokens, "block_tokens")
        check_ratio(compression_ratio)
        return 0.0

    def transfer_time_s(self, n_tokens: int, link_gbps: float | None = None) -> float:
        """0.0 seconds: transfers are free in the abstract model (``n_tokens`` is still
        checked)."""
        self._check_count(n_tokens, "n_tokens")
        return 0.0

    def __repr__(self) -> str:
        return f"UnitRoundCost(memory_tokens={self.memory_tokens})"
