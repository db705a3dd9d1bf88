"""The replica engine's step planner (numba): one scheduling step, rules (9)-(13) of
``models/simulator.md``, on the arrays of :mod:`lpserve.sim._state_kernels`.

One call of :func:`advance` runs every planning step that starts before ``stop_s``
(at most ``max_steps``; one for the event loop's conservative stepping and for
``check=True``), each either one iteration or a run of pure-decode iterations between
events (:mod:`lpserve.sim._run_kernels`). Ranks come from the scheduler's
compiled twin (:mod:`lpserve.sim._ranks`), computed at the points of the step where a
decision needs them, or, for a scheduler written in Python, from ``req.rk`` as
the event loop filled them at the start of the step (:data:`NEED_RANKS`). The
drift-plus-penalty budget controller runs as :mod:`lpserve.kernels.dpp`.
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit, objmode

from lpserve.cost import iteration_time
from lpserve.kernels import dpp as D
from lpserve.sim import _link_kernels as LK
from lpserve.sim import _offload_kernels as O
from lpserve.sim import _pool as P
from lpserve.sim import _ranks as RK
from lpserve.sim import _spec_kernels as SP
from lpserve.sim import _state_kernels as T
from lpserve.sim import _swap_kernels as X
from lpserve.sim import hooks as H
from lpserve.sim._structs import CTL_FIELDS, RK_FIELDS

#: the scheduler's compiled state and the budget controller's parameters (Python side;
#: the kernels take the structures of :mod:`lpserve.sim._structs` over them)
Rk = namedtuple("Rk", RK_FIELDS)
Ctl = namedtuple("Ctl", CTL_FIELDS)

# advance() results
IDLE, STEPPED, NEED_RANKS, NEED_ROOM = 0, 1, 2, 3
# budget controllers: none, the twins of DPP and the TBT recorder, one written in Python
#: a request hitting this many cached tokens is a returning session (two 512-token blocks,
#: the rule of the replay's session evictor)
SESSION_MIN_HIT_TOKENS = 1024
CTL_NONE, CTL_DPP, CTL_RECORDER, CTL_PYTHON = 0, 1, 2, 3
# ctl_x (per replica controller scalars)
X_U, X_CAP, X_QTOK, X_RESUMABLE, X_NPLAN = range(5)
_BIG = 1 << 62


# ===================================================================================== ranks
@njit(cache=True)
def candidates(req, rep, rk):
    """Waiting then running requests into ``rk.cand`` (with ``rk.run`` flags); count."""
    m = 0
    k = rep.ist[T.I_WHEAD]
    while k >= 0:
        rk.cand[m] = k
        rk.run[m] = 0
        m += 1
        k = req.wnext[k]
    for j in range(rep.ist[T.I_NRUN]):
        rk.cand[m] = rep.run[j]
        rk.run[m] = 1
        m += 1
    return m


@njit(cache=True)
def ensure_ranks(req, rep, cfg, rk):
    """Compute this step's ranks of the replica's candidates into ``req.rk`` (once)."""
    if rep.ist[T.I_RANKED] == 0 and (rep.ist[T.I_NRUN] > 0 or rep.ist[T.I_NWAIT] > 0):
        rank_now(req, rep, cfg, rk)


@njit(cache=True)
def rank_now(req, rep, cfg, rk):
    """Rank the replica's candidates into ``req.rk`` now, none too: a swap-in joining an
    empty replica asks first with none (``models/simulator.md`` (28)), so a scheduler that
    credits the time between two decisions never credits the time the replica was empty."""
    rep.ist[T.I_RANKED] = 1
    kind = cfg[T.C_RANK_KIND]
    if kind == T.RANK_EXTERNAL:
        return  # filled by the event loop at the start of the step
    m = candidates(req, rep, rk)
    res = np.empty(m)
    RK.ranks(kind, rk.fp, rk.ip, rk.cand, rk.run, m, rep.fst[T.F_NOW], cfg[T.C_INDEX],
             req.arrival, req.prompt, req.gen, req.computed, req.out, req.tenant, req.plo,
             req.phi, cfg[T.C_HAS_PRED] != 0, req.prog, cfg[T.C_TOTAL], cfg[T.C_BT], rk.rf,
             rk.ri, rk.pf, rk.xf, rk.xi, rk.xr, rk.g, res)
    for k in range(m):
        req.rk[rk.cand[k]] = res[k]


@njit(cache=True)
def worst_running(req, rep):
    """Running request with the worst ``(rank, position)`` (-1 if none)."""
    best = -1
    bk = -np.inf
    for pos in range(rep.ist[T.I_NRUN]):
        i = rep.run[pos]
        r = req.rk[i]
        if best < 0 or r >= bk:
            best, bk = i, r
    return best


@njit(cache=True)
def waiting_by_rank(req, rep):
    """Waiting requests with a finite rank, by (rank, queue position)."""
    ids = T.waiting_ids(req, rep)
    r = np.empty(ids.shape[0])
    for k in range(ids.shape[0]):
        r[k] = req.rk[ids[k]]
    order = np.argsort(r, kind="mergesort")
    m = 0
    for k in range(order.shape[0]):
        if r[order[k]] != np.inf:
            m += 1
    out = np.empty(m, np.int64)
    j = 0
    for k in range(order.shape[0]):
        if r[order[k]] != np.inf:
            out[j] = ids[order[k]]
            j += 1
    return out


@njit(cache=True)
def free_cap(req, rep, cfg, rk):
    """Most blocks a decode run may take before a priority preemption could fire (the
    free blocks less what the outranking waiting requests need)."""
    ensure_ranks(req, rep, cfg, rk)
    worst = -np.inf
    for j in range(rep.ist[T.I_NRUN]):
        worst = max(worst, req.rk[rep.run[j]])
    p = rep.pool
    max_need = p.ist[P.P_TOTAL] - cfg[T.C_WM]
    total = 0
    any_need = False
    k = rep.ist[T.I_WHEAD]
    while k >= 0:
        r = req.rk[k]
        if r != np.inf and r < worst:
            nd = T.admit_need(req, rep, cfg, k)
            if nd <= max_need:
                total += nd
                any_need = True
        k = req.wnext[k]
    if not any_need:
        return _BIG
    return P.available(p) - cfg[T.C_WM] + X.link_net(rep) - total


# ===================================================================================== admission
@njit(cache=True)
def _admit_held(req, rep, cfg, cswap_tab, i):
    """Admit request ``i`` whose KV is held elsewhere (swapped out to the host by a serial
    swap, or computed by a prefill replica): its blocks come back in this step's
    iteration; False (nothing done) when they would leave fewer free blocks than the
    watermark."""
    ist, p, bt = rep.ist, rep.pool, cfg[T.C_BT]
    n = req.swap_gpu[i] if req.swapped[i] else (req.computed[i] + bt - 1) // bt
    if P.available(p) - n < cfg[T.C_WM]:
        return False
    T.make_room(req, rep, cfg, n)
    P.take_anon(p, n)
    req.anon[i] = n
    if req.swapped[i]:
        ist[T.I_HOST_FREE] += req.host_blocks[i]
        if req.compressed[i]:  # dequantize pass and compressed PCIe bytes
            rep.fst[T.F_SWAP_S] += cswap_tab[n]
            req.compressed[i] = False
        else:
            ist[T.I_SWAP_BLOCKS] += n
        req.host_blocks[i] = 0
        req.swap_gpu[i] = 0
        req.swapped[i] = False
    req.kv_remote[i] = False
    ist[T.I_RESUMED] = 1
    return True


@njit(cache=True)
def admit(req, rep, cfg, cff, swap_tab, cswap_tab, rk, budget, ch_i, ch_c, ch_h, n_ch,
          allow_chunk, ready):
    """Admit waiting requests in rank order as prefill chunks; returns ``(n_ch, budget)``.
    Only requests with ``req.ready <= ready`` are candidates (``schedule_ahead``)."""
    ensure_ranks(req, rep, cfg, rk)
    ist, p, bt, tier = rep.ist, rep.pool, cfg[T.C_BT], rep.off
    now = rep.fst[T.F_NOW]
    wm = cfg[T.C_WM]
    order = waiting_by_rank(req, rep)
    hits = rep.hold
    for t in range(order.shape[0]):
        i = order[t]
        if ist[T.I_NRUN] + ist[T.I_NLOAD] >= cfg[T.C_MAX_SEQS] or budget <= 0:
            break
        if req.ready[i] > ready:
            continue
        L = req.prompt[i] + req.gen[i]
        if cfg[T.C_LINK] and (req.swapped[i] or req.xfer[i] != T.XF_NONE):
            got = X.admit_swapped(req, rep, cfg, cff, swap_tab, i)
            if got < 0:
                ist[T.I_BLOCKED], ist[T.I_BLOCKED_NEED] = i, T.admit_need(req, rep, cfg, i)
                break
            if got > 0:
                ist[T.I_RESUMED] = 1
            continue
        if req.swapped[i] or req.kv_remote[i]:
            if not _admit_held(req, rep, cfg, cswap_tab, i):
                break
        else:
            n_hits = 0
            nk = 0
            if cfg[T.C_CACHING]:
                nk = T.block_keys(req, cfg, i)
                n_hits = P.match(p, req.keybuf, nk, hits)
            # the host tier's leading run after the GPU hits counts as cached (35)
            n_host = O.match(tier, req.keybuf, n_hits, nk) if tier.oi[O.O_ON] else 0
            cached = min((n_hits + n_host) * bt, L - 1)
            n_load = max((cached + bt - 1) // bt - n_hits, 0) if n_host else 0
            chunk = 0 if n_load else L - cached  # a loading request waits for it (35)
            if chunk > budget:
                if not allow_chunk:
                    if L > cfg[T.C_BUDGET]:
                        T.w_remove(req, rep, i)
                        T.reject(req, i, np.int64(T.R_CTX_BUDGET))
                        continue
                    break
                chunk = budget
            res = cfg[T.C_RESERVE]
            target = res if res > 0 else (cached + chunk + bt - 1) // bt
            full = res if res > 0 else (L + bt - 1) // bt
            if full > p.ist[P.P_TOTAL] - wm:
                T.w_remove(req, rep, i)
                T.reject(req, i, np.int64(T.R_CTX_KV))
                continue
            n_hit_free = 0
            for k in range(n_hits):
                if p.si[P.S_REF, hits[k]] == 0:
                    n_hit_free += 1
            if P.available(p) - n_hit_free - (target - n_hits) < wm:
                ist[T.I_BLOCKED], ist[T.I_BLOCKED_NEED] = i, n_hit_free + target - n_hits
                break
            gap = 0.0
            if n_hits * bt >= SESSION_MIN_HIT_TOKENS:  # a returning session
                gap = now - p.sf[P.F_LAST, hits[n_hits - 1]]
                req.turn_gap[i] = gap
            P.acquire(p, hits, n_hits, now, gap)
            off = req.slot_off[i]
            for k in range(n_hits):
                req.slot_buf[off + k] = hits[k]
            req.nslots[i] = n_hits
            req.computed[i] = cached
            req.cached_tok[i] += cached
            req.seen_tok[i] += L
            T.alloc_prompt_blocks(req, rep, cfg, i, target, now)
            if tier.oi[O.O_ON]:  # a load from the host tier (35)
                T.block_keys(req, cfg, i)  # (an eviction above may have used the buffer)
                O.touch(tier, req.keybuf, 0, n_hits + n_load)
                req.link_wait[i] += O.admit_load(tier, i, n_load, cached, n_hits * bt, now)
                if n_load:
                    ist[T.I_RESUMED] = 1  # it joins a batch planned again
            if chunk:
                ch_i[n_ch] = i
                ch_c[n_ch] = chunk
                ch_h[n_ch] = cached
                n_ch += 1
                budget -= chunk
        if math.isnan(req.first_sched[i]):
            req.first_sched[i] = now
        T.w_remove(req, rep, i)
        T.r_append(rep, i)
        req.status[i] = T.ST_RUNNING
    return n_ch, budget


# ===================================================================================== controller
@njit(cache=True)
def dpp_budget(req, rep, cfg, rk, ctl, params, dec, n_dec, cap):
    """:meth:`lpserve.policies.lyapunov.DPPController.budget` on the replica's arrays."""
    ensure_ranks(req, rep, cfg, rk)
    x, q = rep.ctl_x, rep.ctl_q
    nq = q.shape[0]
    for c in range(nq):
        q[c] = 0.0
    m = candidates(req, rep, rk)
    left = np.empty(m, np.int64)
    resumable = False
    for k in range(m):
        i = rk.cand[k]
        raw = req.prompt[i] + req.gen[i] - req.computed[i]
        ready = req.swapped[i] or req.kv_remote[i]
        lf = 0 if ready else raw
        if lf <= 1 and rk.run[k]:
            lf = 0
        left[k] = lf
        c = min(max(req.tenant[i], 0), nq - 1) if nq > 1 else 0
        q[c] += float(lf)
        if ready and not rk.run[k]:
            resumable = True
    qtok = 0.0
    for c in range(nq):
        qtok += q[c]
    x[X_QTOK] = qtok
    x[X_RESUMABLE] = 1.0 if resumable else 0.0
    # the plan: partial prefills by (rank, position), then waiting ones by (rank, position)
    nw = rep.ist[T.I_NWAIT]
    pos = np.empty(m, np.int64)
    key = np.empty(m)
    grp = np.empty(m, np.int64)
    n = 0
    for k in range(nw, m):
        if left[k] > 0:
            pos[n], key[n], grp[n] = k, req.rk[rk.cand[k]], 0
            n += 1
    for k in range(nw):
        if left[k] > 0 and req.rk[rk.cand[k]] != np.inf:
            pos[n], key[n], grp[n] = k, req.rk[rk.cand[k]], 1
            n += 1
    o1 = np.argsort(pos[:n], kind="mergesort")
    o2 = o1[np.argsort(key[:n][o1], kind="mergesort")]
    order = o2[np.argsort(grp[:n][o2], kind="mergesort")]
    plan = rep.ctl_plan
    total = 0
    n_plan = 0
    for t in range(n):
        i = rk.cand[pos[order[t]]]
        tok = req.prompt[i] + req.gen[i] - req.computed[i]
        plan[0, n_plan] = tok
        plan[1, n_plan] = req.computed[i]
        n_plan += 1
        total += tok
        if total >= cap:
            break
    x[X_NPLAN] = n_plan
    ctx = np.empty(n_dec, np.int64)
    for k in range(n_dec):
        ctx[k] = req.computed[dec[k]]
    p = rep.pool
    u = D.dpp_decide(params, ctl.cp, rep.ctl_st, q, ctl.w, plan[0, :n_plan], plan[1, :n_plan],
                     ctx, float(P.used(p)), float(p.ist[P.P_TOTAL]), cap)
    x[X_U] = u
    x[X_CAP] = cap
    if u == 0 and cap > 0 and resumable:
        return 1
    return u


