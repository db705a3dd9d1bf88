"""The one definition of every metric (layer 2).

Per-request times are arrays of shape ``(n,)`` in seconds, NaN where undefined (a
request that never produced a token has NaN TTFT). Summaries ignore NaN entries.

Definitions:
    TTFT      = first_token_s - arrival_s
    TPOT      = (finish_s - first_token_s) / (output_tokens - 1)   (NaN for 1-token outputs)
    E2E       = finish_s - arrival_s
    queue     = first_scheduled_s - arrival_s   (time before the request first ran)
    goodput   = requests finished within both SLOs per second of makespan
    hit rate  = prompt tokens served from the prefix cache / prompt tokens prefilled+hit
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}

#: a summary warns when a policy rejects more than this share of the requests: its
#: latencies then describe only the requests it accepted
REJECTION_WARN_SHARE = 0.01


def rejection_warning(n_rejected: int, n_requests: int, reasons: dict[str, int],
                      policy: str = "policy") -> str | None:
    """One line saying that ``policy`` rejected ``n_rejected`` of ``n_requests`` requests
    (with the count per reason) and that its latencies cover only the rest; ``None`` when
    the share is at most :data:`REJECTION_WARN_SHARE`."""
    if n_requests <= 0 or n_rejected / n_requests <= REJECTION_WARN_SHARE:
        return None
    why = ", ".join(f"{k} {v:,}" for k, v in sorted(reasons.items()))
    return (f"{policy} REJECTED {n_rejected:,} of {n_requests:,} requests "
            f"({100.0 * n_rejected / n_requests:.1f} %){': ' + why if why else ''}; its "
            "latency and goodput figures cover only the requests it accepted")


def ttft_s(arrival_s: np.ndarray, first_token_s: np.ndarray) -> np.ndarray:
    """Time to first token in seconds, ``first_token_s - arrival_s``, shape ``(n,)``
    (NaN where the request produced no token)."""
    return np.asarray(first_token_s, float) - np.asarray(arrival_s, float)


def e2e_s(arrival_s: np.ndarray, finish_s: np.ndarray) -> np.ndarray:
    """End-to-end latency in seconds, ``finish_s - arrival_s``, shape ``(n,)`` (NaN where
    the request did not finish)."""
    return np.asarray(finish_s, float) - np.asarray(arrival_s, float)


def queue_s(arrival_s: np.ndarray, first_scheduled_s: np.ndarray) -> np.ndarray:
    """Queueing delay in seconds, ``first_scheduled_s - arrival_s``, shape ``(n,)``: the
    time before the request first ran."""
    return np.asarray(first_scheduled_s, float) - np.asarray(arrival_s, float)


def tpot_s(first_token_s: np.ndarray, finish_s: np.ndarray,
           output_tokens: np.ndarray) -> np.ndarray:
    """Time per output token in seconds, ``(finish_s - first_token_s) /
    (output_tokens - 1)``, shape ``(n,)``; NaN for 1-token outputs (they have no decode gap)."""
    out = np.asarray(output_tokens, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = (np.asarray(finish_s, float) - np.asarray(first_token_s, float)) / (out - 1.0)
    return np.where(out > 1, v, np.nan)


def distribution(x: np.ndarray) -> dict[str, float]:
    """``{"mean","p50","p90","p99"}`` of the finite entries (NaN when there are none)."""
    a = np.asarray(x, float)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return {"mean": float("nan"), **{k: float("nan") for k in QUANTILES}}
    out = {"mean": float(a.mean())}
    for k, q in QUANTILES.items():
        out[k] = float(np.percentile(a, q))
    return out


def meets_slo(ttft: np.ndarray, tpot: np.ndarray, slo_ttft_s: Any,
              slo_tpot_s: Any, e2e: np.ndarray | None = None,
              slo_e2e_s: Any = float("inf")) -> np.ndarray:
    """True where TTFT and TPOT are within the SLO (a 1-token output has no TPOT) and,
    when ``e2e`` is given, the end-to-end latency within the deadline ``slo_e2e_s``
    (scalars or per-request arrays)."""
    t = np.asarray(ttft, float)
    p = np.asarray(tpot, float)
    ok = np.isfinite(t) & (t <= slo_ttft_s) & (~np.isfinite(p) | (p <= slo_tpot_s)) & \
        ~(np.isnan(t))
    if e2e is not None:
        ok &= np.asarray(e2e, float) <= slo_e2e_s
    return ok


def makespan_s(arrival_s: np.ndarray, finish_s: np.ndarray) -> float:
    """From the first arrival to the last finish (s); NaN when nothing finished."""
    f = np.asarray(finish_s, float)
    f = f[np.isfinite(f)]
    if f.size == 0 or len(arrival_s) == 0:
        return float("nan")
    return float(f.max() - np.min(arrival_s))


def total_latency_s(e2e: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Sum of (weighted) end-to-end latencies of finished requests."""
    e = np.asarray(e2e, float)
    w = np.ones_like(e) if weights is None else np.asarray(weights, float)
    m = np.isfinite(e)
    return float(np.sum(w[m] * e[m]))


