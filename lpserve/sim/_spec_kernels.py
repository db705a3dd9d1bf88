"""Numba twin of the simulator's speculative decoding (:mod:`lpserve.sim.speculative`) and
of the built-in speculation deciders (:mod:`lpserve.policies.speculation`): never, fixed,
UCB1 per (request class, batch bucket), optimistic acceptance rates, and the oracle; a
decider written in Python is asked in pauses (:func:`lpserve.sim.hooks.spec_choose`).
Equations are ``models/speculative-decoding.md`` (4)-(11); acceptance draws come from the
replica's numpy ``Generator`` (:meth:`lpserve.sim.speculative.SpecRunner.replica_rng`).

``SpecRun`` holds the run's arrays (decider parameters ``ip``, the target's and drafts'
cost parameters, every request's acceptance rates ``(n, n_drafts)``, the batch-bucket
edges, the run's counters); ``SpecRep`` one replica's learner state.
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit, objmode

from lpserve.cost import context_sum, decode_time_at, iteration_time
from lpserve.sim import _pool as P
from lpserve.sim import _state_kernels as T
from lpserve.sim import hooks as HK
from lpserve.sim._structs import SPECREP_FIELDS, SPECRUN_FIELDS

#: the run's and a replica's speculation arrays (Python side; the kernels take the
#: structures of :mod:`lpserve.sim._structs` over them)
SpecRun = namedtuple("SpecRun", SPECRUN_FIELDS)
SpecRep = namedtuple("SpecRep", SPECREP_FIELDS)

# decider kinds (SP_PYTHON: a decider written in Python, asked in pauses, lpserve.sim.hooks)
SP_OFF, SP_NEVER, SP_FIXED, SP_UCB, SP_ACC, SP_ORACLE, SP_PYTHON = range(7)
SPEC_KINDS = {"never": SP_NEVER, "fixed": SP_FIXED, "ucb": SP_UCB,
              "acceptance-ucb": SP_ACC, "oracle": SP_ORACLE}
# ip layout: a header, then the arm table (``arm_table``): each arm's ``(k, draft)``
# (draft -1 for plain decoding), then the arm each ``(draft, k)`` falls back to when
# memory is short, ``draft * (Q_MAX_K + 1) + k`` (-1: not an arm)
Q_KIND, Q_MAX_K, Q_DRAFTS, Q_FIXED_K, Q_FIXED_D, Q_EAGER, Q_CLASSES, Q_BUCKETS, \
    Q_N_ARMS = range(9)
N_Q = 9
# counts layout (SpecRunner.counts)
K_STEPS, K_SPEC_STEPS, K_DRAFT, K_ACCEPTED, K_EMITTED, K_SEQ_STEPS = range(6)
A_MAX = 1.0 - 1e-6
# rows of a step's int64 workspace (:func:`workspace`)
W_IDX, W_CTX, W_LAG, W_HELD, W_TEN, W_GROW, W_ACC, W_TMP = range(8)
W_ROWS = 8


def arm_table(arms, arm_index, n_drafts: int) -> np.ndarray:
    """The ``ip`` entries after the header for a decider's ``arms`` (each with ``k`` and
    ``draft``) and its ``arm_index(k, draft)``: int64 ``(2 n_arms + n_drafts (K + 1),)``,
    ``K`` the largest ``k``; an index outside the arms is stored as -1 (a step that needs
    it fails, as ``arms[j]`` would)."""
    n = len(arms)
    K = max(int(a.k) for a in arms)
    out = np.full(2 * n + max(n_drafts, 1) * (K + 1), -1, np.int64)
    for j, a in enumerate(arms):
        out[2 * j], out[2 * j + 1] = int(a.k), int(a.draft) if a.k else -1
    for d in range(n_drafts):
        for k in range(1, K + 1):
            j = arm_index(k, d)
            out[2 * n + d * (K + 1) + k] = j if 0 <= j < n else -1
    return out


@njit(cache=True)
def arm_of(sr, j):
    """``(k, draft)`` of arm ``j`` (``draft`` -1 for plain decoding)."""
    ip = sr.ip
    return ip[N_Q + 2 * j], ip[N_Q + 2 * j + 1]


@njit(cache=True)
def arm_index(sr, k, d):
    """Index of arm ``(k, d)`` (the decider's ``arm_index``; ``k = 0`` is arm 0)."""
    if k == 0:
        return 0
    ip = sr.ip
    j = ip[N_Q + 2 * ip[Q_N_ARMS] + d * (ip[Q_MAX_K] + 1) + k]
    if j < 0:
        raise IndexError("speculation decider: arm_index(k, draft) is not one of its arms")
    return j


@njit(cache=True)
def prefill_s(sr, req, ch_i, ch_c, ch_h, n_ch):
    """Seconds the drafts add to an iteration with these prefill chunks, eq. (4); the
    drafts' KV catches up with the chunks."""
    if sr.ip[Q_KIND] == SP_OFF or not sr.ip[Q_EAGER] or n_ch == 0:
        return 0.0
    t = 0.0
    for d in range(sr.ip[Q_DRAFTS]):
        t += iteration_time(sr.dparams[d], ch_c[:n_ch], ch_h[:n_ch], np.empty(0, np.int64))
    for k in range(n_ch):
        req.dcomp[ch_i[k]] = ch_h[k] + ch_c[k]
    return t


@njit(cache=True)
def _draft_iter_s(sr, d, i, c, lag, csum):
    """Seconds of draft ``d``'s ``i``-th iteration of a step at contexts ``c`` (float sum
    ``csum``); the first also catches up each request's ``lag`` tokens, eq. (5)."""
    D = sr.dparams[d]
    m = c.shape[0]
    n_late = 0
    for k in range(m):
        if lag[k] > 0:
            n_late += 1
    if i == 0 and n_late > 0:  # (5) catch-up: lag + 1 tokens on the draft's KV
        pt = np.empty(n_late, np.int64)
        pc = np.empty(n_late, np.int64)
        dc = np.empty(m - n_late, np.int64)
        a = 0
        b = 0
        for k in range(m):
            if lag[k] > 0:
                pt[a] = lag[k] + 1
                pc[a] = c[k] - lag[k]
                a += 1
            else:
                dc[b] = c[k]
                b += 1
        return iteration_time(D, pt, pc, dc)
    return decode_time_at(D, c, csum, i)


@njit(cache=True)
def _time_s(sr, j, c, lag, times, dmemo, vmemo, tmp):
    """Step time of arm ``j`` for contexts ``c`` (eq. (5)-(6)), memoized in ``times``; the
    drafts' iterations in ``dmemo`` (draft, i), the target's verification of ``k`` drafts
    in ``vmemo[k + 1]`` (any draft's), ``vmemo[0]``: the contexts' float sum; ``tmp``:
    int64 scratch as long as ``c``."""
    if not math.isnan(times[j]):
        return times[j]
    k, d = arm_of(sr, j)
    m = c.shape[0]
    if k == 0:
        t = decode_time_at(sr.tparams, c, vmemo[0], 0)
    else:
        t = 0.0
        for i in range(k):
            if math.isnan(dmemo[d, i]):
                dmemo[d, i] = _draft_iter_s(sr, d, i, c, lag, vmemo[0])
            t += dmemo[d, i]
        if math.isnan(vmemo[k + 1]):
            tmp[:m] = k + 1
            vmemo[k + 1] = iteration_time(sr.tparams, tmp[:m], c, tmp[:0])
        t = t + vmemo[k + 1]
    times[j] = t
    return t


@njit(cache=True)
def _expected(a, k):
    """E[tokens] of one step with ``k`` drafts at acceptance rate ``a``: (1 - a^(k+1)) /
    (1 - a), eq. (8)."""
    return (1.0 - math.pow(a, k + 1.0)) / (1.0 - a)


@njit(cache=True)
def expected_terms(rates, max_k):
    """:func:`_expected` of every request's rate ``rates (n, n_drafts)`` for ``k = 0 ..
    max_k``: float64 ``(n, n_drafts, max_k + 1)`` (the oracle's, made once per run)."""
    n, nd = rates.shape
    out = np.empty((n, nd, max_k + 1))
    for i in range(n):
        for d in range(nd):
            for k in range(max_k + 1):
                out[i, d, k] = _expected(rates[i, d], k)
    return out


@njit(cache=True)
def _acc_rate(ss, cls, d):
    """Optimistic acceptance rate of (class ``cls``, draft ``d``): the mean accepted
    share plus ``sqrt(2 ln t / n)``, at most ``A_MAX`` (``A_MAX`` before any trial), eq. (12)."""
    n = ss.acc_n[cls, d]
    if n == 0:
        return A_MAX
    t = ss.acc_steps[0] + 1
    return min(A_MAX, ss.acc_s[cls, d] / n + math.sqrt(2.0 * math.log(max(t, 2)) / n))


@njit(cache=True)
def _context_id(sr, ten, cnt):
    """The bandit context of a batch with tenants ``ten``: its most common tenant (ties:
    smallest) and its size's bucket (``cnt``: scratch of one entry per class)."""
    ip = sr.ip
    m = ten.shape[0]
    cnt[:] = 0
    for q in range(m):
        cnt[ten[q] + 1] += 1
    cls = 0
    for t in range(ip[Q_CLASSES]):
        if cnt[t] > cnt[cls]:
            cls = t
    edges = sr.edges
    bucket = np.searchsorted(edges, m)
    if bucket > edges.shape[0]:
        bucket = edges.shape[0]
    return cls * ip[Q_BUCKETS] + bucket


@njit(cache=True)
def _choose_arm(sr, ss, ctx_id, idx, ten, c, lag, times, dmemo, vmemo, tmp, cterm):
    """The decider's arm for this step, eq. (10)-(11): fixed, UCB1 in context ``ctx_id``,
    or the best expected tokens per second under optimistic or true acceptance rates."""
    ip = sr.ip
    m = c.shape[0]
    n_arms = ip[Q_N_ARMS]
    kind = ip[Q_KIND]
    j = 0
    if kind == SP_FIXED:
        j = arm_index(sr, ip[Q_FIXED_K], ip[Q_FIXED_D])
    elif kind == SP_UCB:
        nn = ss.ucb_n[ctx_id]
        j = -1
        for a in range(n_arms):
            if nn[a] == 0:
                j = a
                break
        if j < 0:
            tot = 0
            for a in range(n_arms):
                tot += nn[a]
            best = -np.inf
            for a in range(n_arms):
                v = ss.ucb_s[ctx_id, a] / nn[a] + math.sqrt(2.0 * math.log(tot) / nn[a])
                if v > best:
                    best, j = v, a
    elif kind == SP_ACC or kind == SP_ORACLE:
        # sum_i E[tokens](a_i, k) left to right; each term is a function of (request,
        # draft, k) for the oracle (its table) and of (class, draft, k) within a step for
        # the optimistic rates (made once per class and arm): the same floats as per term
        best = -np.inf
        for a in range(n_arms):
            k, d = arm_of(sr, a)
            dd = max(d, 0)
            v = 0.0
            if kind == SP_ORACLE:
                for q in range(m):
                    v += sr.eterm[idx[q], dd, k]
            else:
                cterm[:] = np.nan
                for q in range(m):
                    cl = ten[q] + 1
                    if math.isnan(cterm[cl]):
                        cterm[cl] = _expected(_acc_rate(ss, cl, dd), k)
                    v += cterm[cl]
            v = v / _time_s(sr, a, c, lag, times, dmemo, vmemo, tmp)
            if v > best:
                best, j = v, a
    return j


@njit(cache=True)
def _python_choose(handle, idx, c, lag):
    """The arm a decider written in Python plays at this step (asked in a pause)."""
    with objmode(j="int64"):
        j = HK.spec_choose(handle, idx, c, lag)
    return j


@njit(cache=True)
def _learn(ss, kind, ctx_id, j, k, d, reward, ten, accepted):
    """The learners' update after a step of arm ``j`` (``k`` drafts of draft ``d``): UCB1's
    reward in context ``ctx_id``, or the per-class acceptance counts, eq. (10)."""
    if kind == SP_UCB:
        ss.ucb_n[ctx_id, j] += 1
        ss.ucb_s[ctx_id, j] += reward
        return
    ss.acc_steps[0] += 1
    if k:
        for q in range(accepted.shape[0]):
            cl = ten[q] + 1
            ss.acc_s[cl, d] += accepted[q]
            ss.acc_n[cl, d] += accepted[q] + (1 if accepted[q] < k else 0)


@njit(cache=True)
def workspace(sr, n_dec):
    """Scratch arrays for :func:`step` on a batch of ``n_dec``: ``(wi, times, dmemo,
    vmemo, cnt, cterm)``, reused by the steps of one run."""
    ip = sr.ip
    return (np.empty((W_ROWS, n_dec), np.int64), np.empty(ip[Q_N_ARMS]),
            np.empty((max(ip[Q_DRAFTS], 1), max(ip[Q_MAX_K], 1))), np.empty(ip[Q_MAX_K] + 2),
            np.empty(ip[Q_CLASSES], np.int64), np.empty(max(ip[Q_CLASSES], 1)))


@njit(cache=True)
def _grow_blocks(req, rep, cfg, idx, c, held0, grow, m, k):
    """Blocks for the ``k + 1`` verified positions of each sequence (eq. (7)), taken from
    the free list (evicting cached blocks if need be) into ``grow[:m]``; fewer drafts when
    memory is short. Returns the drafts that fit."""
    bt = cfg[T.C_BT]
    grow[:] = 0
    while k > 0:
        need = 0
        for q in range(m):
            grow[q] = max((c[q] + k + 1 + bt - 1) // bt - held0[q], 0)
            need += grow[q]
        if need == 0 or T.make_room(req, rep, cfg, need):
            break
        k -= 1
        grow[:] = 0
    n_grow = 0
    for q in range(m):
        n_grow += grow[q]
    if n_grow:
        P.take_anon(rep.pool, n_grow)
        anon = req.anon
        for q in range(m):
            anon[idx[q]] += grow[q]
    return k


@njit(cache=True)
def _count(cn, k, m, accepted, emitted):
    """Add one step of ``k`` drafts over ``m`` sequences to the run's counters ``cn``."""
    cn[K_STEPS] += 1
    cn[K_SPEC_STEPS] += 1 if k > 0 else 0
    cn[K_DRAFT] += k * m
    acc_sum = 0
    for q in range(m):
        acc_sum += accepted[q]
    cn[K_ACCEPTED] += acc_sum
    cn[K_EMITTED] += emitted
    cn[K_SEQ_STEPS] += m


@njit(cache=True)
def step(req, rep, cfg, sr, ss, dec, n_dec, ws):
    """One speculative step of the decode batch ``dec[:n_dec]`` (blocks for one token
    each already allocated; ``models/speculative-decoding.md``); ``ws``: the
    :func:`workspace` of a batch of ``n_dec``."""
    ip = sr.ip
    bt = cfg[T.C_BT]
    p = rep.pool
    m = n_dec
    wi, times, dmemo, vmemo, cnt, cterm = ws
    idx, c, lag, held0 = wi[W_IDX], wi[W_CTX], wi[W_LAG], wi[W_HELD]
    ten, grow, accepted, tmp = wi[W_TEN], wi[W_GROW], wi[W_ACC], wi[W_TMP]
    idx[:] = dec[:m]
    # every request array read once (each read of a structure's field is a refcount)
    computed, dcomp, anon, gen, out = req.computed, req.dcomp, req.anon, req.gen, req.out
    nslots, tenant = req.nslots, req.tenant
    for q in range(m):
        i = idx[q]
        c[q] = computed[i]
        lag[q] = c[q] - dcomp[i]
        held0[q] = anon[i] + nslots[i]
        ten[q] = tenant[i]
    times[:] = np.nan
    dmemo[:] = np.nan
    vmemo[:] = np.nan
    vmemo[0] = context_sum(c[:m])
    ctx_id = _context_id(sr, ten[:m], cnt)
    kind = ip[Q_KIND]
    if kind == SP_PYTHON:
        j = _python_choose(cfg[T.C_HOOK], idx[:m].copy(), c[:m].copy(), lag[:m].copy())
    else:
        j = _choose_arm(sr, ss, ctx_id, idx, ten, c, lag, times, dmemo, vmemo, tmp, cterm)
    k, d = arm_of(sr, j)
    d = max(d, 0)
    k = _grow_blocks(req, rep, cfg, idx, c, held0, grow, m, k)  # (7)
    j = arm_index(sr, k, d)
    dt = _time_s(sr, j, c, lag, times, dmemo, vmemo, tmp)
    fst = rep.fst
    fst[T.F_NOW] += dt
    fst[T.F_BUSY] += dt
    fst[T.F_AREA] += P.used(p) * dt
    rep.ist[T.I_ITERS] += 1
    rep.ist[T.I_DITERS] += 1
    # (8) accepted drafts: the leading run of i.i.d. Bernoulli(a_i) acceptances
    accepted[:] = 0
    if k:
        u = ss.rng.random((m, k))
        rates = sr.rates
        for q in range(m):
            a = rates[idx[q], d]
            n = 0
            while n < k and u[q, n] < a:
                n += 1
            accepted[q] = n
    # (9) tokens emitted: accepted + 1, never past the request's output
    emitted = 0
    n_trim = 0
    for q in range(m):
        i = idx[q]
        e = min(accepted[q] + 1, out[i] - gen[i])
        emitted += e
        new_c = c[q] + e
        computed[i] = new_c
        gen[i] += e
        if k:
            dcomp[i] = min(c[q] + k, new_c)
        trim = held0[q] + grow[q] - max(held0[q], (new_c + bt - 1) // bt)
        if trim:
            anon[i] -= trim
            n_trim += trim
    if n_trim:
        P.release(p, np.empty(0, np.int64), np.int64(0), n_trim, fst[T.F_NOW], -1, -1)
    if kind == SP_UCB or kind == SP_ACC:  # (10) normalized reward in [0, 1]
        bound = 0.0
        for a in range(ip[Q_N_ARMS]):
            ka, _ = arm_of(sr, a)
            bound = max(bound, m * (ka + 1) / _time_s(sr, a, c, lag, times, dmemo, vmemo,
                                                          tmp))
        _learn(ss, kind, ctx_id, j, k, d, min(1.0, emitted / dt / bound), ten, accepted)
    elif kind == SP_PYTHON:
        with objmode():
            HK.spec_observe(cfg[T.C_HOOK], j, k, accepted[:m].copy(), emitted, dt)
    _count(sr.counts, k, m, accepted, emitted)
    for q in range(m):
        i = idx[q]
        if gen[i] >= out[i]:
            T.finish(req, rep, cfg, i)
    return True
