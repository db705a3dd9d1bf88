"""Disaggregated prefill/decode control: pool sizes, KV-transfer order, and the policy.

Two timescales (``models/lyapunov-pd.md`` section 6):

* **slow** — :func:`pool_sizes`: a fluid LP (HiGHS, integer replica counts) that gives
  the fewest prefill and decode replicas whose service rates cover the load with a
  utilization cap, under the TPOT SLO (decode batch size) and the KV-transfer link;
* **fast** — the DPP budget controller (:mod:`lpserve.policies.lyapunov`) on every
  replica, join-the-shortest-queue routing into both pools, and an order for the KV
  transfers that share a prefill replica's link: :func:`link_schedule` compares FCFS,
  a reverse multi-level queue (MFS's defer-and-promote) and least-laxity-first.
"""
from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from lpserve.policies.lyapunov import CLAIMS, DPPController, DPPScheduler
from lpserve.policies.routers import LeastOutstanding
from lpserve.policy import LRU, EngineConfig, Meta, Policy

LINK_ORDERS = ("fcfs", "rmlq", "llf")


def _t(cost: Any, prefill: list[int], ctx: list[int]) -> float:
    return float(cost.batch_time_s(prefill_tokens=prefill, prefill_cached=[0] * len(prefill),
                                   decode_context=ctx))


