"""Coefficients of the time-indexed cost-model LP (``models/cost-lp.md`` (1)-(7)).

Everything here is a closed form of the cost model's parameters or a table of its exact
iteration times; the LP itself is in :mod:`lpserve.opt.cost_lp`.

* :class:`Minorant` and :func:`iteration_minorant` — two affine lower bounds of one
  iteration's time (``models/cost-lp.md`` (1)-(2)): ``T >= F_A + sum of A-increments`` (the
  memory-bound side: weight streaming is paid once per iteration) and ``T >= F_B + sum of
  B-increments`` (the compute-bound side: every token costs its linear-layer FLOPs).
* :func:`share_levels` — the per-token time levels of one request and the least share of
  the replica's time a token at that level takes, a piecewise-linear minorant of
  ``w t / (t - F)`` (``models/cost-lp.md`` (4)-(5)).
* :func:`prefill_classes` — chunk-size classes: least request time and least increments
  per prompt token of a chunk in the class (``models/cost-lp.md`` (3)).
* :func:`decode_floor` — ``d(c)``, the least time of an iteration that produces a token at
  context ``c`` (a decode, or the last chunk of a recompute), on a grid, with prefix sums.
* :func:`counted_prompt_tokens` — prompt tokens of each request counted once across the
  requests that share prefix blocks (``models/cost-lp.md`` (7)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Minorant", "iteration_minorant", "minorant_time", "share_levels",
           "prefill_classes", "PromptClass", "decode_floor", "prefill_rate",
           "regime_shares",
           "regime_prompt_shares", "counted_prompt_tokens", "SUPPORTED_KINDS"]

#: cost-model kinds the LP has minorants for (``CostModel.kind``: 0 analytic, 2 unit-round;
#: the measured-table kind 1 has none: its interpolated profiles are not convex, so no
#: per-member increment is proved for them)
KIND_ANALYTIC, KIND_UNIT_ROUND = 0, 2
SUPPORTED_KINDS = (KIND_ANALYTIC, KIND_UNIT_ROUND)


@dataclass(frozen=True)
class Minorant:
    """Affine lower bounds of one iteration's time (s), ``models/cost-lp.md`` (1)-(2).

    For every non-empty batch: ``T >= F_A + sum_j a_j`` and ``T >= F_B + sum_j b_j``, where a
    decode at context ``c`` has ``a = dec0_a + dec1 * c`` and ``b = a + lin_token + head_seq``
    and a prefill chunk of ``c`` new tokens has ``a >= c * pre_a + lin_token * (c - n_star)^+``
    and ``b >= c * (pre_a + lin_token)``. All fields in seconds (per token where named so).
    """

    kind: int
    F_A: float
    F_B: float
    dec0_a: float
    dec1: float
    pre_a: float
    lin_token: float
    head_seq: float
    n_star: float
    fixed_dec: float = 0.0

    def decode_a(self, context: np.ndarray) -> np.ndarray:
        """A-increment of a decode at ``context`` tokens (s), shape of ``context``."""
        return self.dec0_a + self.dec1 * np.asarray(context, np.float64)

    def decode_b(self, context: np.ndarray) -> np.ndarray:
        """B-increment of a decode at ``context`` tokens (s)."""
        return self.decode_a(context) + self.lin_token + self.head_seq

    def chunk_a(self, tokens: float) -> float:
        """Least A-increment of one prefill chunk of ``tokens`` new tokens (s)."""
        return tokens * self.pre_a + self.lin_token * max(0.0, tokens - self.n_star)

    def chunk_b(self, tokens: float) -> float:
        """Least B-increment of one prefill chunk of ``tokens`` new tokens (s)."""
        return tokens * (self.pre_a + self.lin_token)


def iteration_minorant(cost: Any) -> Minorant:
    """The :class:`Minorant` of a cost model (``models/cost-lp.md`` (1)-(2)).

    Analytic model (``models/cost-model.md`` (1)-(8)): ``F_A`` = weight streaming, LM-head
    weights, per-layer and per-iteration overheads, all-reduce latency and the fixed
    decode-attention cost; ``F_B`` the same with the linear layers' compute plateau in place
    of weight streaming. A decode's increment is its KV read (the larger of the two
    attention roofline rates, which are both linear in context) plus its per-sequence cost;
    a chunk's is at least the smaller of the two prefill-attention rates per token. Each
    bound is also an increment bound for a recompute's last chunk (``proofs/cost-lp-bound.md``
    lemma 1). Unit-round model: ``T = 1``, no increments. Raises ValueError for other kinds.
    """
    kind = int(getattr(cost, "kind", -1))
    if kind == KIND_UNIT_ROUND:
        return Minorant(kind, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, math.inf)
    if kind != KIND_ANALYTIC or not hasattr(cost, "named_params"):
        raise ValueError(f"cost-lp: no iteration-time minorant for cost-model kind {kind} "
                         f"(supported: analytic {KIND_ANALYTIC}, unit-round {KIND_UNIT_ROUND}); "
                         "measured tables are not convex")
    p = cost.named_params()
    if p["moe_experts"] > 0:
        raise ValueError("cost-lp: mixture-of-experts models are not supported (the touched "
                         "experts make weight streaming grow with the batch)")
    L = p["layers"]
    bw, fl = p["peak_bw"], p["peak_flops"]
    w_mem = p["lin_bytes"] / (bw * p["eff_weights"])                 # cost-model.md (3) memory side
    f_tok = p["lin_flops"] / (fl * p["eff_compute"])                 # cost-model.md (3) compute
    n0 = p["plateau_tokens"]
    head_mem = p["head_bytes"] / (bw * p["eff_weights"])             # cost-model.md (4)
    head_cmp = p["head_flops"] / (fl * p["eff_compute"])
    tp = p["tp"]
    ar_fixed = 2.0 * p["ar_latency_s"] * math.log2(tp) if tp > 1 else 0.0      # cost-model.md (7)
    ar_tok = 4.0 * (tp - 1.0) / tp * p["hidden"] * p["act_bytes"] / p["ar_bw"] \
        if tp > 1 else 0.0
    kv = p["kv_bytes"] / (bw * p["eff_kv"])                           # cost-model.md (5)-(6)
    at = p["attn_flops"] / (fl * p["eff_attn"])
    na = p["attn_plateau"]
    fixed = L * (ar_fixed + p["layer_overhead_s"]) + p["iter_overhead_s"]          # cost-model.md (8)
    # the decode-attention fixed cost tau_f is paid by every iteration that produces a
    # decode-phase token, unless that token comes from a recompute chunk whose own fixed
    # cost tau_c does not cover tau_f + tau_s (proofs/cost-lp-bound.md lemma 1)
    tau_f = p["attn_fixed_s"]
    tau_s, tau_c, tau_tok = p["attn_seq_s"], p["attn_chunk_s"], p["attn_token_s"]
    chunk_rate = min(kv, at * (1.0 + na))          # least prefill-attention rate per KV token
    dec_rate = max(kv, at)                         # decode attention, exact (both linear)
    dec1 = min(dec_rate, chunk_rate)
    covered = tau_c + tau_tok >= tau_s + tau_f and chunk_rate >= dec1
    fixed_dec = L * tau_f if covered else 0.0
    dec0 = L * min(tau_s, tau_c + tau_tok) + p["seq_overhead_s"] + L * ar_tok
    # the last prompt token can be computed by a decode iteration (models/simulator.md (2)):
    # a prompt token's A-increment is the smaller of a chunk's and such a decode's
    pre_a = min(L * (chunk_rate + tau_tok + ar_tok), dec0 + L * dec1)
    return Minorant(kind,
                    F_A=fixed + L * w_mem + head_mem + fixed_dec,
                    F_B=fixed + L * f_tok * n0 + fixed_dec,
                    dec0_a=dec0, dec1=L * dec1,
                    pre_a=pre_a,
                    lin_token=L * f_tok, head_seq=head_cmp,
                    n_star=w_mem / f_tok - n0, fixed_dec=fixed_dec)


def minorant_time(m: Minorant, side: str, decode_context: np.ndarray,
                  chunk_tokens: np.ndarray) -> float:
    """The minorant's value (s) for one batch: ``side`` ``"A"`` or ``"B"``; used by the tests
    that check ``T(batch) >= minorant`` on random batches."""
    ctx = np.asarray(decode_context, np.float64)
    ch = np.asarray(chunk_tokens, np.float64)
    if side == "A":
        return m.F_A + float(np.sum(m.decode_a(ctx))) + sum(m.chunk_a(c) for c in ch)
    return m.F_B + float(np.sum(m.decode_b(ctx))) + sum(m.chunk_b(c) for c in ch)


def _tangent_minorant(ts: np.ndarray, w: float, F: float) -> np.ndarray:
    """Values at the levels ``ts`` of a piecewise-linear function below ``g(t) = w t/(t-F)``
    on ``[ts[0], inf)``: each segment takes the tangent at its geometric midpoint (in
    ``t - F``), each level the smaller of its two segments' tangents, and the last level at
    most ``w`` (the infimum of ``g``)."""
    if w <= 0.0:
        return np.zeros(ts.size)
    s = ts - F
    if ts.size == 1:
        return np.array([min(w * ts[0] / s[0], w)])
    mid = np.sqrt(s[:-1] * s[1:])
    g_mid = w * (mid + F) / mid
    slope = -w * F / mid ** 2
    left = g_mid + slope * (s[:-1] - mid)
    right = g_mid + slope * (s[1:] - mid)
    out = np.empty(ts.size)
    out[0] = left[0]
    out[1:-1] = np.minimum(right[:-1], left[1:])
    out[-1] = min(right[-1], w)
    return np.minimum(out, w * ts / s)


def share_levels(t_min: float, F_a: float, w_a: float, F_b: float, w_b: float, *,
                 ratio_near: float = 1.5, ratio_far: float = 3.0,
                 far_mult: float = 20.0, breaks: Any = ()
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-token time levels of one kind of token and the least A- and B-shares at each.

    A token whose per-token time is ``t`` takes at least ``g_A(t) = w_a t / (t - F_a)`` of a
    replica's time (its part of the iteration when the iteration's time is split in
    proportion to the A-increments; ``models/cost-lp.md`` (4)), and likewise for B. For a
    decode, ``t`` is the iteration's time and ``F`` the minorant's fixed part; for a prompt
    token of a chunk of at most ``c`` tokens, ``t`` is the iteration's time over ``c`` and
    ``F`` the fixed part over ``c`` ((6)). Levels start at ``t_min`` (the least per-token
    time) and grow geometrically in the slack ``t - F_a``: ratio ``ratio_near`` up to a slack
    of ``F_a``, then ``ratio_far`` up to ``far_mult * F_a``; between two levels both minorants
    are linear, so any per-token time is a mix of two adjacent levels ((5)). ``breaks``:
    extra levels (the thresholds of the regime rows, (10)).

    Returns ``(t, share_A, share_B)``, three float64 arrays of equal length (s, s, s).
    """
    F = F_a
    if w_a <= 0.0 or not t_min > F:
        t = np.array([t_min])
        sb = _tangent_minorant(t, w_b, F_b) if w_b > 0 and t_min > F_b else np.zeros(1)
        return t, np.zeros(1), sb
    ts = [t_min]
    slack = t_min - F
    while slack < F:
        slack *= ratio_near
        ts.append(F + slack)
    while slack < far_mult * F:
        slack *= ratio_far
        ts.append(F + slack)
    t = np.unique(np.array(ts + [x for x in breaks if x > t_min]))
    sa = _tangent_minorant(t, w_a, F)
    sb = _tangent_minorant(t, w_b, F_b) if w_b > 0 and t_min > F_b else np.zeros(t.size)
    return t, sa, sb


