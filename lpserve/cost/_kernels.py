"""Numba kernels of the GPU cost model, each beside a plain-Python ``_ref`` twin.

Interface (stable; the simulator's numba code calls these directly):

``iteration_time(params, prefill_tokens, prefill_cached, decode_context) -> float64``
    Seconds for one iteration of a mixed batch on one replica. ``params`` is the flat
    float64 array of a :class:`~lpserve.cost.CostModel` (``model.params``);
    ``prefill_tokens[i]`` is the number of tokens of prefill chunk ``i`` in this iteration
    and ``prefill_cached[i]`` the tokens already in the KV cache before it (both int64,
    shape ``(n_chunks,)``); ``decode_context[j]`` is the context length (tokens already in
    KV) of decode request ``j`` (int64, shape ``(n_decode,)``). An empty batch takes 0 s.
    ``params[0]`` holds the kind code (``KIND_ANALYTIC``, ``KIND_TABLE``,
    ``KIND_UNIT_ROUND``) and the function dispatches on it.

``decode_run(params, decode_context, n_iters) -> float64``
    Total seconds of ``n_iters`` consecutive pure-decode iterations of the same requests,
    where every context grows by one token per iteration (iteration ``k`` sees
    ``decode_context + k``).

``decode_run_times(params, decode_context, n_iters, out) -> None``
    As ``decode_run`` but writes the end time of iteration ``k`` (seconds since the
    start of the run) into ``out[k]``; ``out`` is float64 of length >= ``n_iters``.

``decode_time_at(params, decode_context, ctx_sum, k) -> float64``
    Seconds of the pure-decode iteration at contexts ``decode_context + k`` given the
    contexts' float sum ``ctx_sum`` (:func:`context_sum`): iteration ``k`` of a decode run,
    or of a speculative step's draft, at O(1) unless a layer slides.

``batch_times(params, prefill_tokens, prefill_cached, prefill_offsets, decode_context,
decode_offsets, out) -> None``
    Vectorized: batch ``b`` is ``prefill_*[prefill_offsets[b]:prefill_offsets[b+1]]``
    and ``decode_context[decode_offsets[b]:decode_offsets[b+1]]`` (CSR layout); its time
    goes to ``out[b]``.

The math is in ``models/cost-model.md``; equation numbers are cited beside the code.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

# ---- kind codes (params[0]) -------------------------------------------------------
KIND_ANALYTIC = 0
KIND_TABLE = 1
KIND_UNIT_ROUND = 2

# ---- analytic layout (indices into params) ------------------------------------------
P_KIND = 0
P_LAYERS = 1            # decoder layers L
P_TP = 2                # tensor-parallel degree
P_HIDDEN = 3            # model width (elements)
P_LIN_FLOPS = 4         # dense linear FLOPs per token per layer per GPU
P_LIN_BYTES = 5         # dense linear weight bytes per layer per GPU
P_MOE_EXPERTS = 6       # experts per MoE layer (0 = dense)
P_MOE_TOPK = 7          # experts used per token
P_MOE_FLOPS = 8         # FLOPs per token per expert per layer per GPU
P_MOE_BYTES = 9         # weight bytes per expert per layer per GPU
P_HEAD_FLOPS = 10       # LM-head FLOPs per sequence per GPU
P_HEAD_BYTES = 11       # LM-head weight bytes per GPU
P_ATTN_FLOPS = 12       # attention FLOPs per (query token x key token) per layer per GPU
P_KV_BYTES = 13         # KV bytes per token per layer per GPU
P_PEAK_FLOPS = 14       # peak dense FLOP/s of one GPU at the weight dtype
P_PEAK_BW = 15          # peak HBM bytes/s of one GPU
P_EFF_COMPUTE = 16      # linear-layer compute efficiency (MFU)
P_EFF_WEIGHTS = 17      # weight-streaming bandwidth efficiency (MBU)
P_PLATEAU_TOKENS = 18   # small-batch GEMM plateau n0 (tokens)
P_EFF_ATTN = 19         # prefill-attention compute efficiency
P_ATTN_PLATEAU = 20     # prefill-attention chunk plateau (tokens)
P_EFF_KV = 21           # KV-read bandwidth efficiency
P_ATTN_SEQ_S = 22       # per decode sequence per layer attention cost (s)
P_AR_LATENCY_S = 23     # all-reduce latency per call per log2(tp) step (s)
P_AR_BW = 24            # all-reduce bus bandwidth (bytes/s)
P_ACT_BYTES = 25        # bytes per activation element (all-reduce payload)
P_LAYER_OVERHEAD_S = 26  # fixed per-layer overhead (s)
P_ITER_OVERHEAD_S = 27  # fixed per-iteration overhead (s)
P_SEQ_OVERHEAD_S = 28   # per-sequence per-iteration overhead (s)
P_ATTN_FIXED_S = 29     # fixed decode-attention cost per layer (s)
P_MULTI_PROMPT_S = 30   # per prefill token outside the largest chunk (s)
P_ATTN_CHUNK_S = 31     # prefill attention cost per chunk per layer (s)
P_ATTN_TOKEN_S = 32     # prefill attention cost per query token per layer (s)
P_AR_FIXED_S = 33       # all-reduce latency per call, independent of tp (s; tp > 1)
P_MOE_LAYERS = 34       # layers with routed experts (0 = dense model)
P_DENSE_MLP_FLOPS = 35  # MLP FLOPs per token of a non-MoE layer of an MoE model, per GPU
P_DENSE_MLP_BYTES = 36  # MLP weight bytes of such a layer, per GPU
P_MOE_SHARED_FLOPS = 37  # shared-expert and router FLOPs per token of an MoE layer, per GPU
P_MOE_SHARED_BYTES = 38  # shared-expert and router weight bytes of an MoE layer, per GPU
P_EP = 39               # expert-parallel degree (1: experts sharded like the rest; tp)
P_MOE_IMBALANCE = 40    # most-loaded GPU's routed tokens over the mean (>= 1; ep > 1)
P_A2A_FIXED_S = 41      # all-to-all (dispatch or combine) latency per call (s)
P_A2A_BW = 42           # all-to-all bytes/s one GPU sends
P_SLIDE_LAYERS = 43     # layers with sliding-window attention
P_WINDOW = 44           # sliding window (tokens)
P_DA_FLOPS = 45         # decode-attention FLOPs per (query x key token) per layer per GPU
N_ANALYTIC_PARAMS = 46

# ---- table layout -------------------------------------------------------------------
T_LAYERS = 1            # multiplier of the per-layer tables
T_ITER_OVERHEAD_S = 2
T_SEQ_OVERHEAD_S = 3
T_N_LIN = 4             # points in the linear table   (x: tokens in batch)
T_N_PREFILL_ATTN = 5    # points in the prefill table  (x: sum c*(p+c))
T_N_DECODE_ATTN = 6     # points in the decode table   (x: sum of contexts)
T_DATA = 7              # x_lin, y_lin, x_pa, y_pa, x_da, y_da follow

# ---- unit-round layout ----------------------------------------------------------------
U_MEMORY_TOKENS = 1


# =====================================================================================
# analytic model
# =====================================================================================

@njit(cache=True)
def _analytic_totals(params, n_tokens, n_seqs, attn_work, attn_kv_tokens, n_decode,
                     decode_ctx_sum, side_tokens, attn_work_w, attn_kv_w, decode_win_sum):
    """Analytic iteration time from batch totals; models/cost-model.md (1)-(8).

    ``*_w`` are the windowed sums of the sliding-window layers (keys capped at the
    window); they equal the full sums when no layer slides."""
    layers = params[P_LAYERS]
    peak_f = params[P_PEAK_FLOPS]
    peak_b = params[P_PEAK_BW]
    bw_w = peak_b * params[P_EFF_WEIGHTS]
    fl_c = peak_f * params[P_EFF_COMPUTE]
    n0 = params[P_PLATEAU_TOKENS]
    # (2)-(3) linear layers: max of weight streaming and compute with plateau
    moe_layers = params[P_MOE_LAYERS]
    w_dense = params[P_LIN_BYTES] + params[P_DENSE_MLP_BYTES]
    f_dense = params[P_LIN_FLOPS] + params[P_DENSE_MLP_FLOPS]
    t_lin = (layers - moe_layers) * max(w_dense / bw_w, f_dense * (n_tokens + n0) / fl_c)
    t_a2a = 0.0
    if moe_layers > 0.0:
        n_exp = params[P_MOE_EXPERTS]
        k = params[P_MOE_TOPK]
        touched = n_exp * (1.0 - (1.0 - k / n_exp) ** n_tokens)
        ep = params[P_EP]
        imb = params[P_MOE_IMBALANCE] if ep > 1.0 else 1.0
        w_moe = (params[P_LIN_BYTES] + params[P_MOE_SHARED_BYTES]
                 + min(n_exp, imb * touched) * params[P_MOE_BYTES])
        f_moe = ((params[P_LIN_FLOPS] + params[P_MOE_SHARED_FLOPS]) * (n_tokens + n0)
                 + imb * params[P_MOE_FLOPS] * (k * n_tokens + touched * n0))
        t_lin += moe_layers * max(w_moe / bw_w, f_moe / fl_c)
        if ep > 1.0:  # (7b) dispatch and combine of the tokens this GPU routes
            sent = (imb * n_tokens / params[P_TP] * k * (ep - 1.0) / ep
                    * params[P_HIDDEN] * params[P_ACT_BYTES])
            t_a2a = 2.0 * (params[P_A2A_FIXED_S] + sent / params[P_A2A_BW])
    # (4) LM head, once per sequence
    t_head = max(params[P_HEAD_BYTES] / bw_w, params[P_HEAD_FLOPS] * n_seqs / fl_c)
    # (5)-(6) attention: full layers see every key, sliding layers their window
    slide = params[P_SLIDE_LAYERS]
    t_attn = 0.0
    n_chunks = n_seqs - n_decode
    fl_a = peak_f * params[P_EFF_ATTN]
    bw_kv = peak_b * params[P_EFF_KV]
    if attn_work > 0.0:
        fixed = params[P_ATTN_CHUNK_S] * n_chunks + params[P_ATTN_TOKEN_S] * (n_tokens - n_decode)
        t_pa = max(params[P_ATTN_FLOPS] * attn_work / fl_a, params[P_KV_BYTES] * attn_kv_tokens / bw_kv)
        t_attn += (layers - slide) * t_pa + layers * fixed
        if slide > 0.0:
            t_attn += slide * max(params[P_ATTN_FLOPS] * attn_work_w / fl_a,
                                  params[P_KV_BYTES] * attn_kv_w / bw_kv)
    if n_decode > 0:
        fixed = params[P_ATTN_SEQ_S] * n_decode + params[P_ATTN_FIXED_S]
        t_da = max(params[P_KV_BYTES] * decode_ctx_sum / bw_kv, params[P_DA_FLOPS] * decode_ctx_sum / fl_a)
        t_attn += (layers - slide) * t_da + layers * fixed
        if slide > 0.0:
            t_attn += slide * max(params[P_KV_BYTES] * decode_win_sum / bw_kv,
                                  params[P_DA_FLOPS] * decode_win_sum / fl_a)
    # (7) tensor-parallel all-reduce: two per layer, one per MoE layer under expert parallelism
    t_comm = 0.0
    tp = params[P_TP]
    if tp > 1.0:
        payload = n_tokens * params[P_HIDDEN] * params[P_ACT_BYTES]
        t_ar = (params[P_AR_FIXED_S] + params[P_AR_LATENCY_S] * math.log2(tp)
                + 2.0 * (tp - 1.0) / tp * payload / params[P_AR_BW])
        n_ar = 2.0 * layers - (moe_layers if params[P_EP] > 1.0 else 0.0)
        t_comm = n_ar * t_ar
    t_comm += moe_layers * t_a2a
    # (8) overheads
    t_over = (layers * params[P_LAYER_OVERHEAD_S] + params[P_ITER_OVERHEAD_S]
              + params[P_SEQ_OVERHEAD_S] * n_seqs + params[P_MULTI_PROMPT_S] * side_tokens)
    return t_lin + t_attn + t_comm + t_head + t_over


# =====================================================================================
# table model
# =====================================================================================

@njit(cache=True)
def _interp(params, start, n, x):
    """Piecewise-linear table lookup; models/cost-model.md (10)."""
    if n == 0 or x <= 0.0:
        return 0.0
    xs = start
    ys = start + n
    if x <= params[xs]:
        return params[ys]
    if n == 1:
        return params[ys] * x / params[xs]
    lo = 0
    hi = n - 1
    if x >= params[xs + hi]:
        lo = n - 2
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if params[xs + mid] <= x:
                lo = mid
            else:
                hi = mid
    x0 = params[xs + lo]
    x1 = params[xs + lo + 1]
    y0 = params[ys + lo]
    y1 = params[ys + lo + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@njit(cache=True)
def _table_totals(params, n_tokens, n_seqs, attn_work, decode_ctx_sum):
    n_lin = int(params[T_N_LIN])
    n_pa = int(params[T_N_PREFILL_ATTN])
    n_da = int(params[T_N_DECODE_ATTN])
    s_lin = T_DATA
    s_pa = s_lin + 2 * n_lin
    s_da = s_pa + 2 * n_pa
    per_layer = (_interp(params, s_lin, n_lin, n_tokens)
                 + _interp(params, s_pa, n_pa, attn_work)
                 + _interp(params, s_da, n_da, decode_ctx_sum))
    return (params[T_LAYERS] * per_layer + params[T_ITER_OVERHEAD_S]
            + params[T_SEQ_OVERHEAD_S] * n_seqs)


# =====================================================================================
# public kernels
# =====================================================================================

@njit(cache=True)
def _time_from_totals(params, n_tokens, n_seqs, attn_work, attn_kv_tokens, n_decode,
                      decode_ctx_sum, side_tokens, attn_work_w, attn_kv_w, decode_win_sum):
    if n_tokens <= 0.0:
        return 0.0
    kind = int(params[0])
    if kind == KIND_UNIT_ROUND:
        return 1.0
    if kind == KIND_TABLE:
        return _table_totals(params, n_tokens, n_seqs, attn_work, decode_ctx_sum)
    return _analytic_totals(params, n_tokens, n_seqs, attn_work, attn_kv_tokens,
                            n_decode, decode_ctx_sum, side_tokens, attn_work_w, attn_kv_w,
                            decode_win_sum)


@njit(cache=True)
def _window(params):
    """The sliding window in tokens (0 when no layer slides or the model is not analytic)."""
    if int(params[0]) != KIND_ANALYTIC or params[P_SLIDE_LAYERS] <= 0.0:
        return 0.0
    return params[P_WINDOW]


@njit(cache=True)
def _windowed_sum(decode_context, window, k):
    """Sum over j of min(decode_context[j] + k, window)."""
    s = 0.0
    for j in range(decode_context.shape[0]):
        s += min(float(decode_context[j]) + k, window)
    return s


@njit(cache=True)
def iteration_time(params, prefill_tokens, prefill_cached, decode_context):
    """Seconds of one iteration; see the module docstring for shapes."""
    ctx_sum, win_sum = decode_sums(params, decode_context)
    return iteration_time_sums(params, prefill_tokens, prefill_cached,
                               decode_context.shape[0], ctx_sum, win_sum)


@njit(cache=True)
def decode_sums(params, decode_context):
    """``(ctx_sum, win_sum)`` of a decode batch: its contexts summed, and summed capped at
    the sliding window (the same as ``ctx_sum`` without one), for
    :func:`iteration_time_sums`."""
    window = _window(params)
    ctx_sum = context_sum(decode_context)
    win_sum = _windowed_sum(decode_context, window, 0.0) if window > 0.0 else ctx_sum
    return ctx_sum, win_sum


@njit(cache=True)
def iteration_time_sums(params, prefill_tokens, prefill_cached, n_decode, ctx_sum, win_sum):
    """:func:`iteration_time` with the decode batch given by its size ``n_decode`` and
    :func:`decode_sums` (the same float): callers pricing many prefill plans beside one
    decode batch sum its contexts once."""
    n_tokens = 0.0
    n_seqs = 0.0
    attn_work = 0.0
    attn_kv = 0.0
    work_w = 0.0
    kv_w = 0.0
    max_chunk = 0.0
    plateau = params[P_ATTN_PLATEAU] if int(params[0]) == KIND_ANALYTIC else 0.0
    window = _window(params)
    for i in range(prefill_tokens.shape[0]):
        c = float(prefill_tokens[i])
        if c > 0.0:
            max_chunk = max(max_chunk, c)
            p = float(prefill_cached[i])
            n_tokens += c
            n_seqs += 1.0
            attn_work += (p + c) * (c + plateau)
            attn_kv += p + c
            keys = min(p + c, window) if window > 0.0 else p + c
            work_w += keys * (c + plateau)
            kv_w += keys
    side = n_tokens - max_chunk
    n_tokens += n_decode
    n_seqs += n_decode
    return _time_from_totals(params, n_tokens, n_seqs, attn_work, attn_kv, n_decode,
                             ctx_sum, side, work_w, kv_w, win_sum)


@njit(cache=True)
def decode_time_at(params, decode_context, ctx_sum, k):
    """Seconds of one pure-decode iteration at contexts ``decode_context + k``, given
    ``ctx_sum``, the float sum of ``decode_context``: the same float as
    :func:`iteration_time` of that batch (integer contexts sum exactly), without its
    pass over the batch unless a layer slides."""
    nd = float(decode_context.shape[0])
    s = ctx_sum + k * nd
    window = _window(params)
    w = _windowed_sum(decode_context, window, float(k)) if window > 0.0 else s
    return _time_from_totals(params, nd, nd, 0.0, 0.0, decode_context.shape[0], s, 0.0, 0.0,
                             0.0, w)


@njit(cache=True)
def context_sum(decode_context):
    """The float sum of a decode batch's contexts, in order (:func:`decode_time_at`)."""
    ctx_sum = 0.0
    for j in range(decode_context.shape[0]):
        ctx_sum += float(decode_context[j])
    return ctx_sum