#: the latency metrics a summary reports, each with :data:`STATS`
LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
STATS = ("mean", "p50", "p90", "p99")


def flatten(summary: Mapping[str, Any]) -> dict[str, float]:
    """``{"e2e_s": {"mean": x, ...}, "goodput_rps": y}`` -> ``{"e2e_s_mean": x, ...,
    "goodput_rps": y}`` (numbers only; nested dicts other than the latency keys dropped):
    the keys of ``lp.compare``'s columns."""
    out: dict[str, float] = {}
    for k, v in summary.items():
        if k in LATENCY_METRICS and isinstance(v, Mapping):
            for q in STATS:
                out[f"{k}_{q}"] = float(v[q])
        elif isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            out[k] = float(v) if isinstance(v, (float, np.floating)) else int(v)
    return out


def summarize(*, arrival_s: np.ndarray, first_token_s: np.ndarray, finish_s: np.ndarray,
              first_scheduled_s: np.ndarray, output_tokens: np.ndarray, finished: np.ndarray,
              rejected: np.ndarray, cached_prompt_tokens: np.ndarray,
              prompt_tokens_seen: np.ndarray, slo_ttft_s: float, slo_tpot_s: float,
              wall_s: float, kv_utilization: float = float("nan"),
              slo_e2e_s: float = float("inf")) -> dict[str, Any]:
    """Summary dict with the DESIGN keys (see the module docstring for definitions);
    goodput counts requests within TTFT, TPOT and the end-to-end deadline ``slo_e2e_s``."""
    fin = np.asarray(finished, bool)
    tt = ttft_s(arrival_s, first_token_s)
    tp = tpot_s(first_token_s, finish_s, output_tokens)
    ee = e2e_s(arrival_s, finish_s)
    qq = queue_s(arrival_s, first_scheduled_s)
    span = makespan_s(arrival_s, np.where(fin, finish_s, np.nan))
    n_fin = int(fin.sum())
    good = int(np.sum(fin & meets_slo(tt, tp, slo_ttft_s, slo_tpot_s, ee, slo_e2e_s)))
    seen = float(np.sum(prompt_tokens_seen))
    return {
        "ttft_s": distribution(tt[fin]),
        "tpot_s": distribution(tp[fin]),
        "e2e_s": distribution(ee[fin]),
        "queue_s": distribution(qq[fin]),
        "throughput_rps": n_fin / span if span and span > 0 else float("nan"),
        "goodput_rps": good / span if span and span > 0 else float("nan"),
        "prefix_hit_rate": float(np.sum(cached_prompt_tokens)) / seen if seen > 0 else 0.0,
        "n_requests": int(len(arrival_s)),
        "n_finished": n_fin,
        "n_rejected": int(np.sum(rejected)),
        "n_unfinished": int(len(arrival_s) - n_fin - int(np.sum(rejected))),
        "makespan_s": span,
        "kv_utilization": kv_utilization,
        "wall_s": float(wall_s),
    }


