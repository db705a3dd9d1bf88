"""The compiled replica engine's entry points (numba): :func:`advance` (run planning
steps until an event), :func:`enqueue` (a request joins a replica) and the step itself
(``models/simulator.md``).
Layouts are in :mod:`lpserve.sim._state_kernels`, the step's parts in
:mod:`lpserve.sim._step_kernels`.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, objmode

from lpserve.kernels import history as H
from lpserve.sim import _evict_kernels as E
from lpserve.sim import _link_kernels as L
from lpserve.sim import _offload_kernels as O
from lpserve.sim import _pool as P
from lpserve.sim import _preempt_kernels as PK
from lpserve.sim import _ranks as RK
from lpserve.sim import _run_kernels as RUN
from lpserve.sim import _session_evict as SE
from lpserve.sim import _spec_kernels as SP
from lpserve.sim import _state_kernels as T
from lpserve.sim import _step_kernels as S
from lpserve.sim import _swap_kernels as X
from lpserve.sim import hooks as HK


@njit(cache=True)
def reject_reason(req, cfg, i, total, wm):
    """Why request ``i`` can never be served here (0 if it can): ``State.reject_reason``."""
    p = req.prompt[i]
    bt = cfg[T.C_BT]
    if cfg[T.C_MAX_LEN] > 0 and p + req.out[i] > cfg[T.C_MAX_LEN]:
        return T.R_MAX_LEN
    if cfg[T.C_RESERVE] and cfg[T.C_RESERVE] > total:
        return T.R_PROMPT_KV
    if (p + 1 + bt - 1) // bt > total - wm:
        return T.R_PROMPT_KV
    if not cfg[T.C_CHUNKED] and p > cfg[T.C_BUDGET] and not req.kv_remote[i]:
        return T.R_PROMPT_BUDGET
    return 0


@njit(cache=True)
def enqueue(req, rep, cfg, i, t):
    """Request ``i`` joins this replica at ``t`` (the replica already advanced to ``t``);
    returns the rejection code (0: it joined the waiting list)."""
    code = reject_reason(req, cfg, i, rep.pool.ist[P.P_TOTAL], cfg[T.C_WM])
    if code:
        T.reject(req, i, code)
        return code
    if rep.fst[T.F_NOW] < t:
        rep.fst[T.F_NOW] = t
    if cfg[T.C_AHEAD] and rep.ist[T.I_NRUN] > 0:
        # the next iteration's batch was fixed when the one in progress at t started
        req.ready[i] = rep.ist[T.I_ITERS] + 1
        rep.ist[T.I_PENDING] = req.ready[i]
    T.w_append(req, rep, i)
    req.status[i] = T.ST_WAITING
    if cfg[T.C_ROLE] == T.ROLE_DECODE:
        req.decode_replica[i] = cfg[T.C_INDEX]
    else:
        req.replica[i] = cfg[T.C_INDEX]
    if cfg[T.C_OBSERVE]:
        E.observe(cfg[T.C_HOOK], 0, i, rep.fst[T.F_NOW], req.keybuf[:0])
    elif rep.pool.ist[P.P_KIND] == P.EV_GROUPS:  # a session-aware evictor learns here
        SE.learn(rep.pool, False, rep.fst[T.F_NOW], req.thread[i], -1, req.prompt[i],
                 req.prompt[i], cfg[T.C_BT])
    return 0


@njit(cache=True)
def preempt_worst(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk):
    """Preempt the worst-ranked running request for KV memory (rules (10), (34)); the last
    one running, with nothing being released, is dropped.
    Returns it."""
    S.ensure_ranks(req, rep, cfg, rk)
    v = S.worst_running(req, rep)
    if rep.ist[T.I_NRUN] == 1 and rep.ist[T.I_NREL] == 0:
        T.r_remove(rep, v)
        T.release_request(req, rep, v, rep.fst[T.F_NOW])
        T.reject(req, v, np.int64(T.R_CTX_KV))
    else:
        X.preempt(req, rep, cfg, cff, params, swap_tab, cswap_tab, v)
    return v


@njit(cache=True)
def _phases(req, rep, now):
    """The running requests in decode phase and in (chunked) prefill phase, in running
    order, without those loading from the host tier (35): ``(dec, n_dec, part, n_part)``."""
    n_run = rep.ist[T.I_NRUN]
    dec = np.empty(n_run, np.int64)
    part = np.empty(n_run, np.int64)
    n_dec = 0
    n_part = 0
    for k in range(n_run):
        i = rep.run[k]
        if O.loading(rep.off, i, now):
            continue
        left = req.prompt[i] + req.gen[i] - req.computed[i]
        if left == 1:
            dec[n_dec] = i
            n_dec += 1
        elif left > 1:
            part[n_part] = i
            n_part += 1
    return dec, n_dec, part, n_part


@njit(cache=True)
def _token_blocks(req, cfg, dec, n_dec):
    """Blocks the decodes ``dec[:n_dec]`` need for their next token."""
    bt = cfg[T.C_BT]
    computed, anon, nslots = req.computed, req.anon, req.nslots  # each field read once
    need = 0
    for k in range(n_dec):
        i = dec[k]
        if computed[i] + 1 > (anon[i] + nslots[i]) * bt:
            need += 1
    return need


@njit(cache=True)
def _decode_blocks(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, dec, n_dec):
    """Give each decode of ``dec[:n_dec]`` the block its next token needs, evicting cached
    blocks or preempting the worst-ranked running request (rule (10)) while the free list
    is short; returns ``(n_dec, preempted)``, ``dec`` compacted in place. On the host link,
    a need the swap-outs in flight will cover stalls the step instead (``I_STALLED``: no
    blocks taken, rule (29))."""
    p = rep.pool
    need = _token_blocks(req, cfg, dec, n_dec)
    preempted = False
    while need > p.ist[P.P_PLAIN]:
        if T.make_room(req, rep, cfg, need):
            break
        if cfg[T.C_LINK] and need <= P.available(p) + rep.link.li[L.L_FREEING]:
            rep.ist[T.I_STALLED] = 1
            return n_dec, preempted
        if cfg[T.C_PROACTIVE] and PK.relieve(req, rep, cfg, cff, params, swap_tab, cswap_tab,
                                             rk):
            continue  # a resident request is swapped out (its blocks come back)
        v = preempt_worst(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk)
        m = 0
        for k in range(n_dec):
            if dec[k] != v:
                dec[m] = dec[k]
                m += 1
        n_dec = m
        need = _token_blocks(req, cfg, dec, n_dec)
        preempted = True
    if need:
        _take_token_blocks(req, rep, cfg, dec, n_dec)
    return n_dec, preempted


@njit(cache=True)
def _take_token_blocks(req, rep, cfg, dec, n_dec):
    """Each decode of ``dec[:n_dec]`` whose next token starts a block takes one from the
    free list (the caller checked there are enough)."""
    bt = cfg[T.C_BT]
    computed, anon, nslots = req.computed, req.anon, req.nslots  # each field read once
    n_grow = 0
    for k in range(n_dec):
        i = dec[k]
        if computed[i] + 1 > (anon[i] + nslots[i]) * bt:
            anon[i] += 1
            n_grow += 1
    P.take_anon(rep.pool, n_grow)


@njit(cache=True)
def _partial_chunks(req, rep, cfg, rk, part, n_part, budget, ch_i, ch_c, ch_h, n_ch):
    """Decode-first batching: the next chunks of the running prefills ``part[:n_part]``
    still running, by (rank, running position), within ``budget`` tokens and the KV room;
    appended to ``ch_*[n_ch:]``. Returns ``(n_ch, budget, no_room)``, ``no_room`` when a
    prefill got no chunk for want of KV room (rule (34))."""
    bt = cfg[T.C_BT]
    p = rep.pool
    no_room = False
    m = 0
    for k in range(n_part):  # still running (preemptions removed some)
        if T.r_index(rep, part[k]) >= 0:
            part[m] = part[k]
            m += 1
    n_part = m
    if n_part == 0:
        return n_ch, budget, no_room
    S.ensure_ranks(req, rep, cfg, rk)
    pos = np.empty(n_part, np.int64)
    key = np.empty(n_part)
    for k in range(n_part):
        pos[k] = T.r_index(rep, part[k])
        key[k] = req.rk[part[k]]
    o1 = np.argsort(pos, kind="mergesort")
    o2 = o1[np.argsort(key[o1], kind="mergesort")]
    order = part[:n_part][o2].copy()
    for k in range(n_part):
        if budget <= 0:
            break
        i = order[k]
        L = req.prompt[i] + req.gen[i]
        c = min(L - req.computed[i], budget)
        held = req.anon[i] + req.nslots[i]
        room = (held + P.available(p)) * bt - req.computed[i]
        c = min(c, room)
        if c <= 0:
            no_room |= room <= 0
            continue
        T.alloc_prompt_blocks(req, rep, cfg, i, (req.computed[i] + c + bt - 1) // bt,
                              rep.fst[T.F_NOW])
        ch_i[n_ch] = i
        ch_c[n_ch] = c
        ch_h[n_ch] = req.computed[i]
        n_ch += 1
        budget -= c
    return n_ch, budget, no_room


@njit(cache=True)
def _python_budget(handle, decodes, cap):
    """The budget a controller written in Python sets for the next iteration."""
    with objmode(b="int64"):
        b = HK.budget(handle, decodes, cap)
    return b


@njit(cache=True)
def step(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, ctl, sr, ss, stop):
    """Plan and run one iteration (or a run of decode iterations); False if idle (or
    stalled on the host link). The link is brought up to now before (:func:`advance`)."""
    ist = rep.ist
    ist[T.I_STALLED], ist[T.I_BLOCKED] = 0, -1
    pro = cfg[T.C_PROACTIVE] != 0
    if ist[T.I_NRUN] == 0 and ist[T.I_NWAIT] == 0:
        return False
    ist[T.I_RANKED] = 1 if cfg[T.C_RANK_KIND] == T.RANK_EXTERNAL else 0
    if RK.ask_timed(cfg[T.C_RANK_KIND]):  # asked at every planning step, as in Python (16)
        S.ensure_ranks(req, rep, cfg, rk)
    ist[T.I_RESUMED] = 0
    batch = cfg[T.C_BATCH]
    cap = cfg[T.C_MAX_SEQS] + 1
    ch_i = np.empty(cap, np.int64)
    ch_c = np.empty(cap, np.int64)
    ch_h = np.empty(cap, np.int64)
    n_ch = 0
    budget = cfg[T.C_BUDGET]
    # schedule_ahead (models/simulator.md (32)): requests that joined after this step's
    # batch was fixed wait, unless nothing ran (the fixed batch is then empty)
    ready = ist[T.I_ITERS] if ist[T.I_NRUN] > 0 else np.int64(1) << 62
    admit_ok = ist[T.I_NWAIT] > 0 and not (batch == T.BATCH_STATIC and ist[T.I_NRUN] > 0)
    if admit_ok and cfg[T.C_PRIO] and ist[T.I_NRUN] > 0:
        n_run = ist[T.I_NRUN]
        PK.preempt_outranked(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, ready)
        if ist[T.I_NRUN] < n_run:
            ist[T.I_RESUMED] = 1
    if batch == T.BATCH_PREFILL and admit_ok:
        n_ch, budget = S.admit(req, rep, cfg, cff, swap_tab, cswap_tab, rk, budget, ch_i,
                               ch_c, ch_h, n_ch, np.bool_(False), ready)
        admit_ok = False
        if n_ch > 0:
            if pro:
                PK.proactive(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk,
                             ist[T.I_BLOCKED], ist[T.I_BLOCKED_NEED])
            return S.iterate(req, rep, cfg, cff, params, swap_tab, ctl, sr, ch_i, ch_c, ch_h,
                             n_ch, ch_i, np.int64(0))
    now = rep.fst[T.F_NOW]
    dec, n_dec, part, n_part = _phases(req, rep, now)
    n_dec, preempted = _decode_blocks(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk,
                                      dec, n_dec)
    if ist[T.I_STALLED]:  # the swap-outs in flight free the blocks: wait for a copy end
        if pro:
            PK.proactive(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, -1, 0)
        return False
    if preempted:
        admit_ok = False  # as vLLM: no new admissions in a step that preempted
        ist[T.I_RESUMED] = 1  # the next step plans again (single iteration now)
    budget -= n_dec
    if cfg[T.C_CTL] != S.CTL_NONE and batch == T.BATCH_DECODE:
        if cfg[T.C_CTL] == S.CTL_DPP:
            budget = min(budget, S.dpp_budget(req, rep, cfg, rk, ctl, params, dec, n_dec,
                                              budget))
        elif cfg[T.C_CTL] == S.CTL_PYTHON:  # asked in a pause, its view holds the ranks
            S.ensure_ranks(req, rep, cfg, rk)
            budget = min(budget, _python_budget(cfg[T.C_HOOK], dec[:n_dec].copy(), budget))
        else:  # an observing controller leaves the budget; its view holds the ranks
            S.ensure_ranks(req, rep, cfg, rk)
    no_room = False  # a running prefill got no chunk for want of KV room (34)
    if batch == T.BATCH_DECODE:
        n_ch, budget, no_room = _partial_chunks(req, rep, cfg, rk, part, n_part, budget,
                                                ch_i, ch_c, ch_h, n_ch)
    if admit_ok and budget > 0:
        n_ch, budget = S.admit(req, rep, cfg, cff, swap_tab, cswap_tab, rk, budget, ch_i,
                               ch_c, ch_h, n_ch, cfg[T.C_CHUNKED] != 0, ready)
    freed = pro and PK.proactive(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk,
                                 ist[T.I_BLOCKED], ist[T.I_BLOCKED_NEED])
    if n_ch == 0 and n_dec == 0:
        if no_room and ist[T.I_RESUMED] == 0 and not freed and X.link_net(rep) <= 0 and \
                not (rep.off.oi[O.O_ON] and O.next_end(rep.off, now) < math.inf):  # (34)
            preempt_worst(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk)
            ist[T.I_RESUMED] = 1  # the next step plans again
        # a resumed request decodes next step, blocks freed now admit one; else idle
        return ist[T.I_RESUMED] != 0 or freed
    any_new = False
    for k in range(n_dec):
        if req.gen[dec[k]] == 0:
            any_new = True
    if n_ch > 0 or ist[T.I_SWAP_BLOCKS] or rep.fst[T.F_SWAP_S] or ist[T.I_RESUMED] or \
            (pro and ist[T.I_PRO_EVICTED]) or cfg[T.C_ROLE] == T.ROLE_PREFILL or any_new or \
            ist[T.I_PENDING] > ist[T.I_ITERS]:  # a deferred arrival joins after one
        return S.iterate(req, rep, cfg, cff, params, swap_tab, ctl, sr, ch_i, ch_c, ch_h, n_ch,
                         dec, n_dec)
    if cfg[T.C_SPEC]:  # speculative steps (lpserve/sim/_spec_kernels.py)
        return spec_run(req, rep, cfg, cff, sr, ss, dec, n_dec, stop)
    return RUN.decode_run(req, rep, cfg, cff, params, rk, ctl, dec, n_dec, stop)


@njit(cache=True)
def spec_run(req, rep, cfg, cff, sr, ss, dec, n_dec, stop):
    """Speculative steps of the decode batch ``dec[:n_dec]`` (the whole running set; blocks
    for the first step's token already allocated) until an event, each step exactly what a
    planning step would take next: the run stops where planning could differ, as a decode
    run does (``models/simulator.md`` (15)): a finish, a token block the plain free list
    cannot give, ``stop``, the next release or load end, a scheduler quantum tick. A
    controller, priority preemption with requests waiting, a running request outside the
    batch or the reference mode take one step."""
    ist, fst, p = rep.ist, rep.fst, rep.pool
    stop_s = min(stop, S.next_event_s(rep))
    q = cff[T.D_QUANTUM]
    if q > 0.0 and (S.tick_replans(rep, cfg) or RK.ask_timed(cfg[T.C_RANK_KIND])):
        stop_s = min(stop_s, RK.next_tick_s(fst[T.F_NOW], q))  # the next tick
    one = cfg[T.C_REFERENCE] != 0 or cfg[T.C_CTL] != S.CTL_NONE or ist[T.I_NRUN] != n_dec \
        or (cfg[T.C_PRIO] != 0 and ist[T.I_NWAIT] > 0)
    ws = SP.workspace(sr, n_dec)
    # the planner's other reasons for a single iteration (pending swaps, a deferred
    # arrival) cannot arise within the run: a step neither preempts nor admits
    while True:
        SP.step(req, rep, cfg, sr, ss, dec, n_dec, ws)
        if one or fst[T.F_NOW] >= stop_s:
            return True
        for k in range(n_dec):
            if req.gen[dec[k]] >= req.out[dec[k]]:
                return True
        if _token_blocks(req, cfg, dec, n_dec) > p.ist[P.P_PLAIN]:
            return True  # the planner makes room or preempts
        _take_token_blocks(req, rep, cfg, dec, n_dec)  # as the planner takes them


@njit(cache=True)
def _link_to_now(req, rep, cfg, rk, external):
    """Apply the host link's copy ends (and the starts that follow) up to now, at the
    start of a planning step; the scheduler ranks first when a swapped-in request joins
    the batch (28), with no candidates too, so link time is never service. True: a
    scheduler written in Python must rank first (the call is repeated after it has)."""
    ist = rep.ist
    if X.joins_by(rep.link, rep.fst[T.F_NOW]):
        if external:
            if ist[T.I_RANKED] == 0:
                return True
        else:
            S.rank_now(req, rep, cfg, rk)
        X.tick(req, rep, cfg, rep.fst[T.F_NOW])
        ist[T.I_RANKED] = 0  # the step ranks again, after the join
        return False
    X.tick(req, rep, cfg, rep.fst[T.F_NOW])
    return False


@njit(cache=True)
def advance(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, ctl, sr, ss, t, max_steps):
    """Run the planning steps that start before ``min(t, horizon)``, at most
    ``max_steps`` of them; returns :data:`~lpserve.sim._step_kernels.IDLE` (nothing more
    to do before ``t``), ``STEPPED`` (``max_steps`` ran), ``NEED_RANKS`` (a scheduler
    written in Python must rank the candidates before the next step) or ``NEED_ROOM``
    (the event outbox must be drained, or the release arena or the swap table
    ``swap_tab`` grown first)."""
    stop = min(t, cff[T.D_HORIZON])
    steps = 0
    external = cfg[T.C_RANK_KIND] == T.RANK_EXTERNAL
    per_step = cfg[T.C_MAX_SEQS] + 1  # most events and released slot lists of one step
    while True:
        if steps >= max_steps:
            return S.STEPPED
        if rep.ist[T.I_NEV] + per_step > rep.ev_i.shape[0]:
            return S.NEED_ROOM
        if rep.ist[T.I_ARENA] + per_step * req.keybuf.shape[0] > rep.arena.shape[0]:
            T.compact_arena(rep)
            if rep.ist[T.I_ARENA] + per_step * req.keybuf.shape[0] > rep.arena.shape[0]:
                return S.NEED_ROOM
        if rep.ist[T.I_SWAP_BLOCKS] + cfg[T.C_SWAP_STEP] + 1 >= swap_tab.shape[0]:
            return S.NEED_ROOM  # the next step could swap past the price table: grow it
        T.apply_releases(rep)
        if rep.fst[T.F_NOW] >= stop:
            return S.STEPPED if steps else S.IDLE
        if cfg[T.C_LINK] and _link_to_now(req, rep, cfg, rk, external):
            return S.NEED_RANKS  # a Python scheduler ranks before a swap-in joins
        if external and rep.ist[T.I_RANKED] == 0 and \
                (rep.ist[T.I_NRUN] > 0 or rep.ist[T.I_NWAIT] > 0):
            return S.NEED_RANKS
        ran = step(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, ctl, sr, ss, stop)
        rep.ist[T.I_RANKED] = 0
        if not ran:
            nr = S.next_event_s(rep)
            if nr < stop:
                now = rep.fst[T.F_NOW]
                if rep.ist[T.I_STALLED] and nr > now:  # the batch waits on the link (29)
                    for j in range(rep.ist[T.I_NRUN]):
                        req.link_wait[rep.run[j]] += nr - now
                rep.fst[T.F_NOW] = max(now, nr)
                steps += 1
                continue
            return S.IDLE
        steps += 1


@njit(cache=True)
def enqueue_all(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, ctl, sr, ss, ids, times,
                k):
    """Requests ``ids[k:]`` join this replica at ``times[k:]`` (non-decreasing, each before
    the horizon), each after every planning step that starts before its time: the same as
    :func:`advance` to ``times[k]`` then :func:`enqueue` per request. Returns ``(k, code)``:
    ``k == len(ids)`` and ``IDLE`` when every request joined, else the first request not
    yet joined and the :func:`advance` code (``NEED_RANKS`` or ``NEED_ROOM``) the caller
    must serve before calling again from ``k``."""
    n = ids.shape[0]
    while k < n:
        t = times[k]
        code = advance(req, rep, cfg, cff, params, swap_tab, cswap_tab, rk, ctl, sr, ss, t,
                       1 << 62)
        if code == S.NEED_RANKS or code == S.NEED_ROOM:
            return k, code
        enqueue(req, rep, cfg, ids[k], t)
        k += 1
    return k, S.IDLE


@njit(cache=True)
def enqueue_all_cluster(req, replicas, cfgs, cff, params, swap_tab, cswap_tab, rk, ctl, sr,
                        n_route, ids, times, k, m, st, ip, fp, pend_t, pend_i, pst):
    """Requests ``ids[k:]`` join a cluster of ``n_route`` compiled replicas under round
    robin (request ``ids[j]`` on replica ``j mod n_route``; one replica: every request)
    at ``times[k:]``, with the online History predictor (:mod:`lpserve.kernels.history`:
    its state ``st`` and parameters ``ip, fp``) asked at each arrival as the event loop
    asks a predictor in Python (``Simulation._predict``): every replica advances to the
    arrival's time, every completion finished by then joins the buckets, by finish time
    then request, and the request's predicted interval is written to
    ``req.plo``/``req.phi`` before it joins. Completions reported but finishing later (an
    iteration that ends after the arrival) wait in ``pend_t``/``pend_i`` (``pst[0]`` of
    them, capacity one per request). ``replicas`` holds the ``(Rep, SpecRep)`` pairs of
    the replicas some request reaches; ``cfgs[r]`` is replica ``r``'s configuration.
    Returns ``(k, m, code)``: as :func:`enqueue_all`, with ``m`` the replica whose stop
    the caller must serve before calling again from ``(k, m)``."""
    n, n_rep = ids.shape[0], len(replicas)
    while k < n:
        t = times[k]
        while m < n_rep:
            rep, ss = replicas[m]
            seen = rep.ist[T.I_NEV]  # the outbox's events before this are pending or shown
            code = advance(req, rep, cfgs[m], cff, params, swap_tab, cswap_tab, rk, ctl, sr,
                           ss, t, 1 << 62)
            _pend_finished(rep, pend_t, pend_i, pst, seen)
            if code == S.NEED_RANKS or code == S.NEED_ROOM:
                return k, m, code
            m += 1
        m = 0
        _observe_due(req, st, ip, pend_t, pend_i, pst, t)
        i = ids[k]
        lo, hi, _ = H.predict_one(st, ip, fp, req.prompt[i], req.tenant[i])
        req.plo[i], req.phi[i] = lo, hi
        r = k % n_route
        enqueue(req, replicas[r][0], cfgs[r], i, t)
        k += 1
    return k, 0, S.IDLE


@njit(cache=True)
def _pend_finished(rep, pend_t, pend_i, pst, seen):
    """Append the outbox's completions from position ``seen`` to the pending ones."""
    m = pst[0]
    for e in range(seen, rep.ist[T.I_NEV]):
        if rep.ev_k[e] == T.EV_FINISH:
            pend_t[m], pend_i[m] = rep.ev_t[e], rep.ev_i[e]
            m += 1
    pst[0] = m
    return rep.ist[T.I_NEV]


@njit(cache=True)
def _observe_due(req, st, ip, pend_t, pend_i, pst, t):
    """Show the predictor the pending completions finished by ``t``, ordered by finish
    time then request; keep the others pending."""
    m = pst[0]
    due_t = np.empty(m)
    due_i = np.empty(m, np.int64)
    nd = 0
    keep = 0
    for e in range(m):
        if pend_t[e] <= t:  # insertion by (time, request): nearly sorted already
            j = nd
            while j > 0 and (due_t[j - 1] > pend_t[e] or
                             (due_t[j - 1] == pend_t[e] and due_i[j - 1] > pend_i[e])):
                due_t[j], due_i[j] = due_t[j - 1], due_i[j - 1]
                j -= 1
            due_t[j], due_i[j] = pend_t[e], pend_i[e]
            nd += 1
        else:
            pend_t[keep], pend_i[keep] = pend_t[e], pend_i[e]
            keep += 1
    pst[0] = keep
    for j in range(nd):
        i = due_i[j]
        H.observe_one(st, ip, req.prompt[i], req.tenant[i], req.out[i])