CHUNK_EDGES = (1, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class PromptClass:
    """Chunks of ``lo..hi`` new tokens (``models/cost-lp.md`` (3), (6)): the least request
    time per prompt token ``rate`` (s), and per-token time levels ``t`` (s, from ``rate``)
    with the least A- and B-share of a prompt token at each (s)."""

    lo: int
    hi: int
    rate: float
    t: np.ndarray
    share_a: np.ndarray
    share_b: np.ndarray


def _class_share(m: Minorant, side: str, lo: int, hi: int, t: float) -> float:
    """Least share of a prompt token at per-token time ``t`` over realizable chunk sizes
    ``c`` in ``lo..hi`` (``c t`` at least the fixed part): ``inc(c) t / (c t - F)`` is
    decreasing in ``c`` up to ``n*`` and monotone above it, so its minimum is at one of
    ``min(hi, n*)``, ``max(lo', n*)``, ``hi`` (``lo'`` the least realizable size)."""
    # an iteration with no decode-phase token lacks the decode fixed cost
    F = (m.F_A if side == "A" else m.F_B) - m.fixed_dec
    inc = m.chunk_a if side == "A" else m.chunk_b
    lo_r = max(float(lo), math.floor(F / t) + 1.0) if t > 0 else math.inf
    if lo_r > hi:
        return math.inf
    cands = {float(hi)}
    if math.isfinite(m.n_star):
        if min(hi, m.n_star) >= lo_r:
            cands.add(float(math.floor(min(hi, m.n_star))))
        if max(lo_r, m.n_star) <= hi:
            cands.add(float(math.ceil(max(lo_r, m.n_star))))
    vals = [inc(c) * t / (c * t - F) for c in cands if c * t > F and c >= lo_r]
    return min(vals) if vals else math.inf


def prefill_classes(cost: Any, m: Minorant, max_tokens: int, edges: Any = None, *,
                    ratio: float = 1.8, n_levels: int = 4) -> list[PromptClass]:
    """Chunk-size classes up to ``max_tokens`` (``models/cost-lp.md`` (3), (6)).

    ``rate`` is ``min_{lo <= c <= hi} T(prefill c alone) / c`` (exact times on every size up
    to 8192; 64 sizes per class above, where between two evaluated sizes the bound takes the
    lower size's time over the higher size: time is non-decreasing in size). A prompt token
    of a chunk of ``c`` tokens in an iteration of time ``T`` has per-token time ``t = T / c``
    and takes ``inc(c) t / (c t - F)`` of a replica (its increment's part of the iteration,
    as (4)); the least over the class, ``h(t)``, is decreasing in ``t``. Level ``k`` of
    ``n_levels`` (geometric by ``ratio`` in ``t - F_A / hi`` from ``rate``) carries
    ``h(t_{k+1})`` (the last: the limit ``inc(lo) / lo``), so every per-token time is a mix
    of two adjacent levels whose share is at most the true one.
    """
    top = max(int(max_tokens), 1)
    e = [int(x) for x in (CHUNK_EDGES if edges is None else edges) if x <= top]
    e = sorted(set(e + [1]))
    if m.n_star != math.inf and 1 < m.n_star < top:
        e = sorted(set(e + [int(math.floor(m.n_star)) + 1]))
    bounds = e + [top + 1]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a > top:
            break
        hi = b - 1
        n = np.arange(a, b)
        if n.size > 1024:
            n = np.unique(np.concatenate([np.geomspace(a, hi, 64).astype(np.int64), [hi]]))
        tt = cost.prefill_alone_s(n)
        nxt = np.append(n[1:], hi + 1)
        per = np.minimum(tt / n, np.where(nxt > n + 1, tt / (nxt - 1), np.inf))
        rate = float(per.min())
        if a == 1:  # a last prompt token computed by a decode iteration (see Minorant)
            rate = min(rate, float(cost.decode_alone_s(np.zeros(1, np.int64))[0]))
        if m.kind != KIND_ANALYTIC:
            out.append(PromptClass(a, hi, rate, np.array([rate]), np.zeros(1), np.zeros(1)))
            continue
        base = (m.F_A - m.fixed_dec) / hi
        t = base + (rate - base) * ratio ** np.arange(n_levels)
        nxt_t = np.append(t[1:], np.inf)
        sa = np.array([_class_share(m, "A", a, hi, x) if math.isfinite(x)
                       else m.chunk_a(float(a)) / a for x in nxt_t])
        sb = np.array([_class_share(m, "B", a, hi, x) if math.isfinite(x)
                       else m.chunk_b(1.0) for x in nxt_t])
        out.append(PromptClass(a, hi, rate, t, np.minimum(sa, 1e3), np.minimum(sb, 1e3)))
    return out


def decode_floor(cost: Any, c_max: int, max_points: int = 1024) -> tuple[np.ndarray, int]:
    """Prefix sums ``S[c] = sum_{x < c} d(x)`` for ``c = 0..c_max + 1``, where ``d(x)`` is
    the least time of an iteration that produces a token at context ``x``: the smaller of a
    lone decode at ``x`` and a lone one-token chunk with ``x`` tokens cached (a recompute's
    last chunk is at least that; ``proofs/cost-lp-bound.md`` lemma 1), taken at the grid point
    at or below ``x`` (both times are non-decreasing in context). Returns ``(S, grid)``."""
    grid = max(1, -(-(c_max + 1) // max_points))
    pts = np.arange(0, c_max + 1, grid, dtype=np.int64)
    dec = cost.decode_alone_s(pts)
    pre = cost.prefill_alone_s(np.ones(pts.size, np.int64), pts)
    d = np.repeat(np.minimum(dec, pre), grid)[:c_max + 1]
    return np.concatenate([[0.0], np.cumsum(d)]), grid


def prefill_rate(cost: Any, max_tokens: int) -> tuple[float, float]:
    """``(r, t1)``: the least prefill time per token over chunk sizes ``1..max_tokens`` (every
    size up to 8192, then a geometric grid whose gaps take the lower size's time over the
    higher size) and the time of a one-token chunk (s/token, s)."""
    top = max(int(max_tokens), 1)
    n = np.arange(1, min(top, 8192) + 1, dtype=np.int64)
    t = cost.prefill_alone_s(n)
    r = float(np.min(t / n))
    if top > 8192:
        g = np.unique(np.geomspace(8192, top, 512).astype(np.int64))
        tg = cost.prefill_alone_s(g)
        nxt = np.append(g[1:], top + 1)
        r = min(r, float(np.min(tg / np.maximum(nxt - 1, g))))
    return r, float(t[0])


def counted_prompt_tokens(trace: Any) -> np.ndarray:
    """Prompt tokens of each request whose KV no other request can share, plus the shared
    prefix blocks it is the first (lowest index) to hold: summed over any set of requests
    this counts every physical KV block at most once (``models/cost-lp.md`` (7)). Without
    block ids every prompt token counts. int64 shape (n,)."""
    s = np.asarray(trace.prompt_tokens, np.int64)
    flat, off = getattr(trace, "block_flat", None), getattr(trace, "block_offsets", None)
    bt = int(getattr(trace, "block_tokens", 0) or 0)
    if flat is None or off is None or bt <= 0 or len(flat) == 0:
        return s.copy()
    flat = np.asarray(flat, np.int64)
    off = np.asarray(off, np.int64)
    owner_of: dict[int, int] = {}
    out = s.copy()
    fl = flat.tolist()
    for i in range(s.size):
        for b in fl[off[i]:off[i + 1]]:
            first = owner_of.setdefault(b, i)
            if first != i:
                out[i] -= bt
    return np.maximum(out, 0)


def regime_shares(t: np.ndarray, share_a: np.ndarray, share_b: np.ndarray,
                  threshold: float) -> np.ndarray:
    """Coefficients of one regime row (``models/cost-lp.md`` (10)) for a decode-phase token
    at the levels ``t``: the A-share below the iteration-time ``threshold``, the B-share
    above, the smaller at the threshold itself (a level). Every member of an iteration has
    the same iteration time, so an iteration's members all use one side, whose shares sum
    to at most its time."""
    return np.where(t < threshold, share_a, np.where(t > threshold, share_b,
                                                     np.minimum(share_a, share_b)))


def regime_prompt_shares(pc: "PromptClass", threshold: float) -> np.ndarray:
    """Regime-row coefficients of a prompt class's levels: a chunk of ``lo..hi`` tokens at
    per-token time in ``[t_k, t_{k+1}]`` has iteration time in ``[lo t_k, hi t_{k+1}]``; the
    coefficient is the side that applies there (the smaller when the range straddles the
    threshold), then the running minimum from the last level down, so that the levels'
    values never increase (every mix of two adjacent levels stays below the true share)."""
    nxt = np.append(pc.t[1:], np.inf)
    lo_T = pc.lo * pc.t
    hi_T = pc.hi * nxt
    v = np.where(hi_T < threshold, pc.share_a,
                 np.where(lo_T > threshold, pc.share_b, np.minimum(pc.share_a, pc.share_b)))
    return np.minimum.accumulate(v[::-1])[::-1]
