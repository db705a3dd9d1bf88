"""The structures of the compiled replica engine: numba StructRefs (passed between
kernels as one pointer, which keeps compile times short) with cached constructors.

Each ``new_*`` takes the numpy arrays of the structure's fields (and SpecRep its
replica's ``numpy.random.Generator``), in the order of its ``*_FIELDS``, and returns the
structure; the kernels read and write those same arrays, so the Python side keeps its own
references to them. Layouts and meanings are in the modules that use them (``_pool``,
``_state_kernels``, ``_step_kernels``, ``_spec_kernels``, ``_offload_kernels``, ``_link_kernels``).
"""
from __future__ import annotations

import numpy as np
from numba import njit, typeof, types
from numba.experimental import structref
from numba.typed import List

from lpserve.kernels.structs import struct_type

__all__ = ["new_pool", "new_off", "new_link", "new_req", "new_rep", "new_rk", "new_ctl", "new_specrun", "new_specrep",
           "new_replica_list", "push_replica"]


PoolType, Pool = struct_type("Pool", __name__)
POOL_FIELDS = (
    'ist', 'si', 'sf', 'fstack', 'hk', 'hs', 'hc', 'hu', 'hk1', 'hk2', 'hneg', 'hslot',
    'hstamp', 'hsize', 'kp', 'mark', 'gi', 'gt', 'sv_f', 'sv_ne', 'sv_pm', 'sv_th', 'sv_tid',
    'sv_val', 'sv_ho', 'sv_rx', 'sv_hf', 'sv_hi',
)
POOL_T = PoolType([
    ("ist", types.int64[::1]),
    ("si", types.int64[:, ::1]),
    ("sf", types.float64[:, ::1]),
    ("fstack", types.int64[::1]),
    ("hk", types.int64[::1]),
    ("hs", types.int64[::1]),
    ("hc", types.int64[::1]),
    ("hu", types.int64[::1]),
    ("hk1", types.float64[:, ::1]),
    ("hk2", types.float64[:, ::1]),
    ("hneg", types.int64[:, ::1]),
    ("hslot", types.int64[:, ::1]),
    ("hstamp", types.int64[:, ::1]),
    ("hsize", types.int64[::1]),
    ("kp", types.float64[::1]),
    ("mark", types.int64[::1]),
    ("gi", types.int64[:, ::1]),
    ("gt", types.float64[:, ::1]),
    ("sv_f", types.float64[::1]),
    ("sv_ne", types.float64[:, ::1]),
    ("sv_pm", types.float64[:, :, ::1]),
    ("sv_th", types.float64[:, ::1]),
    ("sv_tid", types.int64[::1]),
    ("sv_val", types.float64[::1]),
    ("sv_ho", types.float64[:, :, ::1]),
    ("sv_rx", types.float64[:, :, ::1]),
    ("sv_hf", types.float64[:, ::1]),
    ("sv_hi", types.int64[:, ::1]),
])


@njit(cache=True)
def new_pool(ist, si, sf, fstack, hk, hs, hc, hu, hk1, hk2, hneg, hslot, hstamp, hsize, kp,
             mark, gi, gt, sv_f, sv_ne, sv_pm, sv_th, sv_tid, sv_val, sv_ho, sv_rx, sv_hf,
             sv_hi):
    """A Pool over these arrays (see ``POOL_FIELDS``)."""
    s = structref.new(POOL_T)
    s.ist = ist
    s.si = si
    s.sf = sf
    s.fstack = fstack
    s.hk = hk
    s.hs = hs
    s.hc = hc
    s.hu = hu
    s.hk1 = hk1
    s.hk2 = hk2
    s.hneg = hneg
    s.hslot = hslot
    s.hstamp = hstamp
    s.hsize = hsize
    s.kp = kp
    s.mark = mark
    s.gi = gi
    s.gt = gt
    s.sv_f = sv_f
    s.sv_ne = sv_ne
    s.sv_pm = sv_pm
    s.sv_th = sv_th
    s.sv_tid = sv_tid
    s.sv_val = sv_val
    s.sv_ho = sv_ho
    s.sv_rx = sv_rx
    s.sv_hf = sv_hf
    s.sv_hi = sv_hi
    return s

