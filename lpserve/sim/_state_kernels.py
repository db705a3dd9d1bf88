"""Array layout of the compiled replica engine and its memory operations (numba).

A replica's queues and memory (``models/simulator.md``): the waiting list (a doubly
linked list over request ids, so appends, front inserts and removals are O(1)), the
running list (admission order), request-level KV allocation with prefix keys, releases
of outgoing copies, and preemption (recompute, swap, compress-and-swap, the cost-based
per-victim rule). The step planner is :mod:`lpserve.sim._step_kernels`.

``Req`` holds the per-request arrays shared by every replica of a run (the
:class:`~lpserve.sim.state.State` arrays plus the engine's own); ``Rep`` one replica's
state; ``cfg``/``cff`` the int and float configuration of the run (layouts ``C_*`` and
``D_*``).
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import njit, objmode

from lpserve.sim import _evict_kernels as E
from lpserve.sim import _pool as P
from lpserve.sim import _session_evict as SE
from lpserve.sim import hooks as H
from lpserve.sim._structs import REP_FIELDS, REQ_FIELDS

#: the per-request arrays of a run and one replica's arrays, for the Python side (the
#: kernels take the structures of :mod:`lpserve.sim._structs` over them)
Req = namedtuple("Req", REQ_FIELDS)
Rep = namedtuple("Rep", REP_FIELDS)

# status / reason codes (lpserve.sim.state)
ST_WAITING, ST_RUNNING, ST_FINISHED, ST_REJECTED, ST_TRANSFER = 1, 2, 3, 4, 5
R_CTX_KV, R_CTX_BUDGET, R_PROMPT_KV, R_PROMPT_BUDGET, R_MAX_LEN = 1, 2, 3, 4, 5
REASONS = {R_CTX_KV: "context_exceeds_kv", R_CTX_BUDGET: "context_exceeds_token_budget",
           R_PROMPT_KV: "prompt_exceeds_kv", R_PROMPT_BUDGET: "prompt_exceeds_token_budget",
           R_MAX_LEN: "exceeds_max_model_len"}
EV_FINISH, EV_KV_READY = 0, 1

# cfg (int64)
(C_BATCH, C_MAX_SEQS, C_BUDGET, C_CHUNKED, C_RESERVE, C_WM, C_BT, C_TOTAL, C_CACHING,
 C_PREEMPT, C_PRIO, C_EVICT_BATCH, C_ROLE, C_REFERENCE, C_TRACK_FIN, C_RANK_KIND,
 C_DECIDER, C_CTL, C_TRACE_BT, C_MAX_LEN, C_HAS_PRED, C_INDEX, C_SPEC,
 C_SWAP_STEP, C_AHEAD, C_HOOK, C_OBSERVE, C_EV_QUEUE, C_EV_TREE, C_LINK, C_PROACTIVE,
 C_PRO_TARGET, C_HOST_BLOCKS, C_LOG) = range(34)
N_CFG = 34
# C_HOOK: the replica's key in lpserve.sim.hooks (0: none); C_OBSERVE: its evictor observes
# requests (written in Python); C_EV_QUEUE, C_EV_TREE: that evictor reads the queued
# blocks, the blocks' parents; C_LINK: swaps are copies on the overlapped host link
# (lpserve/sim/_swap_kernels.py), else serial; C_PROACTIVE: FastServe's proactive
# swapping on it (lpserve/sim/_preempt_kernels.py) with C_PRO_TARGET free blocks;
# C_HOST_BLOCKS: the host memory's blocks; C_LOG: the reference mode's iteration log is
# kept (every iteration is told to lpserve.sim.hooks.log_iteration)
BATCH_PREFILL, BATCH_DECODE, BATCH_MIXED, BATCH_STATIC = range(4)
PRE_RECOMPUTE, PRE_SWAP, PRE_COMPRESS = range(3)
# C_DECIDER: no preemption decider, the cost-based one's twin, one written in Python
DECIDER_NONE, DECIDER_COST, DECIDER_PYTHON = range(3)
ROLE_COLOCATED, ROLE_PREFILL, ROLE_DECODE = range(3)
RANK_EXTERNAL = -1
# cff (float64)
(D_RATIO, D_ACC_COST, D_KV_SCALE, D_TR_A, D_TR_D, D_QUANTUM, D_HORIZON, D_SWAP_BUDGET,
 D_MAX_LOSS, D_LINK_GBPS, D_SLO_TTFT, D_SLO_TPOT) = range(12)
N_CFF = 12

# ist (int64 per replica)
(I_WHEAD, I_WTAIL, I_NWAIT, I_NRUN, I_ITERS, I_DITERS, I_HOST_FREE, I_NSWAPS, I_NCOMP,
 I_NRECOMP, I_COMP_TOK, I_SWAP_BLOCKS, I_RESUMED, I_NREL, I_ARENA, I_NEV, I_RANKED,
 I_REL_SEQ, I_PENDING, I_NLOAD, I_STALLED, I_BLOCKED, I_BLOCKED_NEED, I_PRO_EVICTED,
 I_NRES) = range(25)
N_IST = 25
# I_NLOAD: requests swapping in to join the batch (a seat each); I_STALLED: the last step
# waited for swap-outs in flight to free blocks; I_BLOCKED, I_BLOCKED_NEED: the waiting
# request at which this step's admission stopped (-1: none) and the blocks it needs;
# I_PRO_EVICTED: requests the last proactive swapping swapped out or dropped; I_NRES:
# resident requests (waiting with their KV on the GPU)
# Req.xfer: a preempted request's copy state on the host link (lpserve.sim.state.XF_*)
XF_NONE, XF_RESIDENT, XF_OUT, XF_IN = 0, 1, 2, 3
# fst (float64 per replica)
F_NOW, F_AREA, F_BUSY, F_SWAP_WAIT, F_SWAP_S, F_LINK_FREE = range(6)
N_FST = 6


# ===================================================================================== lists
@njit(cache=True)
def w_append(req, rep, i):
    """Request ``i`` joins the back of the waiting list."""
    ist = rep.ist
    t = ist[I_WTAIL]
    req.wprev[i] = t
    req.wnext[i] = -1
    if t >= 0:
        req.wnext[t] = i
    else:
        ist[I_WHEAD] = i
    ist[I_WTAIL] = i
    ist[I_NWAIT] += 1


@njit(cache=True)
def w_front(req, rep, i):
    """Request ``i`` goes to the front of the waiting list (a preempted request)."""
    ist = rep.ist
    h = ist[I_WHEAD]
    req.wnext[i] = h
    req.wprev[i] = -1
    if h >= 0:
        req.wprev[h] = i
    else:
        ist[I_WTAIL] = i
    ist[I_WHEAD] = i
    ist[I_NWAIT] += 1


@njit(cache=True)
def w_remove(req, rep, i):
    """Request ``i`` leaves the waiting list."""
    ist = rep.ist
    p, q = req.wprev[i], req.wnext[i]
    if p >= 0:
        req.wnext[p] = q
    else:
        ist[I_WHEAD] = q
    if q >= 0:
        req.wprev[q] = p
    else:
        ist[I_WTAIL] = p
    ist[I_NWAIT] -= 1


@njit(cache=True)
def waiting_ids(req, rep):
    """The waiting requests in list order (int64)."""
    out = np.empty(rep.ist[I_NWAIT], np.int64)
    k = rep.ist[I_WHEAD]
    m = 0
    while k >= 0:
        out[m] = k
        m += 1
        k = req.wnext[k]
    return out


@njit(cache=True)
def r_remove(rep, i):
    """Request ``i`` leaves the running list (its order kept)."""
    run = rep.run
    n = rep.ist[I_NRUN]
    k = 0
    while run[k] != i:
        k += 1
    for j in range(k, n - 1):
        run[j] = run[j + 1]
    rep.ist[I_NRUN] = n - 1


@njit(cache=True)
def r_append(rep, i):
    """Request ``i`` joins the back of the running list."""
    rep.run[rep.ist[I_NRUN]] = i
    rep.ist[I_NRUN] += 1


@njit(cache=True)
def r_index(rep, i):
    """Position of ``i`` in the running list (-1 if absent)."""
    for k in range(rep.ist[I_NRUN]):
        if rep.run[k] == i:
            return k
    return -1


# ===================================================================================== keys
@njit(cache=True)
def trace_chain(block_flat, block_offsets):
    """Chained content hash of every trace prefix block (int64, aligned with
    ``block_flat``): equal prefixes give equal chains."""
    out = np.empty(block_flat.shape[0], np.int64)
    for i in range(block_offsets.shape[0] - 1):
        h = np.int64(0x5EED)
        for k in range(block_offsets[i], block_offsets[i + 1]):
            h = P.mix64(h ^ P.mix64(block_flat[k] + 1))
            if h == P.NOKEY:
                h += 1
            out[k] = h
    return out


@njit(cache=True)
def block_keys(req, cfg, i):
    """Keys of request ``i``'s full prompt blocks (``req.keybuf[:n]``; returns ``n``).

    A block whose tokens all lie in the trace's known prefix blocks is keyed by the chain
    through them and its position, so equal prefixes share keys; other blocks get keys
    unique to the request (as ``State.block_keys`` keys them). Only the first
    ``len(req.keybuf)`` blocks are keyed (at least the pool's size: no longer prefix can be
    cached, and a longer prompt is rejected before it holds a block), so a router's look-up
    for a prompt longer than the pool stays inside the buffer."""
    bt = cfg[C_BT]
    tbt = cfg[C_TRACE_BT]
    n_full = min(req.prompt[i] // bt, req.keybuf.shape[0])
    c0 = req.chain_off[i]
    n_tr = req.chain_off[i + 1] - c0
    kb_buf = req.keybuf
    for j in range(n_full):
        kb = ((j + 1) * bt - 1) // tbt if tbt > 0 else n_tr
        if kb < n_tr:
            k = P.mix64(req.chain[c0 + kb] ^ P.mix64(j + 7))
        else:
            k = P.mix64(P.mix64(-1 - i) ^ P.mix64(j + 11))
        if k == P.NOKEY:
            k += 1
        kb_buf[j] = k
    return n_full


# ===================================================================================== memory
@njit(cache=True)
def held_blocks(req, i):
    """GPU blocks request ``i`` holds on its replica."""
    return req.anon[i] + req.nslots[i]


@njit(cache=True)
def queued_slots(req, rep, cfg):
    """Cached slots the first 256 waiting requests would hit (the lookahead evictor)."""
    p = rep.pool
    out = np.empty(p.ist[P.P_TOTAL], np.int64)
    n = 0
    k = rep.ist[I_WHEAD]
    m = 0
    mark = p.mark
    while k >= 0 and m < 256:
        if not req.swapped[k] and not req.kv_remote[k]:
            nk = block_keys(req, cfg, k)
            for j in range(nk):
                s = P.cached_slot(p, req.keybuf[j])
                if s < 0:
                    break
                if mark[s] == 0:  # each slot once
                    mark[s] = 1
                    out[n] = s
                    n += 1
        m += 1
        k = req.wnext[k]
    for j in range(n):
        mark[out[j]] = 0
    return out[:n]


@njit(cache=True)
def make_room(req, rep, cfg, need):
    """Ensure ``need`` plain free blocks, evicting cached ones; False if impossible."""
    p = rep.pool
    plain = p.ist[P.P_PLAIN]
    if need <= plain:
        return True
    if need > P.available(p):
        return False
    n = min(p.ist[P.P_EVICTABLE], max(need - plain, cfg[C_EVICT_BATCH]))
    kind = p.ist[P.P_KIND]
    if kind == P.EV_EXTERNAL or (kind == P.EV_GROUPS and SE.asks_python(p)):
        # the evictor is written in Python, or its duel has started: ask it (a pause)
        q = queued_slots(req, rep, cfg) if cfg[C_EV_QUEUE] else rep.hold[:0]
        E.evict_external(p, n, rep.fst[F_NOW], cfg[C_HOOK], q, q.shape[0], cfg[C_EV_TREE])
    elif kind == P.EV_LOOKAHEAD:
        q = queued_slots(req, rep, cfg)
        E.evict(p, n, q, q.shape[0])
    elif kind == P.EV_GROUPS:  # a session-aware evictor's order (its statistics: Python)
        SE.evict(p, n, rep.fst[F_NOW])
    else:
        E.evict(p, n, rep.hold, np.int64(0))
    return True


@njit(cache=True)
def alloc_prompt_blocks(req, rep, cfg, i, target, now):
    """Grow request ``i`` to ``target`` blocks (full prompt blocks get keys)."""
    held = req.anon[i] + req.nslots[i]
    extra = target - held
    if extra <= 0:
        return
    make_room(req, rep, cfg, extra)
    p = rep.pool
    n_keyed = 0
    bt = cfg[C_BT]
    if cfg[C_CACHING] and not req.kv_remote[i] and held == req.nslots[i]:
        n_keyed = max(0, min(target, req.prompt[i] // bt) - held)
    if n_keyed:
        block_keys(req, cfg, i)
        keys = req.keybuf
        gap = req.turn_gap[i]
        if math.isnan(gap):
            gap = 0.0
        off = req.slot_off[i]
        for j in range(held, held + n_keyed):
            parent = keys[j - 1] if j else P.NOKEY
            s = P.take_hashed(p, keys[j], j, now, parent, gap)
            if s < 0:  # the key is cached already: this block and the rest anonymous
                n_keyed = j - held + 1
                req.anon[i] += 1
                break
            req.slot_buf[off + req.nslots[i]] = s
            req.nslots[i] += 1
    rest = extra - n_keyed
    if rest > 0:
        P.take_anon(p, rest)
        req.anon[i] += rest


@njit(cache=True)
def release_request(req, rep, i, now):
    """Drop request ``i``'s blocks (its hashed slots and anonymous blocks)."""
    req.turn_gap[i] = np.nan
    off = req.slot_off[i]
    P.release(rep.pool, req.slot_buf[off:off + req.nslots[i]], req.nslots[i], req.anon[i],
              now, req.thread[i], req.wait[i] if req.status[i] == ST_FINISHED else -1)
    req.nslots[i] = 0
    req.anon[i] = 0