@njit(cache=True)
def ctl_observe(req, rep, cfg, ctl, params, dt, ch_c, ch_h, n_ch, dctx, n_dec, done, n_done):
    """:meth:`lpserve.policies.lyapunov.TBTRecorder.observe` of one iteration, or the
    ``observe`` of a controller written in Python (a pause: ``done[:n_done]`` produce a
    token in it)."""
    if cfg[T.C_CTL] == CTL_PYTHON:
        handle = cfg[T.C_HOOK]
        produced = done[:n_done].copy()
        d = dctx[:n_dec].copy()
        pt = ch_c[:n_ch].copy()
        pc = ch_h[:n_ch].copy()
        with objmode():
            H.observe_iteration(handle, dt, pt, pc, d, produced)
        return
    now = rep.fst[T.F_NOW]
    lt = rep.ctl_lt
    gaps = np.empty(n_done)
    ng = 0
    for k in range(n_done):
        i = done[k]
        t = lt[i]
        if req.gen[i] >= 1 and not math.isnan(t):
            gaps[ng] = now - t
            ng += 1
        lt[i] = now
    st = rep.ctl_st
    pen = 0.0
    if cfg[T.C_CTL] == CTL_DPP and n_dec > 0 and n_ch > 0:
        t0 = iteration_time(params, np.empty(0, np.int64), np.empty(0, np.int64), dctx[:n_dec])
        t1 = iteration_time(params, ch_c[:n_ch], ch_h[:n_ch], dctx[:n_dec])
        pen = n_dec * (t1 - t0)
    st[D.ST_LAST_PEN] = pen
    p = rep.pool
    D.dpp_observe(ctl.cp, st, dt, n_dec, float(P.used(p)), float(p.ist[P.P_TOTAL]),
                  rep.ctl_x[X_QTOK], gaps[:ng])
    rep.ctl_x[X_QTOK] = 0.0


