"""Preemption and the overlapped host link of the replicas (numba): a victim's preemption
mode, swap-outs, copy ends and starts, swap-in admission, resident requests
(``models/simulator.md`` (10), (26)-(29), (31); ``models/kv-compression-swap.md``).

Serial swaps (``C_LINK`` off) free a victim's blocks at once and price the copy in the
next iteration. On the overlapped link (``C_LINK`` on) every swap-out and swap-in is a copy
queued on the replica's link (``rep.link``, :mod:`lpserve.sim._link_kernels`): a swap-out
keeps its GPU blocks until its copy ends; a swap-in takes its blocks when its copy starts
and its request joins the batch when it ends. Copy ends are applied by :func:`tick` at the
start of each planning step; the replica's next event (``_step_kernels.next_event_s``)
includes the running copy's end, so decode runs stop there. Proactive swapping (30)
decides in :mod:`lpserve.sim._preempt_kernels` with the resident-request mechanics here
(:func:`park`, :func:`evict_resident`, :func:`resident_cap`).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, objmode

from lpserve.cost import iteration_time
from lpserve.sim import _link_kernels as L
from lpserve.sim import _pool as P
from lpserve.sim import _state_kernels as T
from lpserve.sim import hooks as H


# ===================================================================================== link
@njit(cache=True)
def copy_s(cff, swap_tab, held, compressed):
    """Link seconds of one copy of ``held`` GPU blocks: a full swap's time (``kv_scale``
    included) or a compressed swap's PCIe bytes."""
    if compressed:
        return swap_tab[held] / cff[T.D_RATIO]
    return swap_tab[held] * cff[T.D_KV_SCALE]


@njit(cache=True)
def deadline_s(req, cff, i):
    """Request ``i``'s SLO deadline: arrival + TTFT SLO before
    its first token, then the time its next token is due at the TPOT SLO."""
    if math.isnan(req.first_token[i]):
        return req.arrival[i] + cff[T.D_SLO_TTFT]
    return req.first_token[i] + cff[T.D_SLO_TPOT] * float(req.gen[i])


@njit(cache=True)
def link_net(rep):
    """Blocks the link's queued copies will free, net of those promised to swap-ins."""
    li = rep.link.li
    return li[L.L_FREEING] - li[L.L_PROMISED]


@njit(cache=True)
def joins_by(link, now):
    """Whether a copy ends by ``now`` while a swap-in that puts its request into the
    batch is running or queued."""
    a = link.li[L.L_ACTIVE]
    if a < 0 or link.lf[L.LF_END] > now:
        return False
    if link.q_then[a]:
        return True
    for j in range(link.li[L.L_NQ]):
        if link.q_then[link.queue[j]]:
            return True
    return False


@njit(cache=True)
def issue(req, rep, cff, cfg, kind, i, blocks, duration_s, then_run):
    """Queue request ``i``'s copy now (its rank is this step's, already computed; its
    deadline for ``llf``/``rmlq``) and start it if the link is idle."""
    link = rep.link
    order = link.li[L.L_ORDER]
    rank = req.rk[i] if order == L.ORDER_PRIORITY else 0.0
    dl = deadline_s(req, cff, i) if order == L.ORDER_LLF or order == L.ORDER_RMLQ \
        else math.inf
    now = rep.fst[T.F_NOW]
    L.enqueue(link, kind, i, blocks, duration_s, now, rank, dl, then_run)
    tick(req, rep, cfg, now)


@njit(cache=True)
def _end(req, rep, i, t):
    """Apply the end at ``t`` of request ``i``'s copy."""
    link = rep.link
    if link.q_kind[i] == L.KIND_OUT:  # the KV is on the host: the GPU blocks are free
        T.release_request(req, rep, i, t)
        req.xfer[i] = T.XF_NONE
        return
    rep.ist[T.I_HOST_FREE] += req.host_blocks[i]
    if req.compressed[i]:  # the dequantize pass runs on the GPU, in the next iteration
        rep.fst[T.F_SWAP_S] += link.quant_s[link.q_blocks[i]]
        req.compressed[i] = False
    req.host_blocks[i] = 0
    req.swap_gpu[i] = 0
    req.swapped[i] = False
    if link.q_then[i]:
        req.xfer[i] = T.XF_NONE
        rep.ist[T.I_NLOAD] -= 1
        T.r_append(rep, i)
        req.status[i] = T.ST_RUNNING
        req.link_wait[i] += t - link.q_issued[i]
    else:  # a proactive prefetch: the request stays waiting, its KV resident
        req.xfer[i] = T.XF_RESIDENT
        rep.ist[T.I_NRES] += 1


@njit(cache=True)
def _start_next(req, rep, cfg, t):
    """Start the first queued copy in link order that can start at ``t`` (a swap-in
    takes its GPU blocks now, if it can get them); False if none."""
    link = rep.link
    if link.li[L.L_NQ] == 0:
        return False
    order = L.start_order(link, t)
    p = rep.pool
    for k in range(order.shape[0]):
        j = order[k]
        if link.q_kind[j] == L.KIND_IN:
            n = link.q_blocks[j]
            if P.available(p) < n:
                continue
            T.make_room(req, rep, cfg, n)
            P.take_anon(p, n)
            req.anon[j] = n
        L.start(link, j, t)
        return True
    return False