@njit(cache=True)
def admit_need(req, rep, cfg, i):
    """KV blocks waiting request ``i`` needs to be admitted (its whole context)."""
    bt = cfg[C_BT]
    if req.swapped[i]:
        return req.swap_gpu[i]
    if req.xfer[i] == XF_RESIDENT:  # its KV is on the GPU (proactive swapping)
        return 0
    if req.kv_remote[i]:
        return (req.computed[i] + bt - 1) // bt
    full = cfg[C_RESERVE] if cfg[C_RESERVE] > 0 else (req.prompt[i] + req.gen[i] + bt - 1) // bt
    if cfg[C_CACHING]:
        nk = block_keys(req, cfg, i)
        full -= P.match(rep.pool, req.keybuf, nk, rep.hold)
    return max(full, 0)


@njit(cache=True)
def freed_blocks(req, rep, v, taken):
    """Blocks that releasing ``v`` frees after the references counted in ``taken``
    (indexed by slot, which it extends): its anonymous blocks and unshared slots."""
    n = req.anon[v]
    off = req.slot_off[v]
    ref = rep.pool.si[P.S_REF]
    for k in range(req.nslots[v]):
        s = req.slot_buf[off + k]
        if ref[s] - taken[s] == 1:
            n += 1
        taken[s] += 1
    return n


