"""What the routing models need from each replica's cost model (``models/routing-lp.md``).

:func:`replica_profile` tabulates one cost model for routing (prefill times on a grid,
single-request decode prefix sums, reference throughputs, KV capacity, and the quadratic
fit of prefill time used by the locality-aware router); :func:`replica_costs` gives one
cost model per replica of an instance (heterogeneous clusters included).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True, eq=False)
class ReplicaProfile:
    """What the routing models need from one replica's cost model.

    Attributes:
        prefill_grid_tokens, prefill_grid_s: prefill time (s) of one prompt of each grid
            length, for interpolation (shape (g,)).
        decode_prefix_s: prefix sums of single-request decode iteration time over context
            c = 0..c_max, shape (c_max + 2,).
        tpot_s: decode iteration time at the reference batch (s).
        prefill_tokens_per_s: mu^P, prefill throughput at the reference chunk.
        decode_tokens_per_s: mu^D, decode throughput at the reference batch.
        kv_tokens: K, KV capacity (tokens).
        decode_fit: ``(d0, d1, d2)`` of the decode iteration time ``d0 + d1 k + d2 k c``
            (s) of a batch of ``k`` decodes at context ``c`` (least squares in relative
            error over ``k`` up to 128 and ``c`` up to the tabulated maximum), or None.
    """

    prefill_grid_tokens: np.ndarray
    prefill_grid_s: np.ndarray
    decode_prefix_s: np.ndarray
    tpot_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    kv_tokens: float
    decode_fit: np.ndarray | None = None

    def prefill_s(self, tokens: np.ndarray) -> np.ndarray:
        """Prefill time (s) of prompts of ``tokens`` tokens from an empty cache, (n,)."""
        return np.interp(tokens, self.prefill_grid_tokens, self.prefill_grid_s)

    def prefill_cached_s(self, tokens: np.ndarray, cached: np.ndarray) -> np.ndarray:
        """Prefill time (s) of prompts of ``tokens`` tokens whose first ``cached`` tokens
        are in the prefix cache: ``T(s) - T(h) + T(1)`` (``models/routing-lp.md`` (1a));
        ``T(s)`` when ``cached`` is 0, (n,)."""
        g, t = self.prefill_grid_tokens, self.prefill_grid_s
        h = np.minimum(cached, tokens)
        return np.interp(tokens, g, t) - np.interp(np.maximum(h, 1), g, t) + t[0]

    def prefill_quadratic(self) -> np.ndarray:
        """Least-squares ``(t0, t1, t2)`` of prefill time ``t0 + t1 x + t2 x^2`` (s) over
        the grid, weighted by ``1 / T(x)`` (relative error); shape (3,)."""
        x, t = self.prefill_grid_tokens, self.prefill_grid_s
        A = np.stack([np.ones_like(x), x, x * x], axis=1) / t[:, None]
        coef, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        return coef

    def expected_decode_s(self, prompt: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """E[sum_{c=s}^{s+o-2} t(c)] for o uniform on lo..hi (alone on the replica), (n,)."""
        T1 = self.decode_prefix_s
        S1 = np.concatenate([[0.0], np.cumsum(T1)])          # S1[m] = sum_{q<m} T1[q]
        cmax = T1.size - 1
        top = np.minimum(prompt + hi, cmax)                   # T1 index s + o - 1, o = hi
        bot = np.minimum(prompt + lo - 1, cmax)               # o = lo
        mean_T1 = (S1[top] - S1[bot]) / np.maximum(hi - lo + 1, 1)
        return mean_T1 - T1[np.minimum(prompt, cmax)]


def replica_profile(cost: Any, *, c_max: int, gpu_memory_fraction: float = 0.9,
                    ref_batch: int = 64, ref_context: int = 1024,
                    ref_chunk_tokens: int = 2048) -> ReplicaProfile:
    """Tabulate ``cost`` for routing: prefill on a log grid up to ``c_max``, single-request
    decode prefix sums up to ``c_max`` (on a grid of at most 4096 points), throughputs at
    a reference batch of ``ref_batch`` decodes of ``ref_context`` tokens and a prefill
    chunk of ``ref_chunk_tokens``."""
    c_max = max(int(c_max), 2)
    grid = np.unique(np.concatenate([np.geomspace(1, c_max + 1, 96).astype(np.int64),
                                     [1, c_max + 1]]))
    pre = cost.prefill_alone_s(grid)
    step = max(1, -(-(c_max + 2) // 4096))
    pts = np.arange(0, c_max + 2, step)
    t_pts = cost.decode_alone_s(pts)
    t = np.interp(np.arange(c_max + 1), pts, t_pts)
    T1 = np.concatenate([[0.0], np.cumsum(t)])
    tpot = float(cost.batch_time_s(decode_context=[ref_context] * ref_batch))
    t_chunk = float(cost.batch_time_s(prefill_tokens=[ref_chunk_tokens]))
    kc = [(k, c) for k in (1, 4, 16, 64, 128)
          for c in np.unique(np.geomspace(128, max(c_max, 256), 6).astype(np.int64)).tolist()]
    td = cost.batch_times_s([{"decode_context": [c] * k} for k, c in kc])
    A = np.array([[1.0, k, k * c] for k, c in kc]) / td[:, None]
    dfit, *_ = np.linalg.lstsq(A, np.ones(len(kc)), rcond=None)
    return ReplicaProfile(grid.astype(np.float64), pre, T1, tpot, ref_chunk_tokens / t_chunk,
                          ref_batch / tpot, float(cost.kv_capacity_tokens(gpu_memory_fraction)),
                          dfit)


def replica_costs(instance: Any, replica_costs: Sequence[Any] | None = None) -> list[Any]:
    """One cost model per replica: ``replica_costs`` when given, else the instance's own
    (``Instance.replica_cost_models``: each replica's GPU type and TP)."""
    if replica_costs is None:
        return instance.replica_cost_models()
    costs = list(replica_costs)
    if not costs:
        raise ValueError("replica_costs must hold at least one cost model, got []")
    return costs


def output_interval(trace: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    """(lo, hi, clairvoyant): the predicted interval, or the true length when absent."""
    lo, hi = getattr(trace, "predicted_lo", None), getattr(trace, "predicted_hi", None)
    if lo is not None and hi is not None:
        lo = np.maximum(np.asarray(lo, np.int64), 1)
        return lo, np.maximum(np.asarray(hi, np.int64), lo), False
    o = np.asarray(trace.output_tokens, np.int64)
    return o, o, True
