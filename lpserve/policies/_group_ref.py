"""Plain-Python twin of :func:`_group_kernels.group_replay` (``heapq`` for the lazy heaps),
which the tests compare with the kernel; :class:`RefCache` is also the simulator adapter's
shadow cache (``models/kv-sessions.md``)."""
from __future__ import annotations

import heapq
import math

import numpy as np

from lpserve.policies._group_kernels import (
    DUEL_MARGIN,
    MODE_GLRU,
    MODE_INDEX,
    MODE_TAIL,
    MODE_TTL,
    N_CLASSES,
    P_ALPHA,
    P_AMAX,
    P_BLOCK,
    P_DUEL,
    P_MIN_N,
    P_REFIT,
    P_TTL,
    P_XI,
    fit_return,
    fit_ttl,
    group_key,
    predicted_gap,
    record_wait,
    update_gap,
)


class RefCache:
    """One cache instance of :func:`group_replay_ref` (plain Python, heapq); also the
    simulator adapter's shadow caches, which grow request by request (``grow``)."""

    def __init__(self, n: int, n_keys: int) -> None:
        self.inc, self.owner = [False] * n_keys, [-1] * n_keys
        self.cnt, self.gtop, self.need = [0] * n, [0] * n, [0] * n
        self.expiry, self.gval = [0.0] * n, [1.0] * n
        self.gstamp, self.estamp = [0] * n, [0] * n
        self.heap: list = []
        self.events: list = []
        self.stamp = self.size = 0

    def grow(self, n: int, n_keys: int) -> None:
        """Make room for ``n`` requests and ``n_keys`` block keys."""
        for name, fill, size in (("inc", False, n_keys), ("owner", -1, n_keys),
                                 ("cnt", 0, n), ("gtop", 0, n), ("need", 0, n),
                                 ("expiry", 0.0, n), ("gval", 1.0, n), ("gstamp", 0, n),
                                 ("estamp", 0, n)):
            lst = getattr(self, name)
            lst.extend([fill] * (size - len(lst)))

    def rekey(self, mode, g, t_g, now, c, g_off, NE, pi, mu, edges, params):
        self.stamp += 1
        pk, sk, nxt = group_key.py_func(mode, c, t_g, now, self.expiry[g],
                                        self.gtop[g] - g_off, self.need[g], self.gval[g], NE,
                                        pi, mu, edges, params)
        self.gstamp[g] = self.stamp
        heapq.heappush(self.heap, (pk, sk, g, self.stamp))
        if nxt < np.inf:
            self.estamp[g] = self.stamp
            heapq.heappush(self.events, (nxt, 0.0, g, self.stamp))

    def unpin_all(self, mode, now, offsets, arrival_s, cls, NE, pi, mu, edges, params):
        for _, _, g, v_ in list(self.events):
            if v_ == self.estamp[g] and self.cnt[g] > 0 and self.expiry[g] > now:
                self.expiry[g] = now
                self.rekey(mode, g, float(arrival_s[g]), now, cls[g], offsets[g], NE, pi, mu,
                           edges, params)

    def step(self, mode, r, now, offsets, key, request, arrival_s, cls, capacity, exp_r,
             need_r, gval_r, NE, pi, mu, edges, params):
        a0, a1 = int(offsets[r]), int(offsets[r + 1])
        j = a0
        while j < a1 and self.inc[key[j]]:
            j += 1
        for a in range(a0, a1):
            k = key[a]
            if self.inc[k]:
                self.cnt[request[self.owner[k]]] -= 1
            else:
                self.inc[k] = True
                self.size += 1
            self.owner[k] = a
        if a1 > a0:
            self.cnt[r], self.gtop[r], self.expiry[r] = a1 - a0, a1 - 1, exp_r
            self.need[r], self.gval[r] = need_r, gval_r
            self.rekey(mode, r, now, now, cls[r], a0, NE, pi, mu, edges, params)
        if self.size <= capacity:
            return j - a0
        while self.events and self.events[0][0] <= now:
            _, _, g, v_ = heapq.heappop(self.events)
            if v_ == self.estamp[g] and self.cnt[g] > 0:
                self.rekey(mode, g, float(arrival_s[g]), now, cls[g], offsets[g], NE, pi,
                           mu, edges, params)
        while self.size > capacity:
            if not self.heap:
                raise RuntimeError("group_replay: no evictable group left")
            pk, _, g, v_ = heapq.heappop(self.heap)
            if v_ != self.gstamp[g] or self.cnt[g] == 0:
                continue
            lo = offsets[g] + (self.need[g] if mode == MODE_TAIL and pk == 0.0 else 0)
            while self.size > capacity and self.gtop[g] >= lo:
                a = self.gtop[g]
                self.gtop[g] -= 1
                k = key[a]
                if self.inc[k] and self.owner[k] == a:
                    self.inc[k] = False
                    self.size -= 1
                    self.cnt[g] -= 1
            if self.cnt[g] > 0:
                self.rekey(mode, g, float(arrival_s[g]), now, cls[g], offsets[g], NE, pi, mu,
                           edges, params)
        return j - a0