@njit(cache=True)
def tick(req, rep, cfg, now):
    """Bring the link up to ``now``: copy ends and the starts that follow, in time order
   ."""
    link = rep.link
    t = now
    while True:
        if link.li[L.L_ACTIVE] >= 0:
            if link.lf[L.LF_END] > now:
                return
            t = link.lf[L.LF_END]
            _end(req, rep, L.pop_end(link, now), t)
        if not _start_next(req, rep, cfg, t):
            return


@njit(cache=True)
def admit_swapped(req, rep, cfg, cff, swap_tab, i):
    """Admission of waiting request ``i`` whose KV is on the link, on the host or resident
   : 1 admitted (a resident request joins the batch; a
    swapped-out one gets its swap-in issued and a seat), 0 not yet (its swap-out is still
    copying), -1 its blocks do not fit above the watermark with the blocks promised to
    swap-ins and those the running decodes need next (28)."""
    st = req.xfer[i]
    if st == T.XF_OUT:
        return 0
    if st == T.XF_RESIDENT:
        req.xfer[i] = T.XF_NONE
        rep.ist[T.I_NRES] -= 1
        T.w_remove(req, rep, i)
        T.r_append(rep, i)
        req.status[i] = T.ST_RUNNING
        return 1
    link = rep.link
    if st != T.XF_IN:
        bt = cfg[T.C_BT]
        keep = 0
        for k in range(rep.ist[T.I_NRUN]):
            j = rep.run[k]
            if req.prompt[j] + req.gen[j] - req.computed[j] == 1 and \
                    req.computed[j] + 1 > (req.anon[j] + req.nslots[j]) * bt:
                keep += 1
        if P.available(rep.pool) - link.li[L.L_PROMISED] - req.swap_gpu[i] - keep < \
                cfg[T.C_WM]:
            return -1
    T.w_remove(req, rep, i)
    rep.ist[T.I_NLOAD] += 1
    req.status[i] = T.ST_TRANSFER
    if st == T.XF_IN:  # a proactive prefetch already on the link: run at its end
        link.q_then[i] = 1
        link.q_issued[i] = rep.fst[T.F_NOW]
        return 1
    req.xfer[i] = T.XF_IN
    n = req.swap_gpu[i]
    issue(req, rep, cff, cfg, L.KIND_IN, i, n, copy_s(cff, swap_tab, n, req.compressed[i]),
          True)
    return 1


# ===================================================================================== preemption
@njit(cache=True)
def _compressed_host(held, ratio):
    """Host blocks a compressed swap of ``held`` GPU blocks takes at ``ratio``."""
    return int(math.ceil(held / ratio - 1e-12))


@njit(cache=True)
def preemption_mode(req, rep, cfg, cff, params, swap_tab, cswap_tab, v, held):
    """The engine's preemption mode, or the decider's choice for victim ``v`` holding
    ``held`` blocks: the cost-based one's twin (``models/kv-compression-swap.md`` (6)), or
    one written in Python, asked in a pause (:func:`lpserve.sim.hooks.preemption_mode`)."""
    if cfg[T.C_DECIDER] == T.DECIDER_NONE:
        return cfg[T.C_PREEMPT]
    if cfg[T.C_DECIDER] == T.DECIDER_PYTHON:  # asked in a pause, with the same view
        handle = cfg[T.C_HOOK]
        with objmode(mode="int64"):
            mode = H.preemption_mode(handle, v, held)
        return mode
    ctx = req.computed[v]
    rec = 0.0
    if ctx:
        pt = np.empty(1, np.int64)
        pt[0] = ctx
        rec = iteration_time(params, pt, np.zeros(1, np.int64), np.zeros(0, np.int64))
    host_free = rep.ist[T.I_HOST_FREE]
    swap_s = 2.0 * swap_tab[held]
    if held <= host_free and swap_s <= cff[T.D_SWAP_BUDGET] and swap_s < rec:
        return T.PRE_SWAP
    loss = cff[T.D_ACC_COST] * ctx
    if _compressed_host(held, cff[T.D_RATIO]) <= host_free and loss <= cff[T.D_MAX_LOSS] \
            and 2.0 * cswap_tab[held] < rec:
        return T.PRE_COMPRESS
    return T.PRE_RECOMPUTE


@njit(cache=True)
def preempt(req, rep, cfg, cff, params, swap_tab, cswap_tab, v):
    """Preempt running request ``v``: swap or compress-and-swap it
    out when its KV fits in host memory (serially: its blocks freed now, the copy priced
    in the next iteration; on the link: a swap-out copy, its blocks freed at its end),
    else recompute; it goes to the front of the waiting list."""
    held = req.anon[v] + req.nslots[v]
    mode = preemption_mode(req, rep, cfg, cff, params, swap_tab, cswap_tab, v, held)
    if not swap_out(req, rep, cfg, cff, swap_tab, cswap_tab, v, held, mode):
        drop_kv(req, rep, v)
    elif not cfg[T.C_LINK]:
        T.release_request(req, rep, v, rep.fst[T.F_NOW])
    req.preempt[v] += 1
    req.status[v] = T.ST_WAITING
    T.r_remove(rep, v)
    T.w_front(req, rep, v)


