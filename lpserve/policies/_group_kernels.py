"""Numba kernel of the session-aware KV evictors, beside a plain-Python twin (:mod:`_group_ref`), and
the online fits they share with the simulator adapters (``models/kv-sessions.md``).

Setting (``models/kv-caching-flow.md`` section 1): requests are served in order; request
``r`` hits on the longest leading run of its blocks in the cache, then all its blocks are
in the cache and the evictor brings it back to ``capacity`` blocks.

The unit of eviction is a **group**: the blocks whose last touch was request ``r``. A group
has a class ``c`` (why the client waits after ``r``: unknown, tool call, user turn; see
``Trace.wait_kind``), a touch time ``t`` and an eviction key ``(primary, secondary)``;
the group of smallest key loses its deepest block first (a deeper block is worth nothing
once a shallower one is gone). Keys depend on the group's age, so each group carries one
pending re-key event (at the next age on :data:`AGE_EDGES_S`, or at its pin's expiry);
events are processed before each eviction, in time order, with a lazy heap: the work per
request is ``O(log groups)``, not a scan of the cache.

Every rule learns only from waits that ended before ``now``: the wait a request ``p``
started ends when the next request of its thread (``Trace.program_id``, else
``session_id``) arrives (a *return* after ``gap`` seconds) or when ``amax`` seconds pass
without one (*no return*). Modes (``MODE_*``, equations of ``models/kv-sessions.md``):

* ``group-lru``: key ``(0, t)``; the same hits as :func:`_evict_kernels.lru_replay`.
* ``ttl-pin`` (Continuum): a touched group is pinned for ``tau[c]`` seconds, the TTL of
  its class fitted online by :func:`fit_ttl` (3); unpinned groups go first, least recent
  first; then pinned ones, the one whose thread is predicted to return last first (its
  predicted return: the touch time plus the thread's recent gaps after waits of that
  class, else the class's mean gap) (4). With its duel (the default), shadow LRU and pure
  ttl-pin caches run beside a real cache that follows whichever leads by the test (4b),
  evicting only blocks the leader no longer holds (4c).
* ``reuse-decay`` (Wang et al., ATC'25): primary = probability that the group is reused
  within ``horizon`` seconds given its age, from a per-class exponential reuse-time fit
  (5).
* ``tail-lru`` (Zhang et al.): blocks past the depth a conversation needs to keep its next
  turn's uncached prefill under ``xi`` tokens go first, LRU among them; then LRU (6).
* ``return-knapsack``: primary = value per block-second, (reuse probability x recompute
  value) / expected time to the return, per class and age (7)-(8).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from lpserve.kernels.heap import heap_pop, heap_push
from lpserve.kernels.session_keys import (  # noqa: F401 - the replay's names
    AGE_EDGES_S,
    MODE_DECAY,
    MODE_GLRU,
    MODE_INDEX,
    MODE_NAMES,
    MODE_TAIL,
    MODE_TTL,
    N_CLASSES,
    N_PARAMS,
    P_ALPHA,
    P_AMAX,
    P_BLOCK,
    P_D0,
    P_DSCALE,
    P_DUEL,
    P_HORIZON,
    P_LEAD0,
    P_MIN_N,
    P_REFIT,
    P_TTL,
    P_V0,
    P_XI,
    PRIOR_GAP_S,
    TTL_GRID_S,
    decay_score,
    fit_return,
    fit_ttl,
    group_key,
    predicted_gap,
    record_wait,
    update_gap,
)


# ===================================================================================== fits
@njit(cache=True)
def duel_bound(V, y, alpha):  # pragma: no cover - numba
    """Eq. (4b): the evidence ``D`` (summed per-request hit differences, ``V`` their summed
    squares) above which the other shadow leads at level ``alpha`` uniformly over time
    (normal-mixture boundary with scale ``y``, block-hits squared; numpy arrays work too,
    through ``duel_bound.py_func``)."""
    return np.sqrt((V + y) * (np.log1p(V / y) + 2.0 * np.log(1.0 / alpha)))


# ===================================================================================== keys
@njit(cache=True)
def group_keys(mode, cls, t_g, now, expiry, value, NE, pi, mu, edges,
               params):  # pragma: no cover - numba
    """:func:`group_key`'s ``(primary, secondary)`` of many groups at ``now`` (float64
    arrays, ``(n_groups,)``; ``cls``, ``t_g``, ``expiry``, ``value`` per group, top depth
    and need 0), as the simulator's session evictors order them; ``group_keys.py_func`` is
    the interpreted twin."""
    n = cls.shape[0]
    prim = np.empty(n)
    sec = np.empty(n)
    for k in range(n):
        prim[k], sec[k], _ = group_key(mode, cls[k], t_g[k], now, expiry[k], 0, 0, value[k],
                                       NE, pi, mu, edges, params)
    return prim, sec


# ===================================================================================== replay
@njit(cache=True)
def new_cache(n, n_keys, B, log):  # pragma: no cover - numba
    """The state of one cache instance: ``(inc, owner, cnt, gtop, expiry, need, gval,
    gstamp, estamp, hp, hs, hg, hv, ep, es, eg, ev, sc, lg, lpos)``; ``sc`` holds the heap
    sizes, the stamp counter, the cached blocks and the head and end of the eviction log
    ``lg`` (keys in the order this cache evicted them, ``lpos``: a key's latest entry),
    kept only when ``log`` (a duel's shadow, which the real cache follows, eq. (4c))."""
    cap = n * (B + 5) + 16
    m = 2 * n_keys + 16 if log else 0
    return (np.zeros(n_keys, np.bool_), np.full(n_keys, -1, np.int64),
            np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n), np.zeros(n, np.int64),
            np.ones(n), np.zeros(n, np.int64), np.zeros(n, np.int64),
            np.empty(cap), np.empty(cap), np.empty(cap, np.int64), np.empty(cap, np.int64),
            np.empty(cap), np.zeros(cap), np.empty(cap, np.int64), np.empty(cap, np.int64),
            np.zeros(6, np.int64), np.empty(m, np.int64),
            np.full(n_keys if log else 0, -1, np.int64))


@njit(cache=True)
def log_push(lg, lpos, inc, sc, k):  # pragma: no cover - numba
    """Append evicted key ``k`` to the eviction log ``lg`` (head ``sc[4]``, end ``sc[5]``).
    A full log is compacted first: only each key's latest entry survives, and only while
    the key is still out of this cache, so at most ``n_keys`` entries remain and the work
    per eviction is O(1) amortized."""
    if sc[5] == lg.shape[0]:
        j = 0
        for i in range(sc[4], sc[5]):
            k2 = lg[i]
            if not inc[k2] and lpos[k2] == i:
                lg[j] = k2
                lpos[k2] = j
                j += 1
        sc[4], sc[5] = 0, j
    lg[sc[5]] = k
    lpos[k] = sc[5]
    sc[5] += 1


@njit(cache=True)
def follow_step(inc, size, lead, r, offsets, key, capacity):  # pragma: no cover - numba
    """Serve request ``r`` in the duel's real cache (key set ``inc``, ``size[0]`` blocks),
    which follows the shadow ``lead`` (eq. (4c)): count its prefix hits, add its blocks,
    then evict down to ``capacity`` blocks that ``lead`` no longer holds, in the order of
    their latest eviction from ``lead`` (its log). ``lead`` must have served ``r`` already; then such
    blocks always suffice (``proofs/kv-duel-follower.md``, lemma 1). Returns the hits."""
    a0, a1 = offsets[r], offsets[r + 1]
    j = a0
    while j < a1 and inc[key[j]]:
        j += 1
    for a in range(a0, a1):
        if not inc[key[a]]:
            inc[key[a]] = True
            size[0] += 1
    linc, lsc, lg, lpos = lead[0], lead[17], lead[18], lead[19]
    while size[0] > capacity:
        if lsc[4] >= lsc[5]:
            raise RuntimeError("group_replay: the followed shadow's log ran out")
        k = lg[lsc[4]]
        lsc[4] += 1
        if inc[k] and not linc[k] and lpos[k] == lsc[4] - 1:  # the key's latest entry
            inc[k] = False
            size[0] -= 1
    return j - a0


@njit(cache=True)
def rekey(st, mode, g, t_g, now, c, g_off, NE, pi, mu, edges, params):  # pragma: no cover
    """Push group ``g``'s key at ``now`` (and its next re-key event) onto its heaps."""
    (inc, owner, cnt, gtop, expiry, need, gval, gstamp, estamp, hp, hs, hg, hv, ep, es,
     eg, ev, sc, lg, lpos) = st
    sc[2] += 1
    pk, sk, nxt = group_key(mode, c, t_g, now, expiry[g], gtop[g] - g_off, need[g],
                            gval[g], NE, pi, mu, edges, params)
    gstamp[g] = sc[2]
    sc[0] = heap_push(hp, hs, hg, hv, sc[0], pk, sk, g, sc[2])
    if nxt < np.inf:
        estamp[g] = sc[2]
        sc[1] = heap_push(ep, es, eg, ev, sc[1], nxt, 0.0, g, sc[2])


@njit(cache=True)
def cache_step(st, mode, r, now, offsets, key, request, arrival_s, cls, capacity, exp_r,
               need_r, gval_r, NE, pi, mu, edges, params):  # pragma: no cover - numba
    """Serve request ``r`` in the cache ``st``: count its prefix hits, make its blocks its
    group (pin expiry ``exp_r``, tail depth ``need_r``, value ``gval_r``), then evict down
    to ``capacity`` blocks. Returns the hits."""
    (inc, owner, cnt, gtop, expiry, need, gval, gstamp, estamp, hp, hs, hg, hv, ep, es,
     eg, ev, sc, lg, lpos) = st
    a0, a1 = offsets[r], offsets[r + 1]
    j = a0
    while j < a1 and inc[key[j]]:
        j += 1
    for a in range(a0, a1):
        k = key[a]
        if inc[k]:
            cnt[request[owner[k]]] -= 1
        else:
            inc[k] = True
            sc[3] += 1
        owner[k] = a
    if a1 > a0:
        cnt[r], gtop[r], expiry[r], need[r], gval[r] = a1 - a0, a1 - 1, exp_r, need_r, gval_r
        rekey(st, mode, r, now, now, cls[r], a0, NE, pi, mu, edges, params)
    if sc[3] <= capacity:
        return j - a0
    while sc[1] > 0 and ep[0] <= now:  # re-key the groups whose key changed by now
        g, v_ = eg[0], ev[0]
        sc[1] = heap_pop(ep, es, eg, ev, sc[1])
        if v_ == estamp[g] and cnt[g] > 0:
            rekey(st, mode, g, arrival_s[g], now, cls[g], offsets[g], NE, pi, mu, edges,
                  params)
    while sc[3] > capacity:
        if sc[0] == 0:
            raise RuntimeError("group_replay: no evictable group left")
        pk, g, v_ = hp[0], hg[0], hv[0]
        sc[0] = heap_pop(hp, hs, hg, hv, sc[0])
        if v_ != gstamp[g] or cnt[g] == 0:
            continue
        lo = offsets[g] + (need[g] if mode == MODE_TAIL and pk == 0.0 else 0)
        while sc[3] > capacity and gtop[g] >= lo:
            a = gtop[g]
            gtop[g] -= 1
            k = key[a]
            if inc[k] and owner[k] == a:
                inc[k] = False
                sc[3] -= 1
                cnt[g] -= 1
                if lg.shape[0] > 0:
                    log_push(lg, lpos, inc, sc, k)
        if cnt[g] > 0:
            rekey(st, mode, g, arrival_s[g], now, cls[g], offsets[g], NE, pi, mu, edges,
                  params)
    return j - a0


@njit(cache=True)
def group_replay(offsets, key, request, value, arrival_s, thread, n_threads, cls,
                 prompt_tokens, context_tokens, n_keys, capacity, mode, params, edges,
                 ttl_grid, H, O, R, X, NE, diag):  # pragma: no cover - numba
    """Hits per request (n,) of the session-aware evictor ``mode`` (see the module
    docstring). Per request (n,): ``arrival_s``, ``thread`` (dense conversation id, -1
    none), ``cls`` (0..N_CLASSES-1), ``prompt_tokens``, ``context_tokens`` (prompt +
    output tokens: what the conversation holds after the request); per access (A,):
    ``key``, ``request``, ``value`` (recompute value of a hit); ``params`` float64
    (N_PARAMS,). ``H, O, R, X, NE``: the wait statistics of :func:`record_wait`, updated in
    place (pass zeros, or statistics fitted on other traffic to start warm).

    With ``mode == MODE_TTL`` and ``params[P_DUEL] = alpha > 0`` two shadow caches run,
    pure LRU and pure ttl-pin; the leader changes when the other shadow's hits since the
    last change exceed the leader's by :func:`duel_bound` (level ``alpha``, scale
    ``(params[P_DSCALE] * capacity) ** 2``; eq. (4b)), and the real cache
    follows the leader (eq. (4c)): it evicts only blocks the leader no longer holds, so it
    holds what the leader holds once they agree. ``diag`` (int64 (n, 4), or (0, 4) for
    none) receives per request the two shadows' hits, the leader after the request
    (1: ttl-pin) and, at a switch of leader, the blocks the new leader holds and the real
    cache does not (-1 elsewhere; O(keys) per switch); with a fifth column (n, 5), that
    count after every request (O(keys) per request: for tests)."""
    n = offsets.shape[0] - 1
    K, B = N_CLASSES, edges.shape[0] - 1
    amax, refit, bt = params[P_AMAX], int(params[P_REFIT]), params[P_BLOCK]
    q_sum, q_n, n_new = 0.0, 0.0, 0
    tau = np.full(K, max(params[P_TTL], 0.0))
    if params[P_TTL] < 0:
        tau, _ = fit_ttl(H, O, params[P_MIN_N], NE, ttl_grid)
    pi, mu = fit_return(R, X, NE, edges, amax, params[P_MIN_N])
    duel = mode == MODE_TTL and params[P_DUEL] > 0
    st = new_cache(0 if duel else n, 0 if duel else n_keys, B, False)
    sh_lru = new_cache(n if duel else 0, n_keys if duel else 0, B, duel)
    sh_ttl = new_cache(n if duel else 0, n_keys if duel else 0, B, duel)
    real = np.zeros(n_keys if duel else 0, np.bool_)  # the duel's real cache: a key set
    size = np.zeros(1, np.int64)
    pinning = duel and params[P_LEAD0] > 0  # the duel's leader (True: ttl-pin)
    ev_d, ev_v = params[P_D0], params[P_V0]  # evidence against the leader, eq. (4b)
    want = diag.shape[0] > 0
    y_duel = (params[P_DSCALE] * max(capacity, 1)) ** 2  # (4b): a switch costs <= C misses
    last_req = np.full(max(n_threads, 1), -1, np.int64)
    tg = np.zeros((max(n_threads, 1), K))
    resolved = np.zeros(n, np.bool_)
    qptr = 0
    hits = np.zeros(n, np.int64)
    for r in range(n):
        a0, a1, now = offsets[r], offsets[r + 1], arrival_s[r]
        # waits that ended by now: no return within amax, or the thread's next request
        while qptr < r and arrival_s[qptr] + amax < now:
            if thread[qptr] >= 0 and not resolved[qptr]:
                resolved[qptr] = True
                record_wait(H, O, R, X, NE, cls[qptr], np.inf,
                            float(offsets[qptr + 1] - offsets[qptr]), amax, edges, ttl_grid)
                n_new += 1
            qptr += 1
        th = thread[r]
        if th >= 0:
            p = last_req[th]
            if p >= 0 and not resolved[p]:
                resolved[p] = True
                record_wait(H, O, R, X, NE, cls[p], now - arrival_s[p],
                            float(offsets[p + 1] - offsets[p]), amax, edges, ttl_grid)
                update_gap(tg, th, cls[p], now - arrival_s[p], amax, params[P_ALPHA])
                n_new += 1
                grown = prompt_tokens[r] - context_tokens[p]
                if grown >= 0:
                    q_sum += grown
                    q_n += 1.0
            last_req[th] = r
        if n_new >= refit:
            n_new = 0
            if params[P_TTL] < 0:
                tau, _ = fit_ttl(H, O, params[P_MIN_N], NE, ttl_grid)
            if mode == MODE_INDEX:
                pi, mu = fit_return(R, X, NE, edges, amax, params[P_MIN_N])
        q_hat = q_sum / q_n if q_n > 0 else 0.0
        need_r = int(math.ceil(max(0.0, context_tokens[r] + q_hat - params[P_XI]) / bt))
        v = 0.0
        for a in range(a0, a1):
            v += value[a]
        gval_r = v / max(a1 - a0, 1)
        if mode == MODE_TTL:
            gval_r = now + predicted_gap(NE, tg, th, cls[r])
        exp_r = now + tau[cls[r]]
        if duel:
            hl = cache_step(sh_lru, MODE_GLRU, r, now, offsets, key, request, arrival_s, cls,
                            capacity, now, need_r, gval_r, NE, pi, mu, edges, params)
            ht = cache_step(sh_ttl, mode, r, now, offsets, key, request, arrival_s, cls,
                            capacity, exp_r, need_r, gval_r, NE, pi, mu, edges, params)
            x = float(hl - ht if pinning else ht - hl)
            ev_d += x
            ev_v += x * x
            was = pinning
            if ev_d > duel_bound(ev_v, y_duel, params[P_DUEL]):  # the other one leads
                pinning = not pinning
                ev_d = ev_v = 0.0
            lead = sh_ttl if pinning else sh_lru
            hits[r] = follow_step(real, size, lead, r, offsets, key, capacity)
            if want:
                diag[r, 0], diag[r, 1], diag[r, 2], diag[r, 3] = hl, ht, pinning, -1
                if pinning != was or diag.shape[1] > 4:
                    gap = np.sum(lead[0] & ~real)
                    diag[r, 3] = gap if pinning != was else -1
                    if diag.shape[1] > 4:
                        diag[r, 4] = gap
        else:
            hits[r] = cache_step(st, mode, r, now, offsets, key, request, arrival_s, cls,
                                 capacity, exp_r, need_r, gval_r, NE, pi, mu, edges, params)
    return hits
