"""Fluid models of a KV-memory-bound replica: the memory a request holds over its life,
the fluid optimum of WAIT with known output lengths, and WAIT's thresholds
(``models/wait-fluid.md``; Ao, Luo, Simchi-Levi, Wang, arXiv 2504.11320).

In the round model (every iteration one time unit, memory ``M`` tokens, a request holds
its prompt plus generated tokens), ``x_j`` type-``j`` requests admitted per iteration in
equilibrium keep ``o_j`` cohorts in flight and ``x_j g_j`` tokens in memory, with
``g_j`` the tokens a request holds summed over its iterations (:func:`kv_token_iterations`).
The fluid optimum maximizes output tokens per iteration under the memory and the arrival
rates (:func:`fluid_optimum`, (1)-(3)); WAIT admits ``n_j = floor(x_j)`` requests of type
``j`` per iteration once that many wait (:func:`wait_thresholds`, (4)). With unknown
lengths the admitted mix is the arrival mix, and the optimum is (6)
(:func:`fluid_unknown_lengths`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["fluid_optimum", "fluid_unknown_lengths", "kv_token_iterations",
           "wait_thresholds"]


def _ceil_sum(n: np.ndarray, bt: int) -> np.ndarray:
    """``sum_{x=1}^{n} ceil(x / bt)`` elementwise (int64; 0 for n <= 0)."""
    n = np.maximum(np.asarray(n, np.int64), 0)
    q, r = n // bt, n % bt
    return bt * q * (q + 1) // 2 + r * (q + 1)


def kv_token_iterations(prompt_tokens: Any, output_tokens: Any, *,
                        chunk_tokens: int | None = None, block_tokens: int = 1,
                        reserve_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(g, L)`` per request (int64, shape ``(n,)``): KV tokens held summed over the
    iterations the request is in the batch, and the number of those iterations, for
    lpserve's engine (``models/stability.md`` (4)-(6); ``models/wait-fluid.md`` (2)).

    A prompt of ``s`` tokens is prefilled in ``ceil(s / chunk)`` chunks (one iteration
    without ``chunk_tokens``), holding the blocks of the tokens computed so far; its first
    output token ends the prefill and each of the other ``o - 1`` decode iterations holds
    the blocks of ``s + j`` tokens. Memory is counted in whole blocks of
    ``block_tokens``; ``reserve_tokens`` (Orca, static batching) holds that many tokens'
    blocks for every iteration instead.
    """
    s = np.asarray(prompt_tokens, np.int64)
    o = np.asarray(output_tokens, np.int64)
    if s.shape != o.shape or np.any(s < 1) or np.any(o < 1):
        raise ValueError("kv_token_iterations: prompt and output tokens must be >= 1 and "
                         "of one shape")
    bt = int(block_tokens)
    k = np.ones_like(s)
    pre = bt * (-(-s // bt))
    if chunk_tokens is not None:
        c = int(chunk_tokens)
        if c < 1:
            raise ValueError(f"kv_token_iterations: chunk_tokens must be >= 1, got {c}")
        k = -(-s // c)
        for i in np.flatnonzero(k > 1).tolist():
            m = np.minimum(np.arange(1, k[i] + 1) * c, s[i])
            pre[i] = int(np.sum(bt * (-(-m // bt))))
    L = k + o - 1
    if reserve_tokens is not None:
        return L * bt * (-(-int(reserve_tokens) // bt)), L
    dec = bt * (_ceil_sum(s + o - 1, bt) - _ceil_sum(s, bt))
    return pre + dec, L


def _types(prompt_tokens: Any, output_tokens: Any, rate: Any) -> tuple[np.ndarray, ...]:
    s = np.asarray(prompt_tokens, np.int64)
    o = np.asarray(output_tokens, np.int64)
    lam = np.asarray(rate, float)
    if not (s.shape == o.shape == lam.shape and s.ndim == 1 and s.size):
        raise ValueError(f"fluid: prompt_tokens, output_tokens and rate must be 1-D of one "
                         f"length, got {s.shape}, {o.shape}, {lam.shape}")
    if np.any(s < 1) or np.any(o < 1):
        raise ValueError("fluid: prompt and output tokens must be >= 1")
    if np.any(~np.isfinite(lam)) or np.any(lam < 0):
        raise ValueError(f"fluid: rates must be finite and >= 0, got {lam.tolist()}")
    return s, o, lam


def fluid_optimum(prompt_tokens: Any, output_tokens: Any, rate: Any, memory_tokens: float,
                  *, iteration_s: float = 1.0, block_tokens: int = 1) -> dict[str, Any]:
    """The fluid optimum of ``models/wait-fluid.md`` (1)-(3) for request types ``j``
    (prompt ``l_j``, output ``o_j`` tokens, arrival rate ``rate_j`` per second).

    Returns ``x`` (type-``j`` admissions per iteration, float64 ``(J,)``), ``g`` (memory
    token-iterations per request), ``tokens_per_iteration`` (the objective),
    ``requests_per_iteration``, ``memory_tokens_used`` and ``status`` of the LP (HiGHS).
    """
    from scipy.optimize import linprog

    s, o, lam = _types(prompt_tokens, output_tokens, rate)
    if not (memory_tokens > 0 and iteration_s > 0):
        raise ValueError(f"fluid_optimum: memory_tokens and iteration_s must be > 0, got "
                         f"{memory_tokens}, {iteration_s}")
    g, _ = kv_token_iterations(s, o, block_tokens=block_tokens)
    res = linprog(-o.astype(float), A_ub=g[None, :].astype(float), b_ub=[float(memory_tokens)],
                  bounds=[(0.0, float(v) * iteration_s) for v in lam], method="highs")
    if res.status != 0:
        raise RuntimeError(f"fluid_optimum: the LP did not solve ({res.message})")
    x = np.maximum(np.asarray(res.x, float), 0.0)
    return {"x": x, "g": g, "tokens_per_iteration": float(o @ x),
            "requests_per_iteration": float(x.sum()), "memory_tokens_used": float(g @ x),
            "status": "OPTIMAL"}


def wait_thresholds(prompt_tokens: Any, output_tokens: Any, x: Any) -> dict[tuple[int, int], int]:
    """WAIT's thresholds (4): ``{(prompt, output): floor(x_j)}`` for the fluid admissions
    ``x``; a type with threshold 0 is never admitted (the fluid optimum admits less than
    one per iteration). Their memory ``sum_j n_j g_j`` never exceeds the fluid's."""
    s, o, _ = _types(prompt_tokens, output_tokens, np.zeros(len(np.atleast_1d(x))))
    xs = np.asarray(x, float)
    if xs.shape != s.shape or np.any(xs < 0):
        raise ValueError(f"wait_thresholds: x must be >= 0 with shape {s.shape}")
    return {(int(a), int(b)): int(math.floor(v + 1e-9)) for a, b, v in zip(s, o, xs)}


def fluid_unknown_lengths(prompt_tokens: Any, output_tokens: Any, rate: Any,
                          memory_tokens: float, *, iteration_s: float = 1.0,
                          block_tokens: int = 1) -> dict[str, Any]:
    """(6): with output lengths unknown at admission the admitted mix is the arrival mix
    ``p_j = rate_j / sum rate``, so at most ``x = min(sum rate * iteration_s, M / E_p[g])``
    requests per iteration. Returns ``x``, ``mean_g`` and ``tokens_per_iteration``."""
    s, o, lam = _types(prompt_tokens, output_tokens, rate)
    g, _ = kv_token_iterations(s, o, block_tokens=block_tokens)
    p = lam / lam.sum()
    mean_g = float(p @ g)
    x = min(float(lam.sum()) * iteration_s, float(memory_tokens) / mean_g)
    return {"x": x, "mean_g": mean_g, "tokens_per_iteration": x * float(p @ o)}