@njit(cache=True)
def decode_run_times(params, decode_context, n_iters, out):
    """End time (s since start) of each of ``n_iters`` decode iterations into ``out``."""
    ctx_sum = context_sum(decode_context)
    total = 0.0
    for k in range(n_iters):
        total += decode_time_at(params, decode_context, ctx_sum, k)
        out[k] = total


@njit(cache=True)
def decode_run(params, decode_context, n_iters):
    """Total seconds of ``n_iters`` pure-decode iterations, contexts growing by 1 each."""
    ctx_sum = context_sum(decode_context)
    total = 0.0
    for k in range(n_iters):
        total += decode_time_at(params, decode_context, ctx_sum, k)
    return total


@njit(cache=True)
def batch_times(params, prefill_tokens, prefill_cached, prefill_offsets, decode_context,
                decode_offsets, out):
    """Times of many batches given in CSR layout (see the module docstring)."""
    n_batches = out.shape[0]
    for b in range(n_batches):
        out[b] = iteration_time(
            params,
            prefill_tokens[prefill_offsets[b]:prefill_offsets[b + 1]],
            prefill_cached[prefill_offsets[b]:prefill_offsets[b + 1]],
            decode_context[decode_offsets[b]:decode_offsets[b + 1]],
        )


# =====================================================================================
# plain-Python twins
# =====================================================================================