OffType, Off = struct_type("Off", __name__)
OFF_FIELDS = (
    'oi', 'of', 'hk', 'hv', 'nkey', 'nprev', 'nnext', 'load_end', 'qt', 'qi', 'price',
)
OFF_T = OffType([
    ("oi", types.int64[::1]),
    ("of", types.float64[::1]),
    ("hk", types.int64[::1]),
    ("hv", types.int64[::1]),
    ("nkey", types.int64[::1]),
    ("nprev", types.int64[::1]),
    ("nnext", types.int64[::1]),
    ("load_end", types.float64[::1]),
    ("qt", types.float64[::1]),
    ("qi", types.int64[::1]),
    ("price", types.float64[::1]),
])


@njit(cache=True)
def new_off(oi, of, hk, hv, nkey, nprev, nnext, load_end, qt, qi, price):
    """An Off over these arrays (see ``OFF_FIELDS``)."""
    s = structref.new(OFF_T)
    s.oi = oi
    s.of = of
    s.hk = hk
    s.hv = hv
    s.nkey = nkey
    s.nprev = nprev
    s.nnext = nnext
    s.load_end = load_end
    s.qt = qt
    s.qi = qi
    s.price = price
    return s

LinkType, Link = struct_type("Link", __name__)
LINK_FIELDS = (
    'li', 'lf', 'queue', 'q_kind', 'q_blocks', 'q_seq', 'q_then', 'q_dur', 'q_issued',
    'q_rank', 'q_dl', 'quant_s',
)
LINK_T = LinkType([
    ("li", types.int64[::1]),
    ("lf", types.float64[::1]),
    ("queue", types.int64[::1]),
    ("q_kind", types.int64[::1]),
    ("q_blocks", types.int64[::1]),
    ("q_seq", types.int64[::1]),
    ("q_then", types.int64[::1]),
    ("q_dur", types.float64[::1]),
    ("q_issued", types.float64[::1]),
    ("q_rank", types.float64[::1]),
    ("q_dl", types.float64[::1]),
    ("quant_s", types.float64[::1]),
])


@njit(cache=True)
def new_link(li, lf, queue, q_kind, q_blocks, q_seq, q_then, q_dur, q_issued, q_rank, q_dl,
             quant_s):
    """A Link over these arrays (see ``LINK_FIELDS``)."""
    s = structref.new(LINK_T)
    s.li = li
    s.lf = lf
    s.queue = queue
    s.q_kind = q_kind
    s.q_blocks = q_blocks
    s.q_seq = q_seq
    s.q_then = q_then
    s.q_dur = q_dur
    s.q_issued = q_issued
    s.q_rank = q_rank
    s.q_dl = q_dl
    s.quant_s = quant_s
    return s

ReqType, Req = struct_type("Req", __name__)
REQ_FIELDS = (
    'prompt', 'out', 'arrival', 'computed', 'dcomp', 'gen', 'anon', 'nslots', 'host_blocks',
    'swap_gpu', 'swapped', 'compressed', 'kv_remote', 'status', 'first_sched', 'first_token',
    'finish', 'preempt', 'cached_tok', 'seen_tok', 'replica', 'decode_replica', 'reason',
    'tenant', 'plo', 'phi', 'prog', 'wnext', 'wprev', 'slot_off', 'slot_buf', 'turn_gap', 'rk',
    'chain', 'chain_off', 'keybuf', 'ready', 'link_wait', 'thread', 'wait', 'xfer',
)
REQ_T = ReqType([
    ("prompt", types.int64[::1]),
    ("out", types.int64[::1]),
    ("arrival", types.float64[::1]),
    ("computed", types.int64[::1]),
    ("dcomp", types.int64[::1]),
    ("gen", types.int64[::1]),
    ("anon", types.int64[::1]),
    ("nslots", types.int64[::1]),
    ("host_blocks", types.int64[::1]),
    ("swap_gpu", types.int64[::1]),
    ("swapped", types.boolean[::1]),
    ("compressed", types.boolean[::1]),
    ("kv_remote", types.boolean[::1]),
    ("status", types.int8[::1]),
    ("first_sched", types.float64[::1]),
    ("first_token", types.float64[::1]),
    ("finish", types.float64[::1]),
    ("preempt", types.int64[::1]),
    ("cached_tok", types.int64[::1]),
    ("seen_tok", types.int64[::1]),
    ("replica", types.int64[::1]),
    ("decode_replica", types.int64[::1]),
    ("reason", types.int8[::1]),
    ("tenant", types.int64[::1]),
    ("plo", types.int64[::1]),
    ("phi", types.int64[::1]),
    ("prog", types.int64[::1]),
    ("wnext", types.int64[::1]),
    ("wprev", types.int64[::1]),
    ("slot_off", types.int64[::1]),
    ("slot_buf", types.int64[::1]),
    ("turn_gap", types.float64[::1]),
    ("rk", types.float64[::1]),
    ("chain", types.int64[::1]),
    ("chain_off", types.int64[::1]),
    ("keybuf", types.int64[::1]),
    ("ready", types.int64[::1]),
    ("link_wait", types.float64[::1]),
    ("thread", types.int64[::1]),
    ("wait", types.int64[::1]),
    ("xfer", types.int8[::1]),
])


