"""Numba kernels of the online History predictor
(:class:`lpserve.policies.predictors.History`): its buckets of recent output lengths and
their quantiles, written once and run both by the Python predictor (``observe`` and
``predict`` call these kernels) and by the compiled replica engine, which predicts each
arrival inside its arrivals kernel.

State (:func:`new_state`: a StructRef of plain arrays, which loads at once, unlike numba's
typed containers)
-----
``keys``/``vals``: an open-addressing hash table (linear probing, doubled when half full)
    from a bucket's key ``(level, prompt bucket, tenant)`` to its row; level 0 is
    ``(floor(log2(prompt_tokens)), tenant)``, level 1 the prompt bucket over all tenants
    ``(1, b, 0)``, level 2 every completion ``(2, 0, 0)``.
``arena``, ``off``, ``size``: row ``r`` is ``arena[off[r]:off[r] + size[r]]``, layout
    ``R_*`` then two segments of ``cap`` values: the bucket's newest completions in arrival
    order (a ring starting at ``R_HEAD``) and the same values sorted. ``cap`` doubles as
    the bucket fills, up to the window (the row moves to the arena's end), so memory
    follows the completions held.
``cnt``: ``(keys, rows, arena words used)``.
``ip`` (int64) parameters, layout ``IP_*``; ``fp`` (float64) ``(q_lo, q_hi)``.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.experimental import structref

from lpserve.kernels.structs import struct_type

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


#: numba type and Python proxy of the buckets (see the module's docstring)
HistoryStateType, HistoryState = struct_type("HistoryState", __name__)
STATE_T = HistoryStateType([
    ("keys", types.int64[:, ::1]), ("vals", types.int64[::1]), ("arena", types.int64[::1]),
    ("off", types.int64[::1]), ("size", types.int64[::1]), ("cnt", types.int64[::1]),
])
C_KEYS, C_ROWS, C_USED = 0, 1, 2


@njit(cache=True)
def _state(keys, vals, arena, off, size, cnt):  # pragma: no cover - numba
    s = structref.new(STATE_T)
    s.keys, s.vals, s.arena, s.off, s.size, s.cnt = keys, vals, arena, off, size, cnt
    return s


def new_state() -> HistoryState:
    """Empty buckets."""
    return _state(np.zeros((16, 3), np.int64), np.full(16, -1, np.int64),
                  np.zeros(256, np.int64), np.zeros(8, np.int64), np.zeros(8, np.int64),
                  np.zeros(3, np.int64))


@njit(cache=True)
def _slot(keys, vals, k0, k1, k2):  # pragma: no cover - numba
    """The table slot of key ``(k0, k1, k2)``, or the empty slot where it would go."""
    mask = vals.shape[0] - 1
    h = (k0 * 1000003 + k1 * 8191 + k2 * 131071 + 17) & mask
    while vals[h] >= 0 and not (keys[h, 0] == k0 and keys[h, 1] == k1 and keys[h, 2] == k2):
        h = (h + 1) & mask
    return h


@njit(cache=True)
def _find(st, k0, k1, k2):  # pragma: no cover - numba
    """Row of bucket ``(k0, k1, k2)``, or -1."""
    return st.vals[_slot(st.keys, st.vals, k0, k1, k2)]


@njit(cache=True)
def _reserve(st, words):  # pragma: no cover - numba
    """Offset of ``words`` fresh arena words (the arena doubles when full)."""
    used = st.cnt[C_USED]
    if used + words > st.arena.shape[0]:
        arena = np.zeros(2 * (used + words), np.int64)
        arena[:used] = st.arena[:used]
        st.arena = arena
    st.cnt[C_USED] = used + words
    return used


@njit(cache=True)
def _new_row(st, k0, k1, k2, cap):  # pragma: no cover - numba
    """Add bucket ``(k0, k1, k2)`` with room for ``cap`` values; returns its row."""
    if 2 * (st.cnt[C_KEYS] + 1) > st.vals.shape[0]:  # rehash into a table twice as big
        n = 2 * st.vals.shape[0]
        keys = np.zeros((n, 3), np.int64)
        vals = np.full(n, -1, np.int64)
        for h in range(st.vals.shape[0]):
            if st.vals[h] >= 0:
                j = _slot(keys, vals, st.keys[h, 0], st.keys[h, 1], st.keys[h, 2])
                keys[j] = st.keys[h]
                vals[j] = st.vals[h]
        st.keys, st.vals = keys, vals
    r = st.cnt[C_ROWS]
    if r == st.off.shape[0]:
        off = np.zeros(2 * r, np.int64)
        size = np.zeros(2 * r, np.int64)
        off[:r], size[:r] = st.off, st.size
        st.off, st.size = off, size
    words = R_HDR + 2 * cap
    st.off[r] = _reserve(st, words)
    st.size[r] = words
    h = _slot(st.keys, st.vals, k0, k1, k2)
    st.keys[h, 0], st.keys[h, 1], st.keys[h, 2] = k0, k1, k2
    st.vals[h] = r
    st.cnt[C_KEYS] += 1
    st.cnt[C_ROWS] = r + 1
    return r


@njit(cache=True)
def _row(st, r):  # pragma: no cover - numba
    """Row ``r`` as a view of the arena."""
    o = st.off[r]
    return st.arena[o:o + st.size[r]]


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
def _grow(st, r, window):  # pragma: no cover - numba
    """Row ``r`` moved to the arena's end with twice its room (at most ``window``), its
    ring unrolled from 0; returns the new view."""
    cap = (st.size[r] - R_HDR) // 2
    new_cap = min(2 * cap, window)
    o = _reserve(st, R_HDR + 2 * new_cap)
    a = _row(st, r)  # after _reserve: the arena may have moved
    b = st.arena[o:o + R_HDR + 2 * new_cap]
    b[:R_HDR] = a[:R_HDR]
    cnt, head = a[R_COUNT], a[R_HEAD]
    for k in range(cnt):
        b[R_HDR + k] = a[R_HDR + (head + k) % cap]
        b[R_HDR + new_cap + k] = a[R_HDR + cap + k]
    b[R_HEAD] = 0
    st.off[r], st.size[r] = o, R_HDR + 2 * new_cap
    return b


@njit(cache=True)
def _add(st, window, k0, k1, k2, x):  # pragma: no cover - numba
    """Completion of ``x`` tokens joins bucket ``(k0, k1, k2)``; the oldest leaves a full
    window."""
    r = _find(st, k0, k1, k2)
    if r < 0:
        r = _new_row(st, k0, k1, k2, min(FIRST_CAP, window))
    a = _row(st, r)
    cap = (a.shape[0] - R_HDR) // 2
    cnt = a[R_COUNT]
    if cnt == cap and cap < window:
        a = _grow(st, r, window)
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
def observe_one(st, ip, prompt, tenant, x):  # pragma: no cover - numba
    """A completed request (prompt and output tokens, tenant) joins its three buckets."""
    b = _bucket(prompt)
    w = ip[IP_WINDOW]
    _add(st, w, np.int64(0), b, np.int64(tenant), x)
    _add(st, w, np.int64(1), b, np.int64(0), x)
    _add(st, w, np.int64(2), np.int64(0), np.int64(0), x)


@njit(cache=True)
def observe(st, ip, prompts, tenants, outs):  # pragma: no cover - numba
    """:func:`observe_one` for each completion in order (arrays ``(n,)`` int64)."""
    for k in range(prompts.shape[0]):
        observe_one(st, ip, prompts[k], tenants[k], outs[k])


@njit(cache=True)
def _lookup(st, ip, fp, k0, k1, k2):  # pragma: no cover - numba
    """``(lo, hi, point)`` of bucket ``(k0, k1, k2)``, or ``lo == 0`` when it has too few."""
    r = _find(st, k0, k1, k2)
    if r < 0:
        return np.int64(0), np.int64(0), np.int64(0)
    a = _row(st, r)
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
def predict_one(st, ip, fp, prompt, tenant):  # pragma: no cover - numba
    """``(lo, hi, point)`` tokens: the ``(q_lo, q_hi)`` quantiles (floor, ceiling) and the
    median (rounded half to even) of the most specific bucket with ``min_samples``
    completions (prompt bucket and tenant, then prompt bucket, then all), else the prior."""
    b = _bucket(prompt)
    lo, hi, pt = _lookup(st, ip, fp, np.int64(0), b, np.int64(tenant))
    if lo == 0:
        lo, hi, pt = _lookup(st, ip, fp, np.int64(1), b, np.int64(0))
    if lo == 0:
        lo, hi, pt = _lookup(st, ip, fp, np.int64(2), np.int64(0), np.int64(0))
    if lo == 0:
        return ip[IP_PRIOR_LO], ip[IP_PRIOR_HI], ip[IP_PRIOR_PT]
    return lo, hi, pt


@njit(cache=True)
def predict(st, ip, fp, prompts, tenants, lo, hi, pt):  # pragma: no cover - numba
    """:func:`predict_one` for each request into ``lo``, ``hi``, ``pt`` (int64 ``(n,)``)."""
    for k in range(prompts.shape[0]):
        lo[k], hi[k], pt[k] = predict_one(st, ip, fp, prompts[k], tenants[k])


@njit(cache=True)
def to_arrays(st):  # pragma: no cover - numba
    """The state's arrays ``(keys, vals, arena, off, size, cnt)`` (for pickling)."""
    return st.keys, st.vals, st.arena, st.off, st.size, st.cnt


def from_arrays(keys, vals, arena, off, size, cnt) -> HistoryState:
    """The state :func:`to_arrays` gave."""
    return _state(*(np.ascontiguousarray(a, np.int64) for a in
                    (keys, vals, arena, off, size, cnt)))