def jain_index(x: np.ndarray) -> float:
    """Jain's fairness index ``(sum x)^2 / (n sum x^2)`` of the allocations ``x`` (shape
    ``(n,)``, >= 0): 1 when all are equal, ``1/n`` when one gets everything; NaN for no
    entries or all zero."""
    a = np.asarray(x, float)
    if a.size == 0 or not np.any(a > 0):
        return float("nan")
    return float(a.sum() ** 2 / (a.size * np.sum(a * a)))


def tenant_summary(*, tenant: np.ndarray, arrival_s: np.ndarray, first_token_s: np.ndarray,
                   finish_s: np.ndarray, first_scheduled_s: np.ndarray,
                   prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                   generated_tokens: np.ndarray, finished: np.ndarray,
                   slo_ttft_s: np.ndarray, slo_tpot_s: np.ndarray,
                   tier: np.ndarray, slo_e2e_s: np.ndarray | None = None) -> dict[str, Any]:
    """Per-tenant and per-tier metrics (all arrays shape ``(n,)``, one entry per request).

    ``tenant`` is the trace's tenant id (-1 for none); ``slo_ttft_s``/``slo_tpot_s`` each
    request's objectives (its tier's); ``tier`` its tier name (object array);
    ``slo_e2e_s`` each request's end-to-end deadline (``None``: none).

    Returns ``tenants``: ``{tenant: {n_requests, n_finished, prompt_tokens,
    output_tokens, service_tokens, ttft_s, e2e_s, slo_attainment}}`` where the service a
    tenant received is the prompt tokens of its requests that started plus the output
    tokens they produced (``service_tokens`` = their sum), latency distributions are over
    finished requests and SLO attainment is the share of *all* its requests finished
    within both objectives; ``jain_index`` of ``service_tokens`` over tenants; and
    ``tiers``: ``{tier: {n_requests, n_finished, slo_attainment, ttft_s, tpot_s}}`` with
    the tier's objectives.
    """
    t = np.asarray(tenant, np.int64)
    fin = np.asarray(finished, bool)
    tt = ttft_s(arrival_s, first_token_s)
    tp = tpot_s(first_token_s, finish_s, output_tokens)
    ee = e2e_s(arrival_s, finish_s)
    started = np.isfinite(np.asarray(first_scheduled_s, float))
    ok = fin & meets_slo(tt, tp, slo_ttft_s, slo_tpot_s, ee,
                         np.inf if slo_e2e_s is None else np.asarray(slo_e2e_s, float))
    p_served = np.where(started, np.asarray(prompt_tokens, np.int64), 0)
    o_served = np.asarray(generated_tokens, np.int64)
    tenants: dict[str, Any] = {}
    service = []
    for u in np.unique(t).tolist():
        m = t == u
        ps, os_ = int(p_served[m].sum()), int(o_served[m].sum())
        service.append(ps + os_)
        tenants[str(u)] = {
            "n_requests": int(m.sum()), "n_finished": int((m & fin).sum()),
            "prompt_tokens": ps, "output_tokens": os_, "service_tokens": ps + os_,
            "ttft_s": distribution(tt[m & fin]), "e2e_s": distribution(ee[m & fin]),
            "slo_attainment": float(ok[m].mean()),
        }
    tiers: dict[str, Any] = {}
    tr = np.asarray(tier, dtype=object)
    for name in sorted(set(tr.tolist())):
        m = tr == name
        k = int(np.flatnonzero(m)[0])
        tiers[str(name)] = {"n_requests": int(m.sum()), "n_finished": int((m & fin).sum()),
                            "slo_attainment": float(ok[m].mean()),
                            "ttft_s": float(slo_ttft_s[k]), "tpot_s": float(slo_tpot_s[k])}
    return {"tenants": tenants, "jain_index": jain_index(np.asarray(service, float)),
            "tiers": tiers}


# ====================================================================== seed-paper metrics
def normalized_latency_s(e2e: np.ndarray, output_tokens: np.ndarray) -> float:
    """Mean over finished requests (finite ``e2e``) of end-to-end latency per output token
    (s/token): the latency metric of Orca and vLLM. NaN when nothing finished."""
    e = np.asarray(e2e, float)
    o = np.asarray(output_tokens, float)
    m = np.isfinite(e)
    return float(np.mean(e[m] / o[m])) if m.any() else float("nan")


