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

from lpserve.kernels.heap import heap_pop, heap_push

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


# ===================================================================================== fits
@njit(cache=True)
def record_wait(H, O, R, X, NE, c, gap, w, amax, edges, ttl_grid):  # pragma: no cover
    """Add one ended wait of class ``c`` to the statistics: a return after ``gap`` s (a
    gap above ``amax`` is no return) of a group of ``w`` blocks. ``H``/``O`` (K, J):
    block-hits and block-seconds of each TTL; ``R``/``X`` (K, B): returns and waits at risk
    per age bin; ``NE`` (K, 3): ended waits, returns, sum of return gaps."""
    back = gap <= amax
    for j in range(ttl_grid.shape[0]):
        tau = ttl_grid[j]
        if back and gap <= tau:
            H[c, j] += w
            O[c, j] += w * gap
        else:
            O[c, j] += w * tau
    B = edges.shape[0] - 1
    for b in range(B):
        if back and gap < edges[b]:
            break
        X[c, b] += 1.0
        if back and gap < edges[b + 1]:
            R[c, b] += 1.0
            break
    NE[c, 0] += 1.0
    if back:
        NE[c, 1] += 1.0
        NE[c, 2] += gap


@njit(cache=True)
def fit_ttl(H, O, min_n, NE, ttl_grid):  # pragma: no cover - numba
    """TTL (s) and hit density (block-hits per pinned block-second) per class, eq. (3):
    each class's TTL is the one of ``ttl_grid`` whose pins paid best so far, the largest
    ``H / O`` (0 for a class with fewer than ``min_n`` ended waits). Returns ``(tau (K,),
    density (K,))``."""
    K, J = H.shape
    tau = np.zeros(K)
    dens = np.zeros(K)
    for c in range(K):
        if NE[c, 0] < min_n:
            continue
        for j in range(J):
            if O[c, j] > 0 and H[c, j] / O[c, j] > dens[c]:
                dens[c] = H[c, j] / O[c, j]
                tau[c] = ttl_grid[j]
    return tau, dens


@njit(cache=True)
def fit_return(R, X, NE, edges, amax, min_n):  # pragma: no cover
    """Per class and age bin (K, B): the probability ``pi`` that a waiting group returns
    and the mean time ``mu`` (s) to that return, from the at-risk counts (discrete
    hazard per bin, eqs. (7)); a class with fewer than ``min_n`` ended waits uses the
    pooled counts of all classes."""
    K, B = R.shape
    pi = np.zeros((K, B))
    mu = np.ones((K, B))
    Rp = R.sum(axis=0)
    Xp = X.sum(axis=0)
    for c in range(K):
        own = NE[c, 0] >= min_n
        for b in range(B):
            surv = 1.0
            p = 0.0
            m = 0.0
            for j in range(b, B):
                r_ = R[c, j] if own else Rp[j]
                x_ = X[c, j] if own else Xp[j]
                h = r_ / x_ if x_ > 0 else 0.0
                q = surv * h
                hi = edges[j + 1] if j + 1 < B else amax
                p += q
                m += q * (0.5 * (edges[j] + hi) - edges[b])
                surv *= 1.0 - h
            pi[c, b] = p
            mu[c, b] = max(m / p, 1.0) if p > 0 else 1e9
    return pi, mu


@njit(cache=True)
def update_gap(tg, th, c, gap, amax, alpha):  # pragma: no cover - numba
    """Fold a return after ``gap`` s into thread ``th``'s moving average for class ``c``
    (weight ``alpha`` on the newest; a gap above ``amax`` is no return and is skipped)."""
    if th >= 0 and gap <= amax:
        tg[th, c] = gap if tg[th, c] <= 0 else alpha * gap + (1.0 - alpha) * tg[th, c]



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


# ===================================================================================== learning
#: ``sv_f`` (float64) of a session-aware evictor's learned state (shared with a compiled
#: replica's pool, :mod:`lpserve.sim._session_evict`): its mode, the fitted TTL per class
#: from ``SV_TAU``, its ``params`` from
#: ``SV_PAR``, then the summed and counted growth of a thread's prompt over its previous
#: context (tail-lru's ``q``), the ended waits since the last fit, the timeout heap's size,
#: whether a fit was made, and a stamp counting the changes to what :func:`pool_group_key`
#: reads (a pool keeps a group's key while the stamp and the key's validity time hold),
#: and whether ttl-pin's duel (:func:`duels`) has started (``SV_ASK``: its shadow caches,
#: which only the Python object keeps, have taken a finished request, so the compiled
#: pools ask that object from then on)
SV_MODE, SV_TAU = 0, 1
SV_PAR = SV_TAU + N_CLASSES
SV_Q_SUM, SV_Q_N, SV_NEW, SV_HEAP, SV_FITTED, SV_STAMP, SV_ASK = range(
    SV_PAR + N_PARAMS, SV_PAR + N_PARAMS + 7)
