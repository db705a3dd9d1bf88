"""Decode runs (numba): the pure-decode iterations of one batch between events, rule (15) of
``models/simulator.md``, planned by :mod:`lpserve.sim._step_kernels`.

A run is what the planning steps at each of its iteration ends would do: it stops at the
replica's next event (a release, a copy or load end), at ``stop``, where a request finishes,
where a token needs a block the plain free list cannot give, and at the scheduler's next
quantum tick when the step there could plan differently (``_step_kernels.tick_replans``).
A scheduler whose state moves when it is asked (``_ranks.ASK_TIMED``: MLFQ's service credit,
the program-level schedulers' attained service) is asked at every planning step, so a run
that goes past its ticks asks it at the first iteration end after each tick, where the
step would have (:func:`_advance`): the run then equals its iterations for it too.
"""
from __future__ import annotations

import numpy as np
from numba import njit, objmode

from lpserve.kernels import dpp as D
from lpserve.sim import _pool as P
from lpserve.sim import _ranks as RK
from lpserve.sim import _state_kernels as T
from lpserve.sim import _step_kernels as S
from lpserve.sim import _swap_kernels as X
from lpserve.sim import hooks as H
from lpserve.sim._kernels import STOP_TIME, decode_advance

_BIG = 1 << 62


@njit(cache=True)
def _advance(req, rep, cfg, cff, params, rk, ctx, gen, out, held, free, now, stop_s,
             max_iters):
    """:func:`~lpserve.sim._kernels.decode_advance` over the run, in pieces between the
    quantum ticks of an ask-timed scheduler, asked at the end of each piece (its state at
    the first iteration end after a tick, as the planning step there). Same results as
    ``decode_advance``: ``(iterations, end s, blocks taken, stop reason, block * s)``."""
    used = P.used(rep.pool)
    bt = cfg[T.C_BT]
    q = cff[T.D_QUANTUM]
    if not (q > 0.0 and RK.ask_timed(cfg[T.C_RANK_KIND])):
        return decode_advance(params, ctx, gen, out, held, bt, free, used, now, stop_s,
                              max_iters)
    n, taken, area, t = 0, 0, 0.0, now
    while True:
        tick_s = min(stop_s, RK.next_tick_s(t, q))
        k, t, got, reason, a = decode_advance(params, ctx, gen, out, held, bt, free - taken,
                                              used + taken, t, tick_s, max_iters - n)
        n += k
        taken += got
        area += a
        if reason != STOP_TIME or t >= stop_s or n >= max_iters:
            return n, t, taken, reason, area
        rep.fst[T.F_NOW] = t  # the step after the tick asks first (models/simulator.md (16))
        S.rank_now(req, rep, cfg, rk)


@njit(cache=True)
def _controller_limit(req, rep, cfg, ctl, params, idx, ctx, gen, out, held0, now, used0,
                      total, max_iters):
    """The most iterations a budget controller lets the run take (``max_iters`` without
    one): never past the first finish; a controller written in Python is asked (a pause),
    the drift-plus-penalty twin plans the run."""
    c = cfg[T.C_CTL]
    if c == S.CTL_NONE:
        return max_iters
    n_dec = idx.shape[0]
    left = out[0] - gen[0]
    for k in range(n_dec):
        left = min(left, out[k] - gen[k])
    max_iters = min(max_iters, left)
    if c == S.CTL_PYTHON:  # the controller may decide again within the run (a pause)
        handle = cfg[T.C_HOOK]
        with objmode(lim="int64"):
            lim = H.decode_limit(handle, idx, ctx, held0, max_iters)
        max_iters = lim
    if c == S.CTL_DPP and rep.ctl_x[S.X_QTOK] > 0 and max_iters > 1:
        npl = int(rep.ctl_x[S.X_NPLAN])
        first = S.ctl_first_gaps(rep, idx, now)
        k_lim, _ = D.dpp_decode_run(params, ctl.cp, rep.ctl_st, ctx.copy(), held0.copy(),
                                    first, used0, total, rep.ctl_x[S.X_QTOK], rep.ctl_q,
                                    ctl.w, rep.ctl_plan[0, :npl], rep.ctl_plan[1, :npl],
                                    int(rep.ctl_x[S.X_CAP]), int(rep.ctl_x[S.X_U]),
                                    max_iters, np.bool_(True), now)
        max_iters = max(k_lim, 1)
    return max_iters