# ===================================================================================== releases
@njit(cache=True)
def _rel_less(rep, a, b):
    """Whether pending release ``a`` comes before ``b`` (by end time, then request)."""
    if rep.rel_t[a] != rep.rel_t[b]:
        return rep.rel_t[a] < rep.rel_t[b]
    return rep.rel_i[a] < rep.rel_i[b]


@njit(cache=True)
def _rel_swap(rep, a, b):
    """Swap pending releases ``a`` and ``b`` of the release heap."""
    t = rep.rel_t[a]
    rep.rel_t[a] = rep.rel_t[b]
    rep.rel_t[b] = t
    for arr in (rep.rel_i, rep.rel_anon, rep.rel_off, rep.rel_n):
        x = arr[a]
        arr[a] = arr[b]
        arr[b] = x


@njit(cache=True)
def next_release_s(rep):
    """End of the earliest outgoing copy still holding blocks (``inf`` if none)."""
    return rep.rel_t[0] if rep.ist[I_NREL] > 0 else np.inf


@njit(cache=True)
def push_release(req, rep, i, end_s):
    """Request ``i``'s blocks stay held until ``end_s`` (its KV is being copied out);
    the request no longer holds them."""
    ist = rep.ist
    n = req.nslots[i]
    if ist[I_ARENA] + n > rep.arena.shape[0]:
        compact_arena(rep)
        if ist[I_ARENA] + n > rep.arena.shape[0]:
            raise RuntimeError("internal: release arena full")
    a = ist[I_ARENA]
    off = req.slot_off[i]
    for k in range(n):
        rep.arena[a + k] = req.slot_buf[off + k]
    ist[I_ARENA] = a + n
    j = ist[I_NREL]
    rep.rel_t[j] = end_s
    rep.rel_i[j] = i
    rep.rel_anon[j] = req.anon[i]
    rep.rel_off[j] = a
    rep.rel_n[j] = n
    ist[I_NREL] = j + 1
    while j > 0:
        par = (j - 1) >> 1
        if _rel_less(rep, j, par):
            _rel_swap(rep, j, par)
            j = par
        else:
            break
    req.turn_gap[i] = np.nan
    req.nslots[i] = 0
    req.anon[i] = 0