@njit(cache=True)
def ctl_first_gaps(rep, idx, now):
    """``first_gap_s`` of :func:`lpserve.kernels.dpp.dpp_decode_run` for a run starting at
    ``now`` (s): seconds since each of requests ``idx`` last produced a token (0 before its
    first token)."""
    lt = rep.ctl_lt
    first = np.empty(idx.shape[0])
    for k in range(idx.shape[0]):
        t = lt[idx[k]]
        first[k] = 0.0 if math.isnan(t) else now - t
    return first


# ===================================================================================== iterations
@njit(cache=True)
def produce(req, rep, cfg, cff, i):
    """Request ``i`` produced a token at ``now``."""
    req.gen[i] += 1
    if math.isnan(req.first_token[i]):
        req.first_token[i] = rep.fst[T.F_NOW]
    if req.gen[i] >= req.out[i]:
        T.finish(req, rep, cfg, i)
    elif cfg[T.C_ROLE] == T.ROLE_PREFILL:
        T.handoff(req, rep, cfg, cff, i)


@njit(cache=True)
def account(rep, dt, n_iters, decode_only):
    """Advance the clock by ``n_iters`` iterations taking ``dt`` seconds in all."""
    fst = rep.fst
    fst[T.F_NOW] += dt
    fst[T.F_BUSY] += dt
    fst[T.F_AREA] += P.used(rep.pool) * dt
    rep.ist[T.I_ITERS] += n_iters
    if decode_only:
        rep.ist[T.I_DITERS] += n_iters