# ===================================================================================== residents
@njit(cache=True)
def host_need(req, rep, cfg, cff, params, swap_tab, cswap_tab, v):
    """``(mode, host blocks)``: request ``v``'s preemption mode and the host blocks
    swapping it out takes in that mode (0 to recompute)."""
    held = req.anon[v] + req.nslots[v]
    mode = preemption_mode(req, rep, cfg, cff, params, swap_tab, cswap_tab, v, held)
    if mode == T.PRE_SWAP:
        return mode, held
    if mode == T.PRE_COMPRESS:
        return mode, _compressed_host(held, cff[T.D_RATIO])
    return mode, 0


@njit(cache=True)
def resident_host_left(req, rep):
    """Host blocks left after the resident requests' KV."""
    left = rep.ist[T.I_HOST_FREE]
    k = rep.ist[T.I_WHEAD] if rep.ist[T.I_NRES] else -1
    while k >= 0:
        if req.xfer[k] == T.XF_RESIDENT:
            left -= req.anon[k] + req.nslots[k]
        k = req.wnext[k]
    return left


@njit(cache=True)
def park(req, rep, v):
    """Priority preemption under proactive swapping: running ``v`` keeps its KV on the
    GPU (resident) and waits at the front."""
    req.xfer[v] = T.XF_RESIDENT
    rep.ist[T.I_NRES] += 1
    req.preempt[v] += 1
    req.status[v] = T.ST_WAITING
    T.r_remove(rep, v)
    T.w_front(req, rep, v)


@njit(cache=True)
def swap_out(req, rep, cfg, cff, swap_tab, cswap_tab, v, held, mode):
    """Move ``v``'s KV (``held`` GPU blocks) to host memory by ``mode`` if it fits there
   ; False (nothing done) otherwise."""
    ist = rep.ist
    host = -1
    if mode == T.PRE_SWAP and held <= ist[T.I_HOST_FREE]:
        host = held
    elif mode == T.PRE_COMPRESS:
        comp = _compressed_host(held, cff[T.D_RATIO])
        if comp <= ist[T.I_HOST_FREE]:
            host = comp
    if host < 0:
        return False
    compressed = mode == T.PRE_COMPRESS
    ist[T.I_HOST_FREE] -= host
    req.host_blocks[v] = host
    req.swap_gpu[v] = held
    req.swapped[v] = True
    if compressed:
        req.compressed[v] = True
        ist[T.I_NCOMP] += 1
        ist[T.I_COMP_TOK] += req.computed[v]
    ist[T.I_NSWAPS] += 1
    if not cfg[T.C_LINK]:
        if compressed:
            rep.fst[T.F_SWAP_S] += cswap_tab[held]
        else:
            ist[T.I_SWAP_BLOCKS] += held
    else:  # the quantize pass runs on the GPU (next iteration), the bytes on PCIe
        if compressed:
            rep.fst[T.F_SWAP_S] += rep.link.quant_s[held]
        req.xfer[v] = T.XF_OUT
        issue(req, rep, cff, cfg, L.KIND_OUT, v, held,
              copy_s(cff, swap_tab, held, compressed), False)
    return True


@njit(cache=True)
def drop_kv(req, rep, v):
    """Drop ``v``'s KV to recompute it."""
    req.computed[v] = 0
    req.dcomp[v] = 0
    req.kv_remote[v] = False
    rep.ist[T.I_NRECOMP] += 1
    T.release_request(req, rep, v, rep.fst[T.F_NOW])


@njit(cache=True)
def evict_resident(req, rep, cfg, cff, params, swap_tab, cswap_tab, v, mode):
    """Swap out (or, without host room or with recompute preemption, drop) resident
    ``v`` by ``mode`` (-1: its preemption mode, asked now); True if it was dropped (its
    blocks are free now)."""
    req.xfer[v] = T.XF_NONE
    rep.ist[T.I_NRES] -= 1
    held = req.anon[v] + req.nslots[v]
    if mode < 0:
        mode = preemption_mode(req, rep, cfg, cff, params, swap_tab, cswap_tab, v, held)
    if not swap_out(req, rep, cfg, cff, swap_tab, cswap_tab, v, held, mode):
        drop_kv(req, rep, v)
        return True
    return False


@njit(cache=True)
def resident_cap(req, rep, cfg):
    """Most blocks a decode run may take before proactive swapping could act
   : unbounded without a resident request."""
    if rep.ist[T.I_NRES] == 0:
        return np.int64(1) << 62
    floor = cfg[T.C_PRO_TARGET]
    if rep.ist[T.I_BLOCKED] >= 0:
        floor = max(floor, cfg[T.C_WM] + rep.ist[T.I_BLOCKED_NEED])
    li = rep.link.li
    return max(P.available(rep.pool) + li[L.L_FREEING] - li[L.L_PROMISED] - floor, 0)