@njit(cache=True)
def compact_arena(rep):
    """Move the live records' slots to the front of the arena."""
    n = rep.ist[I_NREL]
    buf = np.empty(rep.arena.shape[0], np.int64)
    a = 0
    for j in range(n):
        o, m = rep.rel_off[j], rep.rel_n[j]
        for k in range(m):
            buf[a + k] = rep.arena[o + k]
        rep.rel_off[j] = a
        a += m
    rep.arena[:a] = buf[:a]
    rep.ist[I_ARENA] = a


@njit(cache=True)
def apply_releases(rep):
    """Free the blocks of every outgoing copy that ended by ``now``."""
    ist = rep.ist
    now = rep.fst[F_NOW]
    while ist[I_NREL] > 0 and rep.rel_t[0] <= now:
        o, m = rep.rel_off[0], rep.rel_n[0]
        P.release(rep.pool, rep.arena[o:o + m], m, rep.rel_anon[0], now, -1, -1)
        n = ist[I_NREL] - 1
        _rel_swap(rep, np.int64(0), n)
        ist[I_NREL] = n
        j = 0
        while True:
            le = 2 * j + 1
            if le >= n:
                break
            c = le
            if le + 1 < n and _rel_less(rep, le + 1, le):
                c = le + 1
            if _rel_less(rep, c, j):
                _rel_swap(rep, c, j)
                j = c
            else:
                break
        if n == 0:
            ist[I_ARENA] = 0


