"""Stability of a serving replica: the predicted capacity of a work-conserving engine and a
measured test of queue growth.

Prediction (``models/stability.md``). With arrivals per iteration ``nu`` in equilibrium,
a work-conserving engine holds ``nu E[g]`` KV tokens, ``nu E[L]`` running requests and
``nu E[s + o - 1]`` batched tokens per iteration, where ``g(s, o)`` is the KV memory a
request holds summed over the iterations it is in the batch (Nie, Si, Zhou, arXiv
2605.04595) and ``L`` the number of those iterations. Each resource caps ``nu``:

(1) ``nu_mem = M / E[g]``      (2) ``nu_seq = B / E[L]``      (3) ``nu_tok = b / E[s + o - 1]``

with ``M`` the KV tokens admissions may use, ``B`` the most running requests and ``b``
the token budget of one iteration. The capacity is ``nu* = min(1, 2, 3)`` arrivals per
iteration, i.e. ``lambda* = nu* / t_bar`` requests/s per replica with ``t_bar`` the
iteration time of the equilibrium batch under the cost model. With the memory term
binding this is the paper's ``mu = M / (t_bar E[g])``; (3) is Li, Dai and Peng's
``lambda (m_p + m_d) < b / t_b`` (arXiv 2504.07347) in requests.

Growth test (:func:`queue_growth`): the least-squares slope of the number of requests in
the system over the second half of the arrival window, divided by the arrival rate.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from lpserve.opt.fluid import kv_token_iterations

__all__ = ["kv_token_iterations", "predict_capacity", "queue_growth"]


def predict_capacity(instance: Any, policy: Any) -> dict[str, Any]:
    """Predicted capacity of ``policy`` (a Policy or registered name) on ``instance``'s
    cluster for its trace's length distribution (``models/stability.md``).

    Returns ``rate_rps`` (whole cluster), ``per_replica_rps``, ``binding`` (``"memory"``,
    ``"sequences"`` or ``"tokens"``), ``nu`` (arrivals per iteration) and each term's
    ``nu_mem``/``nu_seq``/``nu_tok``, ``mem_rps`` (the Nie-Si-Zhou ``M / (t_bar E[g])``),
    ``batch_time_s`` (``t_bar``), ``mean_g``, ``mean_L``, ``memory_tokens`` (``M``).
    """
    from lpserve.cost import iteration_time

    if isinstance(policy, str):
        from lpserve.registry import make_policy

        policy = make_policy(policy)
    eng = policy.engine
    cl = instance.cluster
    if cl.disaggregated:
        raise ValueError("predict_capacity: colocated clusters only")
    cost = instance.cost_model()
    bt = int(cl.block_tokens)
    total = int(cost.kv_capacity_blocks(block_tokens=bt,
                                        gpu_memory_fraction=cl.gpu_memory_fraction))
    M = (total - int(eng.watermark * total)) * bt
    tr = instance.trace
    chunk = eng.max_num_batched_tokens if eng.chunked_prefill else None
    g, L = kv_token_iterations(tr.prompt_tokens, tr.output_tokens, chunk_tokens=chunk,
                               block_tokens=bt, reserve_tokens=eng.reserve_tokens)
    s = tr.prompt_tokens.astype(float)
    o = tr.output_tokens.astype(float)
    nu_mem = M / float(g.mean())
    nu_seq = eng.max_num_seqs / float(L.mean())
    nu_tok = eng.max_num_batched_tokens / float(np.mean(s + o - 1))
    nu = min(nu_mem, nu_seq, nu_tok)
    binding = "memory" if nu == nu_mem else ("sequences" if nu == nu_seq else "tokens")
    # the equilibrium batch: nu E[s] prefill tokens and nu E[o - 1] decodes at the
    # token-weighted mean decode context
    n_dec = int(round(nu * float(np.mean(o - 1))))
    dec_ctx = float(np.sum((o - 1) * s + (o - 1) * o / 2.0)) / max(float(np.sum(o - 1)), 1.0)
    pre = int(round(nu * float(s.mean())))
    params = np.ascontiguousarray(cost.params, dtype=np.float64)
    t_bar = float(iteration_time(params, np.array([pre] if pre else [], np.int64),
                                 np.array([0] if pre else [], np.int64),
                                 np.full(n_dec, int(round(dec_ctx)), np.int64)))
    per = nu / t_bar
    return {"rate_rps": per * cl.n_replicas, "per_replica_rps": per, "binding": binding,
            "nu": nu, "nu_mem": nu_mem, "nu_seq": nu_seq, "nu_tok": nu_tok,
            "mem_rps": nu_mem / t_bar * cl.n_replicas, "batch_time_s": t_bar,
            "mean_g": float(g.mean()), "mean_L": float(L.mean()), "memory_tokens": M}


def queue_growth(result: Any, *, start_s: float | None = None,
                 end_s: float | None = None, points: int = 400) -> dict[str, Any]:
    """Least-squares slope of the number of requests in the system (arrived, neither
    finished nor rejected) over ``[start_s, end_s]`` (default: the second half of the
    arrival window), in requests/s and relative to the arrival rate there.

    Returns ``{"slope_rps", "relative", "in_system_start", "in_system_end"}``; a stable
    queue has ``relative`` near 0, one that grows at load ``rho > 1`` about ``1 - 1/rho``.
    """
    a = result.arrays
    arr = np.sort(a["arrival_s"])
    if arr.size < 2:
        raise ValueError("queue_growth: needs at least two requests")
    lo = float(arr[0] + (arr[-1] - arr[0]) / 2) if start_s is None else float(start_s)
    hi = float(arr[-1]) if end_s is None else float(end_s)
    if not hi > lo:
        raise ValueError(f"queue_growth: empty window [{lo}, {hi}]")
    leave = np.where(a["status"] == "finished", a["finish_s"],
                     np.where(a["status"] == "rejected", a["arrival_s"], np.inf))
    leave = np.sort(leave)
    t = np.linspace(lo, hi, points)
    n = np.searchsorted(arr, t, side="right") - np.searchsorted(leave, t, side="right")
    slope = float(np.polyfit(t, n.astype(float), 1)[0])
    rate = (np.searchsorted(arr, hi, side="right") - np.searchsorted(arr, lo, side="left")) \
        / (hi - lo)
    return {"slope_rps": slope, "relative": slope / rate if rate > 0 else math.nan,
            "in_system_start": int(n[0]), "in_system_end": int(n[-1])}