SV_LEN = SV_ASK + 1
#: columns of ``sv_th`` (float64, one row per thread): its pending wait (the finish that
#: started it, NaN: none; its class, prompt blocks and context tokens), its moving average
#: gap per class (``TH_TG + c``), and its latest finish (s), that finish's pin expiry (s),
#: predicted return (s) and the blocks its next turn needs (tail-lru)
TH_T0, TH_C, TH_W, TH_CTX = range(4)
TH_TG = 4
TH_FINISH, TH_EXPIRY, TH_RETURN, TH_NEED = range(TH_TG + N_CLASSES, TH_TG + N_CLASSES + 4)
TH_LEN = TH_NEED + 1


@njit(cache=True)
def duels(sv_f):
    """Whether the evictor of learned state ``sv_f`` is ttl-pin with its duel (a
    positive duel level ``P_DUEL``, ``models/kv-sessions.md`` (4b))."""
    return int(sv_f[SV_MODE]) == MODE_TTL and sv_f[SV_PAR + P_DUEL] > 0.0


@njit(cache=True)
def refit(sv_f, HO, RX, NE, pm):
    """Fit the TTLs (or keep the fixed one) and the return probabilities and mean times
    from the ended waits: ``sv_f``'s TTLs, ``pm`` (2, K, B) = (pi, mu)."""
    p = sv_f[SV_PAR:SV_PAR + N_PARAMS]
    if p[P_TTL] >= 0:
        sv_f[SV_TAU:SV_PAR] = p[P_TTL]
    else:
        sv_f[SV_TAU:SV_PAR] = fit_ttl(HO[0], HO[1], p[P_MIN_N], NE, TTL_GRID_S)[0]
    pi, mu = fit_return(RX[0], RX[1], NE, AGE_EDGES_S, p[P_AMAX], p[P_MIN_N])
    pm[0], pm[1] = pi, mu
    sv_f[SV_NEW] = 0.0
    sv_f[SV_FITTED] = 1.0
    sv_f[SV_STAMP] += 1.0


@njit(cache=True)
def _end_wait(sv_f, HO, RX, NE, th_f, r, gap, prompt):
    """Thread row ``r``'s pending wait ends after ``gap`` s (inf: no return); ``prompt``:
    the returning request's prompt tokens (-1: the wait ended otherwise)."""
    p = sv_f[SV_PAR:SV_PAR + N_PARAMS]
    c, w, ctx = int(th_f[r, TH_C]), th_f[r, TH_W], th_f[r, TH_CTX]
    th_f[r, TH_T0] = np.nan
    record_wait(HO[0], HO[1], RX[0], RX[1], NE, c, gap, w, p[P_AMAX], AGE_EDGES_S,
                TTL_GRID_S)
    if gap <= p[P_AMAX]:
        tg = th_f[r, TH_TG + c]
        th_f[r, TH_TG + c] = gap if tg <= 0 else p[P_ALPHA] * gap + (1.0 - p[P_ALPHA]) * tg
    if prompt >= 0 and prompt >= ctx:
        sv_f[SV_Q_SUM] += prompt - ctx
        sv_f[SV_Q_N] += 1.0
    sv_f[SV_NEW] += 1.0
    sv_f[SV_STAMP] += 1.0