@njit(cache=True)
def iterate(req, rep, cfg, cff, params, swap_tab, ctl, sr, ch_i, ch_c, ch_h, n_ch, dec,
            n_dec):
    """One iteration with prefill chunks and/or decodes (blocks already allocated)."""
    dctx = np.empty(n_dec, np.int64)
    for k in range(n_dec):
        dctx[k] = req.computed[dec[k]]
    dt = iteration_time(params, ch_c[:n_ch], ch_h[:n_ch], dctx)
    if cfg[T.C_SPEC]:  # the drafts prefill the chunks too
        dt += SP.prefill_s(sr, req, ch_i, ch_c, ch_h, n_ch)
    ist, fst = rep.ist, rep.fst
    wait = 0.0
    if ist[T.I_SWAP_BLOCKS]:
        if ist[T.I_SWAP_BLOCKS] >= swap_tab.shape[0]:
            raise RuntimeError("internal: swap table too small")  # advance() grows it
        sw = swap_tab[ist[T.I_SWAP_BLOCKS]] * cff[T.D_KV_SCALE]
        dt += sw
        fst[T.F_SWAP_WAIT] += sw
        wait += sw
        ist[T.I_SWAP_BLOCKS] = 0
    if fst[T.F_SWAP_S]:  # serial swaps; on the link, only (de)quantize passes
        dt += fst[T.F_SWAP_S]
        fst[T.F_SWAP_WAIT] += fst[T.F_SWAP_S]
        if not cfg[T.C_LINK]:
            wait += fst[T.F_SWAP_S]
        fst[T.F_SWAP_S] = 0.0
    if wait:  # every request of this iteration waits for the serial copies (rule (29))
        for k in range(n_ch):
            req.link_wait[ch_i[k]] += wait
        for k in range(n_dec):
            req.link_wait[dec[k]] += wait
    if cfg[T.C_LOG]:
        T.log_iteration(cfg, fst[T.F_NOW], dt, ch_i[:n_ch].copy(), ch_c[:n_ch].copy(),
                      ch_h[:n_ch].copy(), dec[:n_dec].copy())
    account(rep, dt, np.int64(1), n_ch == 0)
    done = np.empty(n_ch + n_dec, np.int64)
    nd = 0
    tier = rep.off
    for k in range(n_ch):
        i = ch_i[k]
        req.computed[i] += ch_c[k]
        if tier.oi[O.O_ON]:  # write-through store of the completed blocks to the host tier
            nk = T.block_keys(req, cfg, i)
            O.touch(tier, req.keybuf, ch_h[k] // cfg[T.C_BT],
                    min((ch_h[k] + ch_c[k]) // cfg[T.C_BT], nk))
        if req.computed[i] == req.prompt[i] + req.gen[i]:
            done[nd] = i
            nd += 1
    for k in range(n_dec):
        i = dec[k]
        req.computed[i] += 1
        done[nd] = i
        nd += 1
    if cfg[T.C_CTL] != CTL_NONE:
        ctl_observe(req, rep, cfg, ctl, params, dt, ch_c, ch_h, n_ch, dctx, n_dec, done, nd)
    for k in range(nd):
        produce(req, rep, cfg, cff, done[k])
    return True


@njit(cache=True)
def next_event_s(rep):
    """The replica's next release, copy end on its host link or end of a load from the host
    tier (inf if none)."""
    t = min(T.next_release_s(rep), LK.next_end_s(rep.link))
    if rep.off.oi[O.O_ON]:
        t = min(t, O.next_end(rep.off, rep.fst[T.F_NOW]))
    return t


@njit(cache=True)
def tick_replans(rep, cfg):
    """Whether a planning step at the scheduler's next quantum boundary can plan
    differently from the decode run in progress (rule (15)): a request waits (admission
    and priority preemption read ranks), a budget controller decides per run, or the
    scheduler is written in Python (asked at every planning step, so the run stops where
    the reference mode's does). Otherwise the step there would run the same batch on: the
    run goes past the boundary (a built-in scheduler's ranks are computed only when a
    decision needs one, from the step's clock; an ask-timed one is asked within the run,
    ``_run_kernels._advance``)."""
    return rep.ist[T.I_NWAIT] > 0 or cfg[T.C_CTL] != CTL_NONE or \
        cfg[T.C_RANK_KIND] == T.RANK_EXTERNAL