def kv_token_seconds(first_scheduled_s: np.ndarray, first_token_s: np.ndarray,
                     finish_s: np.ndarray, prompt_tokens: np.ndarray,
                     output_tokens: np.ndarray) -> float:
    """Time integral of the tokens whose KV is stored (token-seconds), summed over
    finished requests that were never preempted (the caller selects them).

    A request admitted at ``S`` fills its prompt's ``p`` tokens until its first token at
    ``T`` (half of them on average over ``[S, T]``), then holds ``p + g - 1`` tokens while
    producing its ``g``-th token until its finish ``F``:
    ``p (T - S) / 2 + (p + (o - 1) / 2) (F - T)``. Divided by the KV memory the engine
    held over the run (block-seconds times tokens per block) it is the share of that memory
    that stored tokens (vLLM paper, Fig. 2)."""
    S = np.asarray(first_scheduled_s, float)
    T = np.asarray(first_token_s, float)
    F = np.asarray(finish_s, float)
    p = np.asarray(prompt_tokens, float)
    o = np.asarray(output_tokens, float)
    m = np.isfinite(S) & np.isfinite(T) & np.isfinite(F)
    return float(np.sum(p[m] * (T[m] - S[m]) / 2.0 + (p[m] + (o[m] - 1.0) / 2.0)
                        * (F[m] - T[m])))


def _program_ids(program_id: np.ndarray | None, n: int) -> np.ndarray:
    """Program of each request; a request outside any program (-1) is its own."""
    idx = np.arange(n, dtype=np.int64)
    if program_id is None:
        return idx
    pid = np.asarray(program_id, np.int64)
    # requests without a program get ids past every program id
    return np.where(pid >= 0, pid, pid.max(initial=0) + 1 + idx)


def program_token_latency_s(*, arrival_s: np.ndarray, finish_s: np.ndarray,
                            output_tokens: np.ndarray, program_id: np.ndarray | None,
                            parent: np.ndarray | None) -> np.ndarray:
    """Autellix's program-level token latency, one value per program (s/token, sorted by
    program id; NaN for a program with an unfinished call).

    A program's response time runs from its first call's arrival to its last call's
    finish; it is divided by the output tokens on the program's critical path: the most
    tokens along any chain of parent links (for a chain of calls, all of them; for a tree of
    parallel calls, the longest root-to-leaf path)."""
    a = np.asarray(arrival_s, float)
    f = np.asarray(finish_s, float)
    o = np.asarray(output_tokens, float)
    n = a.size
    pid = _program_ids(program_id, n)
    path = o.copy()
    if parent is not None:
        par = np.asarray(parent, np.int64)
        for i in range(n):  # parents come first in a trace
            if par[i] >= 0:
                path[i] += path[par[i]]
    progs, inv = np.unique(pid, return_inverse=True)
    start = np.full(progs.size, np.inf)
    end = np.full(progs.size, -np.inf)
    crit = np.zeros(progs.size)
    np.minimum.at(start, inv, a)
    np.maximum.at(end, inv, np.where(np.isfinite(f), f, np.inf))
    np.maximum.at(crit, inv, path)
    out = (end - start) / crit
    return np.where(np.isfinite(end), out, np.nan)


def service_goodput(*, meets: np.ndarray, output_tokens: np.ndarray,
                    program_id: np.ndarray | None, span_s: float) -> float:
    """JITServe's service goodput: output tokens of the requests that met their SLO per
    second of ``span_s``, where a program (``program_id`` >= 0; a compound request) counts
    only when every one of its calls met its SLO. ``meets``: per request, finished within
    its SLO."""
    m = np.asarray(meets, bool)
    o = np.asarray(output_tokens, float)
    pid = _program_ids(program_id, m.size)
    progs, inv = np.unique(pid, return_inverse=True)
    ok = np.ones(progs.size, bool)
    np.logical_and.at(ok, inv, m)
    return float(np.sum(o[ok[inv]]) / span_s) if span_s > 0 else float("nan")
