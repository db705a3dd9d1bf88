"""Eviction keys of the session-aware KV evictors' groups (``models/kv-sessions.md``), shared
by their replay (:mod:`lpserve.policies._group_kernels`), their simulator adapters
(:mod:`lpserve.policies.evictors_sessions`) and the compiled replica's pool, which orders its
evictable groups with them (:mod:`lpserve.sim._session_evict`).

A group is the evictable blocks whose last touch was one request (or several of one thread
released at the same time): class ``c`` (why the client waits after it: unknown, tool
call, user turn, ``Trace.wait_kind + 1``), touch time ``t_g``; the group of smallest key
``(primary, secondary)`` loses its deepest block first.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

MODE_GLRU, MODE_TTL, MODE_DECAY, MODE_TAIL, MODE_INDEX = 0, 1, 2, 3, 4
MODE_NAMES = ("group-lru", "ttl-pin", "reuse-decay", "tail-lru", "return-knapsack")
N_CLASSES = 3  # Trace.wait_kind + 1: unknown, tool call, user turn
#: ``params`` of :func:`lpserve.policies._group_kernels.group_replay`: the longest wait that counts as a return (s), fits
#: refreshed every this many ended waits, reuse horizon (s), tail threshold (tokens),
#: weight of the newest gap in a thread's moving average, fixed TTL (s; < 0: learn),
#: fewest ended waits before a class uses its own fit, tokens per block
#: the ttl-pin duel's level alpha (0: no duel), the duel's start (eq. (4b)): the leader
#: (1: ttl-pin) and the evidence D, V against it carried over from other traffic, and the
#: scale of its boundary in capacities (y = (scale * capacity) ** 2)
(P_AMAX, P_REFIT, P_HORIZON, P_XI, P_ALPHA, P_TTL, P_MIN_N, P_BLOCK, P_DUEL, P_LEAD0, P_D0,
 P_V0, P_DSCALE) = range(13)
N_PARAMS = 13
#: ages (s) at which keys are re-evaluated; bin ``b`` is ``[AGE_EDGES_S[b], [b+1])``
AGE_EDGES_S = np.array([0.0, 2, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 90, 120, 180,
                        240, 360, 480, 720, 900, 1200, 1800, 2700, 3600])
#: candidate TTLs (s) of the ttl-pin fit
TTL_GRID_S = np.array([0.0, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1200, 1800,
                       3600])
PRIOR_GAP_S = 60.0  # prior mean return gap of the reuse-decay fit (one pseudo-return)


# ===================================================================================== keys
@njit(cache=True)
def decay_score(NE, c, age, horizon, min_n):  # pragma: no cover
    """Eq. (5): probability of a reuse within ``horizon`` s for a group of class ``c`` idle
    for ``age`` s, under an exponential reuse time (rate from the class's returns, plus a
    pseudo-return of ``PRIOR_GAP_S``) reached with the class's return share; a class with
    fewer than ``min_n`` ended waits uses the pooled statistics."""
    n, k, s = NE[c, 0], NE[c, 1], NE[c, 2]
    if n < min_n:
        n, k, s = NE[:, 0].sum(), NE[:, 1].sum(), NE[:, 2].sum()
    p = (k + 1.0) / (n + 2.0)
    theta = (k + 1.0) / (s + PRIOR_GAP_S)
    e = math.exp(-theta * age)
    return p * e * (1.0 - math.exp(-theta * horizon)) / (1.0 - p + p * e)


@njit(cache=True)
def predicted_gap(NE, tg, th, c):  # pragma: no cover - numba
    """Predicted time (s) until thread ``th`` returns after a wait of class ``c``: the
    moving average ``tg[th, c]`` of its own gaps after such waits, else the class's mean
    return gap (pooled over classes before the class has returns), else ``PRIOR_GAP_S``."""
    if th >= 0 and tg[th, c] > 0:
        return tg[th, c]
    if NE[c, 1] > 0:
        return NE[c, 2] / NE[c, 1]
    k = NE[:, 1].sum()
    return NE[:, 2].sum() / k if k > 0 else PRIOR_GAP_S


@njit(cache=True)
def group_key(mode, c, t_g, now, expiry, top_depth, need, value, NE, pi, mu, edges,
              params):  # pragma: no cover - numba
    """``(primary, secondary, next re-key time)`` at ``now`` of a group touched at ``t_g``
    (smallest key goes first); the next time is after ``now``, ``inf`` when the key no
    longer changes. Ages are compared as absolute times, so the next time is never
    ``now`` itself."""
    inf = np.inf
    if mode == MODE_GLRU:
        return 0.0, t_g, inf
    if mode == MODE_TAIL:
        return (0.0 if top_depth >= need else 1.0), t_g, inf
    if mode == MODE_TTL:
        if now < expiry:  # pinned: ``value`` is the predicted return time
            return 1.0, -value, expiry
        return 0.0, t_g, inf
    B = edges.shape[0] - 1
    b = 0
    while b + 1 < B and t_g + edges[b + 1] <= now:
        b += 1
    nxt = t_g + edges[b + 1] if b + 1 < B else inf
    if mode == MODE_DECAY:
        return decay_score(NE, c, edges[b], params[P_HORIZON], params[P_MIN_N]), t_g, nxt
    if NE[:, 0].sum() < params[P_MIN_N]:  # return-knapsack before any data: LRU order
        return 0.0, t_g, nxt
    idx = value * pi[c, b] / mu[c, b]
    if b + 1 < B and pi[c, b + 1] / mu[c, b + 1] > pi[c, b] / mu[c, b]:
        return idx, -t_g, nxt  # the index still rises with age: the younger group goes first
    return idx, t_g, nxt


# ===================================================================================== the pool's arrays
#: ``sv_f`` (float64) of a compiled replica's pool whose evictor is a session-aware one
#: (:mod:`lpserve.sim._session_evict`): its mode, whether it pins (1; 0: a duel's LRU
#: leads), the fitted TTL per class from ``SV_TAU``, then its ``params`` from ``SV_PAR``
SV_MODE, SV_PINS, SV_TAU = 0, 1, 2
SV_PAR = SV_TAU + N_CLASSES
SV_LEN = SV_PAR + N_PARAMS
#: columns of ``sv_info`` (float64, one row per thread id of ``sv_tid``, sorted): the
#: thread's latest finish (s), its pin's expiry (s), its predicted return (s) and the
#: blocks its next turn needs (tail-lru); NaN finish: none yet
I_FINISH, I_EXPIRY, I_RETURN, I_NEED = range(4)
N_INFO = 4


@njit(cache=True)
def pool_group_key(sv_f, NE, pi, mu, info, tid, c, t_g, thread, now, value):
    """``(primary, secondary, need)`` at ``now`` of a group of evictable blocks (class
    ``c``, released at ``t_g`` by ``thread``, -1 none; ``value``: its mean recompute value)
    as :meth:`lpserve.policies.evictors_sessions.SessionEvictor.evict` keys it: the pin's
    expiry, the predicted return and the tail depth of the thread's latest finish when
    that finish released the group, else the class's (TTL after ``t_g``, its mean return
    gap, no tail); no pin while the duel's LRU leads."""
    mode = int(sv_f[SV_MODE])
    expiry = t_g + sv_f[SV_TAU + c]
    ret = t_g + predicted_gap(NE, NE[:1, :], -1, c)
    need = 0
    if thread >= 0:
        r = np.searchsorted(tid, thread)
        if r < tid.shape[0] and tid[r] == thread and info[r, I_FINISH] == t_g:
            expiry, ret, need = info[r, I_EXPIRY], info[r, I_RETURN], int(info[r, I_NEED])
    if sv_f[SV_PINS] == 0.0:
        expiry = t_g
    prim, sec, _ = group_key(mode, c, t_g, now, expiry, 0, 0,
                             ret if mode == MODE_TTL else value, NE, pi, mu, AGE_EDGES_S,
                             sv_f[SV_PAR:])
    return prim, sec, need
