"""Plain-Python twin of :func:`_group_kernels.group_replay` (``heapq`` for the lazy heaps),
which the tests compare with the kernel; :class:`RefCache` is also the simulator adapter's
shadow cache (``models/kv-sessions.md``)."""
from __future__ import annotations

import heapq
import math

import numpy as np

from lpserve.policies._group_kernels import (
    MODE_GLRU,
    MODE_INDEX,
    MODE_TAIL,
    MODE_TTL,
    N_CLASSES,
    P_ALPHA,
    P_AMAX,
    P_BLOCK,
    P_D0,
    P_DSCALE,
    P_DUEL,
    P_LEAD0,
    P_MIN_N,
    P_REFIT,
    P_TTL,
    P_V0,
    P_XI,
    duel_bound,
    fit_return,
    fit_ttl,
    group_key,
    predicted_gap,
    record_wait,
    update_gap,
)


class RefCache:
    """One cache instance of :func:`group_replay_ref` (plain Python, heapq); also the
    simulator adapter's shadow caches, which grow request by request (``grow``). With
    ``log``, it keeps the kernel's eviction log (``lg`` from ``head``; ``lpos``: a key's
    latest entry; compacted at ``2 n_keys + 16`` entries as :func:`log_push` does)."""

    def __init__(self, n: int, n_keys: int, log: bool = False) -> None:
        self.log, self.lg, self.head, self.lpos = log, [], 0, {}
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

    def log_push(self, k: int) -> None:
        """:func:`_group_kernels.log_push`: append evicted key ``k``, compacting a full log."""
        if len(self.lg) == 2 * len(self.inc) + 16:
            kept = [k2 for i, k2 in enumerate(self.lg) if i >= self.head
                    and not self.inc[k2] and self.lpos[k2] == i]
            self.lg, self.head = kept, 0
            self.lpos.update({k2: i for i, k2 in enumerate(kept)})
        self.lpos[k] = len(self.lg)
        self.lg.append(k)

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
                    if self.log:
                        self.log_push(k)
            if self.cnt[g] > 0:
                self.rekey(mode, g, float(arrival_s[g]), now, cls[g], offsets[g], NE, pi, mu,
                           edges, params)
        return j - a0


def follow_step_ref(real: set, lead: RefCache, r, offsets, key, capacity) -> int:
    """Plain-Python twin of :func:`_group_kernels.follow_step` (``real``: the key set)."""
    a0, a1 = int(offsets[r]), int(offsets[r + 1])
    j = a0
    while j < a1 and key[j] in real:
        j += 1
    real.update(int(k) for k in key[a0:a1])
    while len(real) > capacity:
        if lead.head >= len(lead.lg):
            raise RuntimeError("group_replay: the followed shadow's log ran out")
        k = lead.lg[lead.head]
        lead.head += 1
        if k in real and not lead.inc[k] and lead.lpos[k] == lead.head - 1:
            real.discard(k)
    return j - a0


def group_replay_ref(offsets, key, request, value, arrival_s, thread, n_threads, cls,
                     prompt_tokens, context_tokens, n_keys, capacity, mode, params, edges,
                     ttl_grid, H, O, R, X, NE, diag):
    """Plain-Python twin of :func:`group_replay` (same keys, events, duel, follower and
    tie-breaks; the fits run as Python through each numba function's ``py_func``)."""
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
    sh_lru, sh_ttl = ((RefCache(n, n_keys, True), RefCache(n, n_keys, True)) if duel
                      else (None, None))
    real: set = set()
    pinning = bool(duel and params[P_LEAD0] > 0)
    ev_d, ev_v = float(params[P_D0]), float(params[P_V0])
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
            x = float(hl - ht if pinning else ht - hl)
            ev_d += x
            ev_v += x * x
            was = pinning
            y = (params[P_DSCALE] * max(capacity, 1)) ** 2
            if ev_d > duel_bound.py_func(ev_v, y, params[P_DUEL]):
                pinning = not pinning
                ev_d = ev_v = 0.0
            lead = sh_ttl if pinning else sh_lru
            hits[r] = follow_step_ref(real, lead, r, offsets, key, capacity)
            if len(diag):
                diag[r, :4] = (hl, ht, pinning, -1)
                if pinning != was or diag.shape[1] > 4:
                    gap = sum(1 for k in range(n_keys) if lead.inc[k] and k not in real)
                    diag[r, 3] = gap if pinning != was else -1
                    if diag.shape[1] > 4:
                        diag[r, 4] = gap
        else:
            hits[r] = st.step(mode, r, now, *args, exp_r, need_r, gval_r, NE, pi, mu, edges,
                              params)
    return hits