@njit(cache=True)
def new_req(prompt, out, arrival, computed, dcomp, gen, anon, nslots, host_blocks, swap_gpu,
            swapped, compressed, kv_remote, status, first_sched, first_token, finish, preempt,
            cached_tok, seen_tok, replica, decode_replica, reason, tenant, plo, phi, prog,
            wnext, wprev, slot_off, slot_buf, turn_gap, rk, chain, chain_off, keybuf, ready,
            link_wait, thread, wait, xfer):
    """A Req over these arrays (see ``REQ_FIELDS``)."""
    s = structref.new(REQ_T)
    s.prompt = prompt
    s.out = out
    s.arrival = arrival
    s.computed = computed
    s.dcomp = dcomp
    s.gen = gen
    s.anon = anon
    s.nslots = nslots
    s.host_blocks = host_blocks
    s.swap_gpu = swap_gpu
    s.swapped = swapped
    s.compressed = compressed
    s.kv_remote = kv_remote
    s.status = status
    s.first_sched = first_sched
    s.first_token = first_token
    s.finish = finish
    s.preempt = preempt
    s.cached_tok = cached_tok
    s.seen_tok = seen_tok
    s.replica = replica
    s.decode_replica = decode_replica
    s.reason = reason
    s.tenant = tenant
    s.plo = plo
    s.phi = phi
    s.prog = prog
    s.wnext = wnext
    s.wprev = wprev
    s.slot_off = slot_off
    s.slot_buf = slot_buf
    s.turn_gap = turn_gap
    s.rk = rk
    s.chain = chain
    s.chain_off = chain_off
    s.keybuf = keybuf
    s.ready = ready
    s.link_wait = link_wait
    s.thread = thread
    s.wait = wait
    s.xfer = xfer
    return s

RepType, Rep = struct_type("Rep", __name__)
REP_FIELDS = (
    'ist', 'fst', 'run', 'pool', 'rel_t', 'rel_i', 'rel_anon', 'rel_off', 'rel_n', 'arena',
    'ev_i', 'ev_t', 'ev_k', 'ctl_st', 'ctl_lt', 'ctl_q', 'ctl_plan', 'ctl_x', 'hold', 'off',
    'link',
)
REP_T = RepType([
    ("ist", types.int64[::1]),
    ("fst", types.float64[::1]),
    ("run", types.int64[::1]),
    ("pool", POOL_T),
    ("rel_t", types.float64[::1]),
    ("rel_i", types.int64[::1]),
    ("rel_anon", types.int64[::1]),
    ("rel_off", types.int64[::1]),
    ("rel_n", types.int64[::1]),
    ("arena", types.int64[::1]),
    ("ev_i", types.int64[::1]),
    ("ev_t", types.float64[::1]),
    ("ev_k", types.int64[::1]),
    ("ctl_st", types.float64[::1]),
    ("ctl_lt", types.float64[::1]),
    ("ctl_q", types.float64[::1]),
    ("ctl_plan", types.int64[:, ::1]),
    ("ctl_x", types.float64[::1]),
    ("hold", types.int64[::1]),
    ("off", OFF_T),
    ("link", LINK_T),
])


@njit(cache=True)
def new_rep(ist, fst, run, pool, rel_t, rel_i, rel_anon, rel_off, rel_n, arena, ev_i, ev_t,
            ev_k, ctl_st, ctl_lt, ctl_q, ctl_plan, ctl_x, hold, off, link):
    """A Rep over these arrays (see ``REP_FIELDS``)."""
    s = structref.new(REP_T)
    s.ist = ist
    s.fst = fst
    s.run = run
    s.pool = pool
    s.rel_t = rel_t
    s.rel_i = rel_i
    s.rel_anon = rel_anon
    s.rel_off = rel_off
    s.rel_n = rel_n
    s.arena = arena
    s.ev_i = ev_i
    s.ev_t = ev_t
    s.ev_k = ev_k
    s.ctl_st = ctl_st
    s.ctl_lt = ctl_lt
    s.ctl_q = ctl_q
    s.ctl_plan = ctl_plan
    s.ctl_x = ctl_x
    s.hold = hold
    s.off = off
    s.link = link
    return s