def group_replay_ref(offsets, key, request, value, arrival_s, thread, n_threads, cls,
                     prompt_tokens, context_tokens, n_keys, capacity, mode, params, edges,
                     ttl_grid, H, O, R, X, NE):
    """Plain-Python twin of :func:`group_replay` (same keys, events, duel and tie-breaks;
    the fits run as Python through each numba function's ``py_func``)."""
    rec, fttl, fret = record_wait.py_func, fit_ttl.py_func, fit_return.py_func
    upd, pgap = update_gap.py_func, predicted_gap.py_func
    n = len(offsets) - 1
    amax, refit, bt = params[P_AMAX], int(params[P_REFIT]), params[P_BLOCK]
    q_sum = q_n = 0.0
    n_new = 0
    tau = np.full(N_CLASSES, max(params[P_TTL], 0.0))
    if params[P_TTL] < 0:
        tau, _ = fttl(H, O, params[P_MIN_N], NE, ttl_grid)
    pi, mu = fret(R, X, NE, edges, amax, params[P_MIN_N])
    duel = mode == MODE_TTL and params[P_DUEL] > 0
    st = RefCache(n, n_keys)
    sh_lru, sh_ttl = (RefCache(n, n_keys), RefCache(n, n_keys)) if duel else (None, None)
    score_lru = score_ttl = 0.0
    pinning = not duel
    t_score = float(arrival_s[0]) if n else 0.0
    last_req = [-1] * max(n_threads, 1)
    tg = np.zeros((max(n_threads, 1), N_CLASSES))
    resolved = [False] * n
    qptr = 0
    hits = np.zeros(n, np.int64)
    for r in range(n):
        a0, a1, now = int(offsets[r]), int(offsets[r + 1]), float(arrival_s[r])
        while qptr < r and arrival_s[qptr] + amax < now:
            if thread[qptr] >= 0 and not resolved[qptr]:
                resolved[qptr] = True
                rec(H, O, R, X, NE, cls[qptr], np.inf, float(offsets[qptr + 1] - offsets[qptr]),
                    amax, edges, ttl_grid)
                n_new += 1
            qptr += 1
        th = thread[r]
        if th >= 0:
            p = last_req[th]
            if p >= 0 and not resolved[p]:
                resolved[p] = True
                rec(H, O, R, X, NE, cls[p], now - arrival_s[p],
                    float(offsets[p + 1] - offsets[p]), amax, edges, ttl_grid)
                upd(tg, th, cls[p], now - arrival_s[p], amax, params[P_ALPHA])
                n_new += 1
                grown = prompt_tokens[r] - context_tokens[p]
                if grown >= 0:
                    q_sum += grown
                    q_n += 1.0
            last_req[th] = r
        if n_new >= refit:
            n_new = 0
            if params[P_TTL] < 0:
                tau, _ = fttl(H, O, params[P_MIN_N], NE, ttl_grid)
            if mode == MODE_INDEX:
                pi, mu = fret(R, X, NE, edges, amax, params[P_MIN_N])
        q_hat = q_sum / q_n if q_n > 0 else 0.0
        need_r = int(math.ceil(max(0.0, context_tokens[r] + q_hat - params[P_XI]) / bt))
        gval_r = float(np.sum(value[a0:a1])) / max(a1 - a0, 1)
        if mode == MODE_TTL:
            gval_r = now + pgap(NE, tg, th, cls[r])
        exp_r = now + tau[cls[r]]
        args = (offsets, key, request, arrival_s, cls, capacity)
        if duel:
            hl = sh_lru.step(MODE_GLRU, r, now, *args, now, need_r, gval_r, NE, pi, mu, edges,
                             params)
            ht = sh_ttl.step(mode, r, now, *args, exp_r, need_r, gval_r, NE, pi, mu, edges,
                             params)
            f = math.exp(-(now - t_score) / params[P_DUEL])
            score_lru, score_ttl, t_score = score_lru * f + hl, score_ttl * f + ht, now
            if pinning and score_ttl < score_lru:
                pinning = False
                st.unpin_all(mode, now, offsets, arrival_s, cls, NE, pi, mu, edges, params)
            elif not pinning and score_ttl > (1.0 + DUEL_MARGIN) * score_lru:
                pinning = True
            if not pinning:
                exp_r = now
        hits[r] = st.step(mode, r, now, *args, exp_r, need_r, gval_r, NE, pi, mu, edges, params)
    return hits