def analytic_parts_ref(params, prefill_tokens, prefill_cached, decode_context):
    """Per-part seconds of the analytic model, written term by term, per kind of layer.

    Returns a dict with ``linear_compute_s``, ``linear_memory_s`` (whole model, before
    the max), ``linear_s``, ``attention_compute_s``, ``attention_memory_s``,
    ``attention_s``, ``communication_s`` (all-reduces and all-to-all),
    ``comm_latency_s`` (their fixed latencies), ``all_to_all_s``, ``overhead_s`` and
    ``time_s``. Equations: models/cost-model.md (1)-(8).
    """
    p = [float(v) for v in params]
    chunks = [(float(c), float(h)) for c, h in zip(prefill_tokens, prefill_cached) if c > 0]
    ctx = [float(c) for c in decode_context]
    n_tokens = sum(c for c, _ in chunks) + len(ctx)
    keys = ("linear_compute_s", "linear_memory_s", "linear_s", "attention_compute_s",
            "attention_memory_s", "attention_s", "communication_s", "comm_latency_s",
            "all_to_all_s", "overhead_s", "time_s")
    out = dict.fromkeys(keys, 0.0)
    if n_tokens <= 0:
        return out
    n_seqs = len(chunks) + len(ctx)
    n_layers = int(p[P_LAYERS])
    bw_w = p[P_PEAK_BW] * p[P_EFF_WEIGHTS]
    fl_c = p[P_PEAK_FLOPS] * p[P_EFF_COMPUTE]
    fl_a = p[P_PEAK_FLOPS] * p[P_EFF_ATTN]
    bw_kv = p[P_PEAK_BW] * p[P_EFF_KV]
    n0, na = p[P_PLATEAU_TOKENS], p[P_ATTN_PLATEAU]
    tp, ep = p[P_TP], p[P_EP]
    n_moe, n_slide, window = int(p[P_MOE_LAYERS]), int(p[P_SLIDE_LAYERS]), p[P_WINDOW]
    e, k = p[P_MOE_EXPERTS], p[P_MOE_TOPK]
    touched = e * (1.0 - math.pow(1.0 - k / e, n_tokens)) if n_moe else 0.0
    imb = p[P_MOE_IMBALANCE] if ep > 1 else 1.0
    ar = 0.0
    if tp > 1:
        ar = (p[P_AR_FIXED_S] + p[P_AR_LATENCY_S] * math.log2(tp)
              + 2.0 * (tp - 1.0) / tp * n_tokens * p[P_HIDDEN] * p[P_ACT_BYTES] / p[P_AR_BW])
    ar_lat = (p[P_AR_FIXED_S] + p[P_AR_LATENCY_S] * math.log2(tp)) if tp > 1 else 0.0
    a2a = a2a_lat = 0.0
    if n_moe and ep > 1:
        sent = imb * n_tokens / tp * k * (ep - 1.0) / ep * p[P_HIDDEN] * p[P_ACT_BYTES]
        a2a, a2a_lat = 2.0 * (p[P_A2A_FIXED_S] + sent / p[P_A2A_BW]), 2.0 * p[P_A2A_FIXED_S]
    # the linear and communication parts depend only on whether a layer is MoE, the
    # attention part only on whether it slides: each kind once, times its layer count
    for is_moe, count in ((False, n_layers - n_moe), (True, n_moe)):
        if is_moe:
            w = p[P_LIN_BYTES] + p[P_MOE_SHARED_BYTES] + min(e, imb * touched) * p[P_MOE_BYTES]
            f = ((p[P_LIN_FLOPS] + p[P_MOE_SHARED_FLOPS]) * (n_tokens + n0)
                 + imb * p[P_MOE_FLOPS] * (k * n_tokens + touched * n0))
        else:
            w = p[P_LIN_BYTES] + p[P_DENSE_MLP_BYTES]
            f = (p[P_LIN_FLOPS] + p[P_DENSE_MLP_FLOPS]) * (n_tokens + n0)
        out["linear_memory_s"] += count * w / bw_w
        out["linear_compute_s"] += count * f / fl_c
        out["linear_s"] += count * max(w / bw_w, f / fl_c)
        n_ar = 1 if (is_moe and ep > 1) else 2
        out["communication_s"] += count * (n_ar * ar + (a2a if is_moe else 0.0))
        out["comm_latency_s"] += count * (n_ar * ar_lat + (a2a_lat if is_moe else 0.0))
        out["all_to_all_s"] += count * (a2a if is_moe else 0.0)
    for slides, count in ((False, n_layers - n_slide), (True, n_slide)):
        if chunks:
            seen = [min(h + c, window) if slides else h + c for c, h in chunks]
            cmp_ = sum(p[P_ATTN_FLOPS] * s_ * (c + na) for s_, (c, _) in zip(seen, chunks)) / fl_a
            mem = sum(p[P_KV_BYTES] * s_ for s_ in seen) / bw_kv
            out["attention_compute_s"] += count * cmp_
            out["attention_memory_s"] += count * mem
            out["attention_s"] += count * (max(cmp_, mem) + p[P_ATTN_CHUNK_S] * len(chunks)
                                           + p[P_ATTN_TOKEN_S] * sum(c for c, _ in chunks))
        if ctx:
            seen = [min(x, window) if slides else x for x in ctx]
            mem = sum(p[P_KV_BYTES] * x for x in seen) / bw_kv
            cmp_ = sum(p[P_DA_FLOPS] * x for x in seen) / fl_a
            out["attention_compute_s"] += count * cmp_
            out["attention_memory_s"] += count * mem
            out["attention_s"] += count * (max(mem, cmp_) + p[P_ATTN_SEQ_S] * len(ctx)
                                           + p[P_ATTN_FIXED_S])
    head_mem = p[P_HEAD_BYTES] / bw_w
    head_cmp = p[P_HEAD_FLOPS] * n_seqs / fl_c
    out["linear_memory_s"] += head_mem
    out["linear_compute_s"] += head_cmp
    out["linear_s"] += max(head_mem, head_cmp)
    side = sum(c for c, _ in chunks) - max((c for c, _ in chunks), default=0.0)
    out["overhead_s"] = (n_layers * p[P_LAYER_OVERHEAD_S] + p[P_ITER_OVERHEAD_S]
                         + p[P_SEQ_OVERHEAD_S] * n_seqs + p[P_MULTI_PROMPT_S] * side)
    out["time_s"] = (out["linear_s"] + out["attention_s"] + out["communication_s"]
                     + out["overhead_s"])
    return out