@njit(cache=True)
def learn(sv_f, HO, RX, NE, pm, th_f, hf, hi, finish, now, thread, r, wait_kind, prompt,
          context, block_tokens):
    """What a session-aware evictor learns from a request's arrival (``finish`` False) or
    finish at ``now`` (s), ``models/kv-sessions.md`` section 1: first the waits that
    reached ``amax`` without a return end (the timeout heap ``hf``/``hi``: finish time,
    0, thread id, row); then a finish starts its thread's wait (class ``wait_kind + 1``,
    its prompt blocks, its ``context`` tokens) and records the thread's pin expiry,
    predicted return and tail need; an arrival of a waiting thread ends its wait (a
    return). ``thread`` -1: no thread (nothing else is learned, no refit). ``r``: the
    thread's row of ``th_f``. Returns whether a refit is due (every ``refit`` ended
    waits, checked after an event with a thread): the caller calls :func:`refit`. Arrays
    as :func:`refit`, :data:`SV_LEN`, :data:`TH_LEN`; the heap must hold one more entry."""
    p = sv_f[SV_PAR:SV_PAR + N_PARAMS]
    amax = p[P_AMAX]
    m = int(sv_f[SV_HEAP])
    while m > 0 and hf[0, 0] + amax < now:
        t0, r0 = hf[0, 0], hi[1, 0]
        m = heap_pop(hf[0], hf[1], hi[0], hi[1], m)
        if th_f[r0, TH_T0] == t0:
            _end_wait(sv_f, HO, RX, NE, th_f, r0, np.inf, -1)
    sv_f[SV_HEAP] = m
    if thread < 0:
        return False
    pending = not np.isnan(th_f[r, TH_T0])
    if not finish:
        if pending:
            _end_wait(sv_f, HO, RX, NE, th_f, r, now - th_f[r, TH_T0], prompt)
    else:
        c, bt = wait_kind + 1, max(block_tokens, 1)
        if pending:  # a second finish before a return: the first wait ends
            _end_wait(sv_f, HO, RX, NE, th_f, r, now - th_f[r, TH_T0], -1)
        th_f[r, TH_T0], th_f[r, TH_C], th_f[r, TH_W], th_f[r, TH_CTX] = \
            now, c, prompt // bt, context
        sv_f[SV_HEAP] = heap_push(hf[0], hf[1], hi[0], hi[1], m, now, 0.0, thread, r)
        q_hat = sv_f[SV_Q_SUM] / sv_f[SV_Q_N] if sv_f[SV_Q_N] else 0.0
        need = math.ceil(max(0.0, context + q_hat - p[P_XI]) / bt)
        th_f[r, TH_FINISH], th_f[r, TH_EXPIRY] = now, now + sv_f[SV_TAU + c]
        th_f[r, TH_RETURN] = now + predicted_gap(NE, th_f[:, TH_TG:TH_TG + N_CLASSES], r, c)
        th_f[r, TH_NEED] = need
        sv_f[SV_STAMP] += 1.0
    return sv_f[SV_NEW] >= p[P_REFIT]


@njit(cache=True)
def pool_group_key(sv_f, NE, pm, th_f, tid, c, t_g, thread, now, value):
    """``(primary, secondary, need, until)`` at ``now`` of a group of evictable blocks (class
    ``c``, released at ``t_g`` by ``thread``, -1 none; ``value``: its mean recompute value)
    as :meth:`lpserve.policies.evictors_sessions.SessionEvictor.evict` keys it: the pin's
    expiry, the predicted return and the tail depth of the thread's latest finish when
    that finish released the group, else the class's (TTL after ``t_g``, its mean return
    gap, no tail). A pin holds until its expiry, except under ttl-pin's duel, whose
    replicas pin only once their duel has made ttl-pin its leader (the pools key groups
    only before the duel starts, ``SV_ASK``: no pins then). ``tid``: the thread id of each
    row of ``th_f``, sorted. The key holds until ``until`` (s; after ``now``, inf: for
    good) unless ``sv_f[SV_STAMP]`` changes."""
    mode = int(sv_f[SV_MODE])
    expiry = t_g + sv_f[SV_TAU + c]
    ret = t_g + predicted_gap(NE, NE[:1, :], -1, c)
    need = 0
    if thread >= 0:
        r = np.searchsorted(tid, thread)
        if r < tid.shape[0] and tid[r] == thread and th_f[r, TH_FINISH] == t_g:
            expiry, ret, need = th_f[r, TH_EXPIRY], th_f[r, TH_RETURN], int(th_f[r, TH_NEED])
    if duels(sv_f):  # no replica pins before its duel starts
        expiry = t_g
    prim, sec, until = group_key(mode, c, t_g, now, expiry, 0, 0,
                                 ret if mode == MODE_TTL else value, NE, pm[0], pm[1],
                                 AGE_EDGES_S, sv_f[SV_PAR:SV_PAR + N_PARAMS])
    return prim, sec, need, until
