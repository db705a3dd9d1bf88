"""Numba kernels of the online History predictor
(:class:`lpserve.policies.predictors.History`): its buckets of recent output lengths and
their quantiles, written once and run both by the Python predictor (``observe`` and
``predict`` call these kernels) and by the compiled replica engine, which predicts each
arrival inside its arrivals kernel.

State
-----
``index``: typed Dict ``(level, prompt bucket, tenant) -> row``; level 0 is
    ``(floor(log2(prompt_tokens)), tenant)``, level 1 the prompt bucket over all tenants
    ``(1, b, 0)``, level 2 every completion ``(2, 0, 0)``.
``rows``: typed List of int64 arrays, one per bucket seen, layout ``R_*`` then two
    segments of ``cap`` values: the bucket's newest completions in arrival order (a ring
    starting at ``R_HEAD``) and the same values sorted. ``cap`` doubles as the bucket
    fills, up to the window, so memory follows the completions held.
``ip`` (int64) parameters, layout ``IP_*``; ``fp`` (float64) ``(q_lo, q_hi)``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.typed import Dict, List

__all__ = ["IP_MIN_SAMPLES", "IP_PRIOR_HI", "IP_PRIOR_LO", "IP_PRIOR_PT", "IP_WINDOW",
           "N_IP", "from_arrays", "new_state", "observe", "observe_one", "predict",
           "predict_one", "quantile_sorted", "to_arrays"]

IP_MIN_SAMPLES = 0   # completions a bucket needs before it predicts
IP_WINDOW = 1        # newest completions kept per bucket
IP_PRIOR_LO = 2      # the prior interval and point (tokens), before any bucket has enough
IP_PRIOR_HI = 3
IP_PRIOR_PT = 4
N_IP = 5

R_COUNT = 0          # completions held (<= window)
R_HEAD = 1           # ring position of the oldest
R_LO = 2             # cached (lo, hi, point) of the bucket ...
R_HI = 3
R_PT = 4
R_VALID = 5          # ... valid until its next completion (1) or stale (0)
R_HDR = 6
FIRST_CAP = 8        # values a new bucket has room for

KEY_T = types.UniTuple(types.int64, 3)


@njit(cache=True)
def new_state():  # pragma: no cover - numba
    """An empty ``(index, rows)``."""
    index = Dict.empty(key_type=KEY_T, value_type=types.int64)
    rows = List.empty_list(types.int64[::1])
    return index, rows


@njit(cache=True)
def quantile_sorted(srt, m, q):  # pragma: no cover - numba
    """``numpy.quantile(srt[:m], q)`` (its default linear method, the same floating-point
    steps) of the ascending ``srt[:m]``, ``m >= 1``, in O(1)."""
    h = q * (m - 1)
    j = int(math.floor(h))
    a = float(srt[j])
    if j + 1 >= m:
        return a
    b = float(srt[j + 1])
    g = h - j
    d = b - a
    return b - d * (1.0 - g) if g >= 0.5 else a + d * g


@njit(cache=True)
def _bucket(prompt):  # pragma: no cover - numba
    return np.int64(math.floor(math.log2(max(prompt, 1))))


@njit(cache=True)
def _grow(a, window):  # pragma: no cover - numba
    """Row ``a`` with twice its room (at most ``window``), its ring unrolled from 0."""
    cap = (a.shape[0] - R_HDR) // 2
    new_cap = min(2 * cap, window)
    b = np.zeros(R_HDR + 2 * new_cap, np.int64)
    b[:R_HDR] = a[:R_HDR]
    cnt, head = a[R_COUNT], a[R_HEAD]
    for k in range(cnt):
        b[R_HDR + k] = a[R_HDR + (head + k) % cap]
        b[R_HDR + new_cap + k] = a[R_HDR + cap + k]
    b[R_HEAD] = 0
    return b


@njit(cache=True)
def _add(index, rows, window, key, x):  # pragma: no cover - numba
    """Completion of ``x`` tokens joins bucket ``key``; the oldest leaves a full window."""
    if key in index:
        r = index[key]
    else:
        r = len(rows)
        rows.append(np.zeros(R_HDR + 2 * min(FIRST_CAP, window), np.int64))
        index[key] = r
    a = rows[r]
    cap = (a.shape[0] - R_HDR) // 2
    cnt = a[R_COUNT]
    if cnt == cap and cap < window:
        a = _grow(a, window)
        rows[r] = a
        cap = (a.shape[0] - R_HDR) // 2
    ring, srt = R_HDR, R_HDR + cap
    if cnt == cap:  # a full window: the oldest leaves the ring and the sorted copy
        head = a[R_HEAD]
        old = a[ring + head]
        a[ring + head] = x
        a[R_HEAD] = (head + 1) % cap
        j = 0
        while a[srt + j] != old:
            j += 1
        for k in range(j, cnt - 1):
            a[srt + k] = a[srt + k + 1]
        cnt -= 1
    else:
        a[ring + (a[R_HEAD] + cnt) % cap] = x
    j = cnt  # insert x after the values <= x
    while j > 0 and a[srt + j - 1] > x:
        a[srt + j] = a[srt + j - 1]
        j -= 1
    a[srt + j] = x
    a[R_COUNT] = cnt + 1
    a[R_VALID] = 0


@njit(cache=True)
def observe_one(index, rows, ip, prompt, tenant, x):  # pragma: no cover - numba
    """A completed request (prompt and output tokens, tenant) joins its three buckets."""
    b = _bucket(prompt)
    w = ip[IP_WINDOW]
    _add(index, rows, w, (np.int64(0), b, np.int64(tenant)), x)
    _add(index, rows, w, (np.int64(1), b, np.int64(0)), x)
    _add(index, rows, w, (np.int64(2), np.int64(0), np.int64(0)), x)


@njit(cache=True)
def observe(index, rows, ip, prompts, tenants, outs):  # pragma: no cover - numba
    """:func:`observe_one` for each completion in order (arrays ``(n,)`` int64)."""
    for k in range(prompts.shape[0]):
        observe_one(index, rows, ip, prompts[k], tenants[k], outs[k])


@njit(cache=True)
def _lookup(index, rows, ip, fp, key):  # pragma: no cover - numba
    """``(lo, hi, point)`` of bucket ``key``, or ``lo == 0`` when it has too few."""
    if key not in index:
        return np.int64(0), np.int64(0), np.int64(0)
    a = rows[index[key]]
    cnt = a[R_COUNT]
    if cnt < ip[IP_MIN_SAMPLES]:
        return np.int64(0), np.int64(0), np.int64(0)
    if a[R_VALID] == 0:
        srt = a[R_HDR + (a.shape[0] - R_HDR) // 2:]
        a[R_LO] = max(1, int(math.floor(quantile_sorted(srt, cnt, fp[0]))))
        a[R_HI] = max(1, int(math.ceil(quantile_sorted(srt, cnt, fp[1]))))
        a[R_PT] = max(1, int(np.rint(quantile_sorted(srt, cnt, 0.5))))
        a[R_VALID] = 1
    return a[R_LO], a[R_HI], a[R_PT]


@njit(cache=True)
def predict_one(index, rows, ip, fp, prompt, tenant):  # pragma: no cover - numba
    """``(lo, hi, point)`` tokens: the ``(q_lo, q_hi)`` quantiles (floor, ceiling) and the
    median (rounded half to even) of the most specific bucket with ``min_samples``
    completions (prompt bucket and tenant, then prompt bucket, then all), else the prior."""
    b = _bucket(prompt)
    lo, hi, pt = _lookup(index, rows, ip, fp, (np.int64(0), b, np.int64(tenant)))
    if lo == 0:
        lo, hi, pt = _lookup(index, rows, ip, fp, (np.int64(1), b, np.int64(0)))
    if lo == 0:
        lo, hi, pt = _lookup(index, rows, ip, fp, (np.int64(2), np.int64(0), np.int64(0)))
    if lo == 0:
        return ip[IP_PRIOR_LO], ip[IP_PRIOR_HI], ip[IP_PRIOR_PT]
    return lo, hi, pt


@njit(cache=True)
def predict(index, rows, ip, fp, prompts, tenants, lo, hi, pt):  # pragma: no cover - numba
    """:func:`predict_one` for each request into ``lo``, ``hi``, ``pt`` (int64 ``(n,)``)."""
    for k in range(prompts.shape[0]):
        lo[k], hi[k], pt[k] = predict_one(index, rows, ip, fp, prompts[k], tenants[k])


@njit(cache=True)
def to_arrays(index, rows):  # pragma: no cover - numba
    """``(keys, rows_of_keys, flat, offsets)``: the state as plain arrays (for pickling):
    ``keys`` int64 ``(k, 3)``, ``rows_of_keys`` ``(k,)``, row ``r`` is
    ``flat[offsets[r]:offsets[r + 1]]``."""
    keys = np.zeros((len(index), 3), np.int64)
    which = np.zeros(len(index), np.int64)
    k = 0
    for key, r in index.items():
        keys[k, 0], keys[k, 1], keys[k, 2] = key
        which[k] = r
        k += 1
    offsets = np.zeros(len(rows) + 1, np.int64)
    for r in range(len(rows)):
        offsets[r + 1] = offsets[r] + rows[r].shape[0]
    flat = np.zeros(offsets[-1], np.int64)
    for r in range(len(rows)):
        flat[offsets[r]:offsets[r + 1]] = rows[r]
    return keys, which, flat, offsets


@njit(cache=True)
def from_arrays(keys, which, flat, offsets):  # pragma: no cover - numba
    """The ``(index, rows)`` that :func:`to_arrays` wrote."""
    index, rows = new_state()
    for r in range(offsets.shape[0] - 1):
        rows.append(flat[offsets[r]:offsets[r + 1]].copy())
    for k in range(keys.shape[0]):
        index[(keys[k, 0], keys[k, 1], keys[k, 2])] = which[k]
    return index, rows