def interp_ref(xs, ys, x):
    """Plain-Python interpolation of a measured profile ``ys`` over ``xs`` at ``x``: 0 for
    ``x <= 0`` (or no points), ``ys[0]`` up to ``xs[0]``, proportional to ``x`` beyond a
    single point, else piecewise linear (extrapolated past the last segment)."""
    if not xs or x <= 0:
        return 0.0
    if x <= xs[0]:
        return ys[0]
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = len(xs) - 2
    for j in range(len(xs) - 1):
        if xs[j] <= x < xs[j + 1]:
            i = j
            break
    return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])


def iteration_time_ref(params, prefill_tokens, prefill_cached, decode_context):
    """Plain-Python twin of :func:`iteration_time`."""
    kind = int(params[0])
    chunks = [(int(c), int(h)) for c, h in zip(prefill_tokens, prefill_cached) if c > 0]
    ctx = [int(c) for c in decode_context]
    n_tokens = sum(c for c, _ in chunks) + len(ctx)
    if n_tokens == 0:
        return 0.0
    if kind == KIND_UNIT_ROUND:
        return 1.0
    if kind == KIND_ANALYTIC:
        return analytic_parts_ref(params, prefill_tokens, prefill_cached, decode_context)["time_s"]
    p = [float(v) for v in params]
    n1, n2, n3 = int(p[T_N_LIN]), int(p[T_N_PREFILL_ATTN]), int(p[T_N_DECODE_ATTN])
    s = T_DATA
    x1, y1 = p[s:s + n1], p[s + n1:s + 2 * n1]
    s += 2 * n1
    x2, y2 = p[s:s + n2], p[s + n2:s + 2 * n2]
    s += 2 * n2
    x3, y3 = p[s:s + n3], p[s + n3:s + 2 * n3]
    work = sum(float(c) * (h + c) for c, h in chunks)
    per_layer = (interp_ref(x1, y1, float(n_tokens)) + interp_ref(x2, y2, work)
                 + interp_ref(x3, y3, float(sum(ctx))))
    return p[T_LAYERS] * per_layer + p[T_ITER_OVERHEAD_S] + p[T_SEQ_OVERHEAD_S] * (len(chunks) + len(ctx))


def decode_run_times_ref(params, decode_context, n_iters, out):
    """Plain-Python twin of :func:`decode_run_times`: steps every iteration explicitly."""
    ctx = [int(c) for c in decode_context]
    total = 0.0
    for k in range(n_iters):
        total += iteration_time_ref(params, [], [], [c + k for c in ctx])
        out[k] = total


def decode_run_ref(params, decode_context, n_iters):
    """Plain-Python twin of :func:`decode_run`."""
    out = np.zeros(max(int(n_iters), 0))
    decode_run_times_ref(params, decode_context, n_iters, out)
    return float(out[-1]) if n_iters > 0 else 0.0


def batch_times_ref(params, prefill_tokens, prefill_cached, prefill_offsets, decode_context,
                    decode_offsets, out):
    """Plain-Python twin of :func:`batch_times`."""
    for b in range(out.shape[0]):
        a0, a1 = prefill_offsets[b], prefill_offsets[b + 1]
        d0, d1 = decode_offsets[b], decode_offsets[b + 1]
        out[b] = iteration_time_ref(params, prefill_tokens[a0:a1], prefill_cached[a0:a1],
                                    decode_context[d0:d1])