def pool_rates(cost: Any, *, mean_prompt_tokens: float, mean_output_tokens: float,
               tpot_slo_s: float, prefill_budget_tokens: int = 2048,
               kv_tokens: int | None = None, max_num_seqs: int = 256) -> dict[str, float]:
    """Per-replica service rates (requests/s) of a prefill and of a decode replica.

    Prefill: full batches of ``prefill_budget_tokens`` tokens, ``mu_p = b / (t(b) m_p)``.
    Decode: the largest batch ``N <= max_num_seqs`` whose iteration (contexts
    ``m_p + m_d / 2``) meets ``tpot_slo_s`` and whose KV fits ``kv_tokens``;
    ``mu_d = N / (t_dec(N) m_d)`` (eq. (20)).
    """
    mp, md = float(mean_prompt_tokens), float(mean_output_tokens)
    if mp <= 0 or md <= 0 or tpot_slo_s <= 0:
        raise ValueError(f"pool_rates: need positive mean lengths and tpot_slo_s, got "
                         f"{mp}, {md}, {tpot_slo_s}")
    b = int(prefill_budget_tokens)
    mu_p = b / (_t(cost, [b], []) * mp)
    kv = int(kv_tokens if kv_tokens is not None else cost.kv_capacity_tokens())
    ctx = int(round(mp + md / 2))
    n_cap = max(1, min(int(max_num_seqs), kv // int(mp + md)))
    best_n = 0
    lo, hi = 1, n_cap
    while lo <= hi:  # decode iteration time grows with the batch
        mid = (lo + hi) // 2
        if _t(cost, [], [ctx] * mid) <= tpot_slo_s:
            best_n, lo = mid, mid + 1
        else:
            hi = mid - 1
    mu_d = best_n / (_t(cost, [], [ctx] * best_n) * md) if best_n else 0.0
    return {"mu_prefill_rps": mu_p, "mu_decode_rps": mu_d, "decode_batch": float(best_n)}


def pool_sizes(cost: Any, *, rate_rps: float, mean_prompt_tokens: float,
               mean_output_tokens: float, tpot_slo_s: float, max_utilization: float = 0.85,
               link_gbps: float | None = None, prefill_budget_tokens: int = 2048,
               max_num_seqs: int = 256) -> dict[str, Any]:
    """Fewest replicas (prefill ``x_p`` + decode ``x_d``) for ``rate_rps``, by MIP.

    ``min x_p + x_d`` s.t. ``mu_p x_p >= rate / u_max``, ``mu_d x_d >= rate / u_max`` and,
    with a link, ``rate * kv_bytes(m_p) * 8 / 1e9 <= u_max * link_gbps * x_p`` (each prefill
    replica has its own link), ``x`` integer >= 1 (eq. (21)). Returns the counts, the LP
    status, the rates and the utilizations at the optimum.
    """
    import highspy

    if not 0 < max_utilization <= 1 or rate_rps <= 0:
        raise ValueError(f"pool_sizes: need 0 < max_utilization <= 1 and rate_rps > 0, got "
                         f"{max_utilization}, {rate_rps}")
    r = pool_rates(cost, mean_prompt_tokens=mean_prompt_tokens,
                   mean_output_tokens=mean_output_tokens, tpot_slo_s=tpot_slo_s,
                   prefill_budget_tokens=prefill_budget_tokens, max_num_seqs=max_num_seqs)
    if r["mu_decode_rps"] <= 0:
        return {"status": "Infeasible", **r,
                "reason": "no decode batch meets the TPOT SLO on this GPU"}
    h = highspy.Highs()
    h.silent()
    inf = highspy.kHighsInf
    for _ in range(2):
        h.addVar(1.0, inf)
    h.changeColCost(0, 1.0)
    h.changeColCost(1, 1.0)
    h.changeColsIntegrality(2, np.array([0, 1], np.int32),
                            np.array([highspy.HighsVarType.kInteger] * 2))
    need = rate_rps / max_utilization
    h.addRow(need, inf, 1, np.array([0], np.int32), np.array([r["mu_prefill_rps"]]))
    h.addRow(need, inf, 1, np.array([1], np.int32), np.array([r["mu_decode_rps"]]))
    link_load = None
    if link_gbps is not None:
        link_load = rate_rps * float(cost.kv_bytes_per_token) * mean_prompt_tokens * 8 / 1e9
        h.addRow(link_load / max_utilization, inf, 1, np.array([0], np.int32),
                 np.array([float(link_gbps)]))
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    x = np.round(np.asarray(h.getSolution().col_value)).astype(int)
    out = {"status": status, "prefill_replicas": int(x[0]), "decode_replicas": int(x[1]),
           **r,
           "prefill_utilization": rate_rps / (r["mu_prefill_rps"] * x[0]),
           "decode_utilization": rate_rps / (r["mu_decode_rps"] * x[1])}
    if link_load is not None:
        out["link_utilization"] = link_load / (float(link_gbps) * x[0])
    return out


def link_schedule(ready_s: Any, size_bytes: Any, deadline_s: Any, link_gbps: float,
                  order: str = "fcfs", levels: int = 4) -> dict[str, np.ndarray]:
    """Non-preemptive schedule of KV transfers on one link.

    Transfer ``i`` becomes ready at ``ready_s[i]`` (its prefill finished), takes
    ``size_bytes[i] * 8 / (link_gbps * 1e9)`` seconds, and should end by
    ``deadline_s[i]`` (e.g. arrival + TTFT SLO). Whenever the link frees it starts the
    ready transfer chosen by ``order``:

    * ``"fcfs"`` — earliest ready first (the simulator's link);
    * ``"rmlq"`` — MFS's reverse multi-level queue: a transfer starts in the lowest of
      ``levels`` priority levels and is promoted one level each time its laxity
      (deadline - now - own duration) halves below the starting laxity; highest level
      first, FCFS within a level;
    * ``"llf"`` — least laxity first (EDF when durations are equal), the order that
      minimizes the maximum lateness on one non-preemptive link among ready jobs.

    Returns ``start_s``, ``end_s`` and ``late`` (end > deadline) per transfer.
    """
    if order not in LINK_ORDERS:
        raise ValueError(f"link_schedule: order must be one of {LINK_ORDERS}, got {order!r}")
    ready = np.asarray(ready_s, np.float64)
    dur = np.asarray(size_bytes, np.float64) * 8 / (float(link_gbps) * 1e9)
    dl = np.asarray(deadline_s, np.float64)
    n = ready.size
    if dur.shape != (n,) or dl.shape != (n,):
        raise ValueError("link_schedule: ready_s, size_bytes and deadline_s must align")
    by_ready = np.argsort(ready, kind="stable")
    lax0 = dl - ready - dur
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    heap: list[tuple[float, float, int]] = []
    waiting: list[int] = []
    t, k = 0.0, 0
    while k < n or heap or waiting:
        if not heap and not waiting:
            t = max(t, ready[by_ready[k]])
        while k < n and ready[by_ready[k]] <= t:
            i = int(by_ready[k])
            k += 1
            if order == "fcfs":
                heapq.heappush(heap, (ready[i], float(i), i))
            elif order == "llf":
                heapq.heappush(heap, (dl[i] - dur[i], float(i), i))
            else:
                waiting.append(i)
        if order == "rmlq":
            best, key = -1, None
            for pos, i in enumerate(waiting):
                lax = dl[i] - t - dur[i]
                base = max(lax0[i], 1e-9)
                lvl = levels - 1 if lax <= 0 else min(levels - 1, max(
                    0, int(math.floor(math.log2(base / lax))) if lax < base else 0))
                kk = (-lvl, ready[i], i)
                if key is None or kk < key:
                    best, key = pos, kk
            i = waiting.pop(best)
        else:
            i = heapq.heappop(heap)[2]
        start[i] = t
        t += dur[i]
        end[i] = t
    return {"start_s": start, "end_s": end, "late": end > dl}


def lyapunov_disagg(V: float = 1.0, tbt_slo_s: float | None = None, eps: float = 0.01,
                    max_num_batched_tokens: int = 2048, max_num_seqs: int = 256,
                    prefix_caching: bool = True, name: str = "lyapunov-disagg") -> Policy:
    """DPP budget control on every replica of a prefill/decode cluster, with
    join-the-shortest-queue routing into both pools (size the pools with
    :func:`pool_sizes`). On a colocated cluster it is the colocated controller. The TBT
    target ``tbt_slo_s`` is the instance's TPOT SLO unless set here."""
    ctl = DPPController(V=V, tbt_slo_s=tbt_slo_s, eps=eps)
    eng = EngineConfig(batching="decode-first", chunked_prefill=True,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       preemption="recompute", watermark=0.01, prefix_caching=prefix_caching,
                       budget_controller=ctl)
    sched = DPPScheduler()
    sched.meta = Meta(engines=("lpserve",), claims=CLAIMS)
    return Policy(router=LeastOutstanding(), scheduler=sched, evictor=LRU(), engine=eng,
                  decode_router=LeastOutstanding(), name=name)