RkType, Rk = struct_type("Rk", __name__)
RK_FIELDS = (
    'fp', 'ip', 'rf', 'ri', 'pf', 'xf', 'xi', 'xr', 'g', 'cand', 'run',
)
RK_T = RkType([
    ("fp", types.float64[::1]),
    ("ip", types.int64[::1]),
    ("rf", types.float64[:, ::1]),
    ("ri", types.int64[:, ::1]),
    ("pf", types.float64[:, ::1]),
    ("xf", types.float64[:, ::1]),
    ("xi", types.int64[:, ::1]),
    ("xr", types.float64[:, ::1]),
    ("g", types.int64[::1]),
    ("cand", types.int64[::1]),
    ("run", types.int64[::1]),
])


@njit(cache=True)
def new_rk(fp, ip, rf, ri, pf, xf, xi, xr, g, cand, run):
    """A Rk over these arrays (see ``RK_FIELDS``)."""
    s = structref.new(RK_T)
    s.fp = fp
    s.ip = ip
    s.rf = rf
    s.ri = ri
    s.pf = pf
    s.xf = xf
    s.xi = xi
    s.xr = xr
    s.g = g
    s.cand = cand
    s.run = run
    return s

CtlType, Ctl = struct_type("Ctl", __name__)
CTL_FIELDS = (
    'cp', 'w',
)
CTL_T = CtlType([
    ("cp", types.float64[::1]),
    ("w", types.float64[::1]),
])


@njit(cache=True)
def new_ctl(cp, w):
    """A Ctl over these arrays (see ``CTL_FIELDS``)."""
    s = structref.new(CTL_T)
    s.cp = cp
    s.w = w
    return s

SpecRunType, SpecRun = struct_type("SpecRun", __name__)
SPECRUN_FIELDS = (
    'ip', 'tparams', 'dparams', 'rates', 'edges', 'counts', 'eterm',
)
SPECRUN_T = SpecRunType([
    ("ip", types.int64[::1]),
    ("tparams", types.float64[::1]),
    ("dparams", types.float64[:, ::1]),
    ("rates", types.float64[:, ::1]),
    ("edges", types.int64[::1]),
    ("counts", types.int64[::1]),
    ("eterm", types.float64[:, :, ::1]),
])


@njit(cache=True)
def new_specrun(ip, tparams, dparams, rates, edges, counts, eterm):
    """A SpecRun over these arrays (see ``SPECRUN_FIELDS``)."""
    s = structref.new(SPECRUN_T)
    s.ip = ip
    s.tparams = tparams
    s.dparams = dparams
    s.rates = rates
    s.edges = edges
    s.counts = counts
    s.eterm = eterm
    return s

SpecRepType, SpecRep = struct_type("SpecRep", __name__)
SPECREP_FIELDS = (
    'ucb_n', 'ucb_s', 'acc_s', 'acc_n', 'acc_steps', 'rng',
)
SPECREP_T = SpecRepType([
    ("ucb_n", types.int64[:, ::1]),
    ("ucb_s", types.float64[:, ::1]),
    ("acc_s", types.int64[:, ::1]),
    ("acc_n", types.int64[:, ::1]),
    ("acc_steps", types.int64[::1]),
    # the replica's acceptance draws: held here, not passed to every kernel call (numba
    # types a Generator argument on each call, about 10 us)
    ("rng", typeof(np.random.default_rng(0))),
])


@njit(cache=True)
def new_specrep(ucb_n, ucb_s, acc_s, acc_n, acc_steps, rng):
    """A SpecRep over these arrays (see ``SPECREP_FIELDS``)."""
    s = structref.new(SPECREP_T)
    s.ucb_n = ucb_n
    s.ucb_s = ucb_s
    s.acc_s = acc_s
    s.acc_n = acc_n
    s.acc_steps = acc_steps
    s.rng = rng
    return s


@njit(cache=True)
def set_arena(rep, arena):
    """Replace a replica's release arena (grown by the event loop)."""
    rep.arena = arena


@njit(cache=True)
def new_replica_list(rep, ss):
    """A numba typed list holding one replica's ``(Rep, SpecRep)``; :func:`push_replica`
    adds the others (both compiled once and cached, unlike a list built in Python)."""
    out = List()
    out.append((rep, ss))
    return out


@njit(cache=True)
def push_replica(replicas, rep, ss):
    """Append a replica's ``(Rep, SpecRep)`` to ``replicas``."""
    replicas.append((rep, ss))