@njit(cache=True)
def decode_run(req, rep, cfg, cff, params, rk, ctl, dec, n_dec, stop):
    """A run of pure-decode iterations of ``dec[:n_dec]`` until an event."""
    ist, fst = rep.ist, rep.fst
    idx = dec[:n_dec].copy()
    ctx = np.empty(n_dec, np.int64)
    gen = np.empty(n_dec, np.int64)
    out = np.empty(n_dec, np.int64)
    held0 = np.empty(n_dec, np.int64)
    for k in range(n_dec):
        i = idx[k]
        ctx[k] = req.computed[i]
        gen[k] = req.gen[i]
        out[k] = req.out[i]
        held0[k] = req.anon[i] + req.nslots[i]
    held = held0.copy()
    now = fst[T.F_NOW]
    stop_s = min(stop, S.next_event_s(rep))  # releases, copy and load ends (29), (35)
    q = cff[T.D_QUANTUM]
    if q > 0.0 and S.tick_replans(rep, cfg):
        stop_s = min(stop_s, RK.next_tick_s(now, q))  # always > now
    p = rep.pool
    used0 = float(P.used(p))
    total = float(p.ist[P.P_TOTAL])
    max_iters = _controller_limit(req, rep, cfg, ctl, params, idx, ctx, gen, out, held0,
                                  now, used0, total, 1 if cfg[T.C_REFERENCE] else _BIG)
    free = p.ist[P.P_PLAIN]
    if cfg[T.C_PROACTIVE]:
        free = min(free, X.resident_cap(req, rep, cfg))
    if cfg[T.C_PRIO] and ist[T.I_NWAIT] > 0:
        cap = S.free_cap(req, rep, cfg, rk)
        free = min(free, max(cap, 0))
        if cap < 0:
            max_iters = 1
    ctx0 = ctx.copy()
    n, now2, taken, _, area = _advance(req, rep, cfg, cff, params, rk, ctx, gen, out, held,
                                       free, now, stop_s, max_iters)
    c = cfg[T.C_CTL]
    if c == S.CTL_PYTHON:
        handle = cfg[T.C_HOOK]
        with objmode():
            H.observe_decode_run(handle, n)
    elif c != S.CTL_NONE:
        first = S.ctl_first_gaps(rep, idx, now)
        npl = int(rep.ctl_x[S.X_NPLAN]) if c == S.CTL_DPP else 0
        _, end = D.dpp_decode_run(params, ctl.cp, rep.ctl_st, ctx0, held0, first, used0,
                                  total, rep.ctl_x[S.X_QTOK], rep.ctl_q, ctl.w,
                                  rep.ctl_plan[0, :npl], rep.ctl_plan[1, :npl], np.int64(0),
                                  np.int64(0), n, np.bool_(False), now)
        for k in range(n_dec):
            rep.ctl_lt[idx[k]] = end
    if n == 0:
        raise RuntimeError("internal: empty decode run")
    if cfg[T.C_LOG]:  # the reference mode: one iteration
        e = np.empty(0, np.int64)
        T.log_iteration(cfg, now, now2 - now, e, e, e, idx)
    P.take_anon(p, taken)
    for k in range(n_dec):
        i = idx[k]
        req.anon[i] += held[k] - held0[k]
        req.computed[i] = ctx[k]
        req.gen[i] = gen[k]
    fst[T.F_BUSY] += now2 - now
    fst[T.F_NOW] = now2
    fst[T.F_AREA] += area
    ist[T.I_ITERS] += n
    ist[T.I_DITERS] += n
    for k in range(n_dec):
        i = idx[k]
        if req.gen[i] >= req.out[i]:
            T.finish(req, rep, cfg, i)
    return True