# ===================================================================================== outcomes
@njit(cache=True)
def reject(req, i, code):
    """Request ``i`` leaves unserved for reason ``code``."""
    req.status[i] = ST_REJECTED
    req.reason[i] = code
    req.finish[i] = np.nan


@njit(cache=True)
def emit(rep, kind, i, t):
    """Report an event to the event loop (completions only when tracked)."""
    n = rep.ist[I_NEV]
    rep.ev_k[n] = kind
    rep.ev_i[n] = i
    rep.ev_t[n] = t
    rep.ist[I_NEV] = n + 1


@njit(cache=True)
def finish(req, rep, cfg, i):
    """Running request ``i`` produced its last token at ``now``."""
    now = rep.fst[F_NOW]
    req.finish[i] = now
    req.status[i] = ST_FINISHED
    r_remove(rep, i)
    release_request(req, rep, i, now)
    groups = rep.pool.ist[P.P_KIND] == P.EV_GROUPS
    if cfg[C_OBSERVE] or (groups and SE.finish_in_python(rep.pool, req.thread[i])):
        n = block_keys(req, cfg, i)
        E.observe(cfg[C_HOOK], 1, i, now, req.keybuf[:n])
    elif groups:  # a session-aware evictor learns here
        SE.learn(rep.pool, True, now, req.thread[i], req.wait[i], req.prompt[i],
                 req.prompt[i] + req.gen[i], cfg[C_BT])
    if cfg[C_TRACK_FIN]:
        emit(rep, np.int64(EV_FINISH), i, now)


@njit(cache=True)
def handoff(req, rep, cfg, cff, i):
    """Send request ``i``'s KV to the decode pool over this replica's link."""
    fst = rep.fst
    r_remove(rep, i)
    start = max(fst[F_NOW], fst[F_LINK_FREE])
    end = start + float(req.computed[i]) * cff[D_TR_A] / cff[D_TR_D] * cff[D_KV_SCALE]
    fst[F_LINK_FREE] = end
    push_release(req, rep, i, end)
    req.kv_remote[i] = True
    req.status[i] = ST_TRANSFER
    emit(rep, np.int64(EV_KV_READY), i, end)


@njit(cache=True)
def log_iteration(cfg, t0, dt, ch_i, ch_c, ch_h, dec):
    """Tell the reference mode's iteration log (:func:`lpserve.sim.hooks.log_iteration`)
    of an iteration starting at ``t0`` (s) and lasting ``dt`` (s), before its tokens are
    counted: prefill chunks ``ch_i`` of ``ch_c`` tokens on ``ch_h`` tokens of context,
    and decodes ``dec``."""
    handle = cfg[C_HOOK]
    with objmode():
        H.log_iteration(handle, t0, dt, ch_i, ch_c, ch_h, dec)
