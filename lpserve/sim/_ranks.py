"""Numba twins of the built-in schedulers' ranks (the compiled replica engine's).

Each built-in scheduler declares ``kernel_spec()`` (its kind and parameters, see
:func:`lpserve.sim.twins.rank_spec`); the kernel below computes exactly what its
Python ``rank`` returns, with the scheduler's state in arrays. A time-sliced scheduler
(``TickCached`` in :mod:`lpserve.policies.schedulers`) decides only when its candidates,
their running flags or the quantum tick changed since its last decision on the replica,
and repeats its last ranks otherwise; :func:`ranks` keeps that rule with the last
decision's key per replica. Tests compare every kind with its Python class on the same
views (``tests/unit/sim/test_ranks.py``).

State arrays: ``rf`` float64 ``(N_RF, n)`` and ``ri`` int64 ``(N_RI, n)`` per request;
``pf`` float64 ``(4, n_programs)`` per program; ``xf``/``xi``/``xr`` per replica (last
decision time, starvation tick, and the last decision's key and ranks: ``xi`` is
``(R, 3 + 2 n)`` and ``xr`` ``(R, n)``, so a replica may hold every request); ``g`` int64
global counters.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from lpserve.sim import _vtc_kernels as V

# kinds (``kernel_spec()[0]`` of the schedulers)
R_FCFS, R_SJF, R_WSPT, R_SJFP, R_LAS, R_RR, R_MCSF, R_SLO, R_MLFQ, R_PROG, R_DPP, \
    R_STATIC, R_VTC, R_WAIT = range(14)
RANK_KINDS = {"fcfs": R_FCFS, "sjf": R_SJF, "wspt": R_WSPT, "sjf-predicted": R_SJFP,
              "las": R_LAS, "round-robin": R_RR, "mcsf": R_MCSF, "slo-aware": R_SLO,
              "mlfq": R_MLFQ, "program": R_PROG, "dpp-classes": R_DPP, "static": R_STATIC,
              "vtc": R_VTC, "wait": R_WAIT}
TICKED = (R_LAS, R_RR, R_MCSF, R_SLO, R_MLFQ, R_PROG, R_VTC, R_WAIT)
#: kinds whose state moves when they are asked (MLFQ's service credit, the program-level
#: schedulers' attained service, VTC's lift of a tenant that rejoins the backlog): asked at
#: every planning step with candidates, as a scheduler ranked in Python is
#: (``models/simulator.md`` (16))
ASK_TIMED = (R_MLFQ, R_PROG, R_VTC)

# per-request float state rows
RF_SERVED, RF_USED, RF_ENTERED, RF_LAST, RF_C1, RF_C4, RF_C5, RF_C6, RF_C7 = range(9)
N_RF = 9
# per-request int state rows
RI_INIT, RI_LEVEL, RI_PROG, RI_MARK = range(4)
N_RI = 4
# per-replica float / int state
X_LAST_NOW, X_TICK = range(2)          # xf
XI_CHECK, XI_M, XI_VALID = range(3)    # xi (then the cached candidate list)
N_XI_HEAD = 3
G_DEMOTIONS, G_STAMP = range(2)
_RUNNING_RANK = -1.0e18
_LEVEL_SCALE = 1.0e7


@njit(cache=True)
def tick_index(now_s, quantum_s):
    """Twin of :func:`lpserve.policy.roles.tick_index`: the ``k`` with
    ``k * quantum_s <= now_s < (k + 1) * quantum_s`` in float64 (``quantum_s`` > 0)."""
    k = math.floor(now_s / quantum_s)
    for _ in range(4):  # the quotient is off by at most one
        if (k + 1) * quantum_s <= now_s:
            k += 1
        elif k * quantum_s > now_s:
            k -= 1
        else:
            return k
    return k


@njit(cache=True)
def tick_of(now_s, quantum_s):
    """The quantum tick holding ``now_s`` (0 without a quantum)."""
    if quantum_s <= 0.0:
        return 0.0
    return tick_index(now_s, quantum_s)


@njit(cache=True)
def _entry_level(service_s, base_s):
    """MLFQ's entry level of a request of ``service_s`` (s) of first service
    (``lpserve.policies.mlfq.entry_level``)."""
    if service_s <= base_s:
        return 0
    return int(math.ceil(math.log2(service_s / base_s) - 1e-12))


@njit(cache=True)
def _queue_of(priority_s, base_s):
    """The queue of program priority ``priority_s`` (s) with base ``base_s``
    (``lpserve.policies.programs.queue_of``)."""
    return int(math.floor(math.log2(priority_s / base_s + 1.0) + 1e-12))


@njit(cache=True)
def _fits(base, rem, m, cap, slack):
    """``future_memory_fits`` of the first ``m`` entries (schedule-ip.md (10))."""
    if m == 0:
        return True
    order = np.argsort(-rem[:m], kind="mergesort")
    load = 0.0
    for k in range(m):
        j = order[k]
        load += base[j]
        if k == m - 1 or rem[order[k + 1]] != rem[j]:
            if load + (k + 1) * (rem[j] + slack) > cap:
                return False
    return True


@njit(cache=True)
def _planned(assume, k, out, plo, phi, has_pred, default_tokens, gen):
    """Output tokens MCSF plans for a request: the true ``out`` (oracle, ``assume`` 0),
    else the predicted upper (1) or lower (2; at least its generated tokens plus one)
    bound, or ``default_tokens`` without predictions."""
    if assume == 0:  # oracle
        return float(out)
    if has_pred:
        p = float(phi) if assume == 1 else float(plo)
    else:
        p = float(default_tokens)
    if assume == 2:  # lo: raised while the request decodes
        p = max(p, gen + 1.0)
    return p


@njit(cache=True)
def _fresh(kind, fp, ip, cand, run, m, now, rep, arrival, prompt, gen, computed, out,
           tenant, plo, phi, has_pred, prog_id, total_blocks, block_tokens, rf, ri, pf, xf,
           xi, g, res):
    """Fresh ranks of ``cand[:m]`` (a decision that is due) into ``res``."""
    if kind == R_FCFS:
        for k in range(m):
            res[k] = arrival[cand[k]]
    elif kind == R_STATIC:
        for k in range(m):
            res[k] = fp[1 + cand[k]]
    elif kind == R_SJF:
        for k in range(m):
            i = cand[k]
            res[k] = float(out[i]) - gen[i] if ip[0] else float(out[i])
    elif kind == R_WSPT:
        n_w = ip[0]
        for k in range(m):
            i = cand[k]
            w = 1.0
            for t in range(n_w):
                if ip[1 + t] == tenant[i]:
                    w = fp[t]
                    break
            res[k] = float(out[i]) / w
    elif kind == R_SJFP:
        which = ip[0]
        for k in range(m):
            i = cand[k]
            if not has_pred:
                res[k] = arrival[i]
                continue
            lo, hi = float(plo[i]), float(phi[i])
            p = lo if which == 0 else (hi if which == 1 else 0.5 * (lo + hi))
            res[k] = max(p - gen[i], 1.0)
    elif kind == R_LAS:
        q = ip[0]
        for k in range(m):
            res[k] = float(gen[cand[k]] // q)
    elif kind == R_RR:
        qs = fp[0]
        tick_s = tick_index(now, qs) * qs
        for k in range(m):
            i = cand[k]
            if run[k]:
                rf[RF_SERVED, i] = tick_s
            s = rf[RF_SERVED, i]
            res[k] = arrival[i] if math.isnan(s) else s
    elif kind == R_MCSF:
        _mcsf(fp, ip, cand, run, m, arrival, prompt, gen, out, plo, phi, has_pred,
              total_blocks, block_tokens, res)
    elif kind == R_SLO:
        _slo(fp, cand, m, now, arrival, gen, phi, has_pred, res)
    elif kind == R_MLFQ:
        _mlfq(fp, ip, cand, run, m, now, rep, arrival, prompt, phi, has_pred, rf, ri, xf, xi,
              g, res)
    elif kind == R_PROG:
        _program(fp, ip, cand, run, m, now, rep, arrival, prog_id, rf, ri, pf, xf, xi, g, res)
    elif kind == R_VTC:  # the last decision's candidates and flags, as _program reads them;
        # per-request rows lent to VTC: RF_USED output credited, RI_LEVEL prompt charged,
        # RF_C1 shed stamp, RI_INIT known to the replica, RI_PROG / RI_MARK decision marks
        m0 = xi[rep, XI_M] if xi[rep, XI_VALID] else 0
        g[G_STAMP] += 2
        V.ranks(fp, ip, cand, run, m, rep, tick_of(now, fp[0]) * fp[0] if fp[0] > 0 else now,
                xi[rep, N_XI_HEAD:N_XI_HEAD + m0], xi[rep, N_XI_HEAD + m0:N_XI_HEAD + 2 * m0],
                arrival, prompt, gen, tenant, rf[RF_USED], ri[RI_LEVEL], rf[RF_C1],
                ri[RI_INIT], ri[RI_PROG], ri[RI_MARK], g[G_STAMP], pf, res)
    elif kind == R_WAIT:
        _wait(fp, ip, cand, run, m, now, arrival, prompt, out, res)
    elif kind == R_DPP:
        _dpp_classes(fp, ip, cand, m, arrival, prompt, computed, tenant, res)


@njit(cache=True)
def _slo(fp, cand, m, now, arrival, gen, phi, has_pred, res):
    """slo-aware: slack to each request's deadline (streaming or end-to-end, the earlier)
    at the step's clock; late requests after the others, requests without a deadline
    last, each group by arrival."""
    ttft, tpot, it, dflt, e2e = fp[1], fp[2], fp[3], fp[4], fp[5]
    for k in range(m):
        i = cand[k]
        plan = float(phi[i]) if has_pred else dflt
        gg = float(gen[i])
        plan = max(plan, gg + 1.0)
        stream = arrival[i] + ttft + (plan - 1.0) * tpot
        if math.isnan(stream):  # an infinite target times zero tokens
            stream = np.inf
        deadline = min(stream, arrival[i] + e2e)
        slack = deadline - now - (plan - gg) * it
        res[k] = 1.0e12 + arrival[i] if slack < 0 else slack
        if math.isinf(deadline):  # no deadline: after every request that has one
            res[k] = 2.0e12 + arrival[i]


@njit(cache=True)
def _dpp_classes(fp, ip, cand, m, arrival, prompt, computed, tenant, res):
    """DPP's class order: classes by weight x prefill backlog (largest first), FCFS
    within a class; FCFS with one class."""
    n_cls = ip[0]
    if n_cls == 1 or m == 0:
        for k in range(m):
            res[k] = arrival[cand[k]]
        return
    q = np.zeros(n_cls)
    for k in range(m):
        i = cand[k]
        c = min(max(tenant[i], 0), n_cls - 1)
        q[c] += float(max(prompt[i] - computed[i], 0))
    score = np.empty(n_cls)
    for c in range(n_cls):
        score[c] = fp[c] * q[c]
    order = np.argsort(-score, kind="mergesort")
    pos = np.empty(n_cls)
    for r in range(n_cls):
        pos[order[r]] = float(r)
    lo, hi = arrival[cand[0]], arrival[cand[0]]
    for k in range(m):
        a = arrival[cand[k]]
        lo = min(lo, a)
        hi = max(hi, a)
    span = float(hi - lo) + 1.0
    for k in range(m):
        i = cand[k]
        c = min(max(tenant[i], 0), n_cls - 1)
        res[k] = pos[c] * span + (arrival[i] - lo)


@njit(cache=True)
def _waiting_positions(run, m):
    """Positions ``k < m`` of the waiting candidates (``run[k]`` false), in order."""
    nw = 0
    for k in range(m):
        if not run[k]:
            nw += 1
    w = np.empty(nw, np.int64)
    j = 0
    for k in range(m):
        if not run[k]:
            w[j] = k
            j += 1
    return w


@njit(cache=True)
def _stable_by(w, key):
    """Positions ``w`` stably reordered by ``key[w]`` (``key`` over every position)."""
    return w[np.argsort(key[w], kind="mergesort")]


@njit(cache=True)
def _mcsf(fp, ip, cand, run, m, arrival, prompt, gen, out, plo, phi, has_pred,
          total_blocks, block_tokens, res):
    """MCSF's ranks of ``cand[:m]`` into ``res`` (``lpserve.policies.schedulers``): the
    running keep their seats; waiting candidates, by (planned length, arrival, position),
    join while seats are left and the batch's future memory fits
    (``models/schedule-ip.md`` (10)); the rest are held back (``+inf``)."""
    assume, default_tokens, max_batch = ip[0], ip[1], ip[2]
    cap = float(total_blocks * block_tokens)
    slack = float(block_tokens - 1)
    plan = np.empty(m)
    ctx = np.empty(m)
    rem = np.empty(m)
    for k in range(m):
        i = cand[k]
        gg = float(gen[i])
        p = _planned(assume, k, out[i], plo[i], phi[i], has_pred, default_tokens, gg)
        p = min(p, cap - slack - prompt[i])
        p = max(p, gg + 1.0)
        plan[k] = p
        ctx[k] = prompt[i] + gg
        rem[k] = max(p - gg, 1.0)
    base = np.empty(m)
    rr = np.empty(m)
    nb = 0
    n_run = 0
    for k in range(m):
        if run[k]:
            res[k] = plan[k] if assume == 2 else _RUNNING_RANK
            base[nb] = ctx[k]
            rr[nb] = rem[k]
            nb += 1
            n_run += 1
        else:
            res[k] = math.inf
    wait = _waiting_positions(run, m)
    nw = wait.shape[0]
    # order by (plan, arrival, position)
    o1 = np.argsort(wait, kind="mergesort")
    a1 = np.empty(nw)
    for t in range(nw):
        a1[t] = arrival[cand[wait[o1[t]]]]
    o2 = o1[np.argsort(a1, kind="mergesort")]
    p2 = np.empty(nw)
    for t in range(nw):
        p2[t] = plan[wait[o2[t]]]
    order = o2[np.argsort(p2, kind="mergesort")]
    seats = max(max_batch - n_run, 0)
    for t in range(min(seats, nw)):
        j = wait[order[t]]
        base[nb] = ctx[j]
        rr[nb] = rem[j]
        if not _fits(base, rr, nb + 1, cap, slack):
            if nb == 0:  # idle replica: release it and let the engine decide
                res[j] = plan[j]
            break
        nb += 1
        res[j] = plan[j]


@njit(cache=True)
def _mlfq(fp, ip, cand, run, m, now, rep, arrival, prompt, phi, has_pred, rf, ri, xf, xi, g,
          res):
    """The MLFQ family's ranks of ``cand[:m]`` into ``res`` at ``now`` (s) on replica
    ``rep`` (``lpserve.policies.mlfq``): a request enters at the level of its estimated
    first service, drops one level each time its service there reaches the level's
    quantum (``base * 2**level``) and returns to level 0 after waiting the starvation
    threshold; ranked by level, then by when it entered the level."""
    base, pf_s, dec_s, thr0, period, dflt = fp[1], fp[2], fp[3], fp[4], fp[5], fp[6]
    entry, adaptive, strict = ip[0], ip[1], ip[2]  # entry 0 first, 1 prefill, 2 predicted
    last = xf[rep, X_LAST_NOW]
    dt = max(now - (now if math.isnan(last) else last), 0.0)
    xf[rep, X_LAST_NOW] = now
    n_run = 0
    for k in range(m):
        if run[k]:
            n_run += 1
    n_run = max(n_run, 1)
    use_thr = thr0 > 0.0
    thr = thr0
    tick = tick_index(now, period)
    if use_thr and tick <= xi[rep, XI_CHECK]:
        use_thr = False
    elif use_thr:
        xi[rep, XI_CHECK] = int(tick)
    if use_thr and adaptive:
        thr = thr * max(1.0, m / n_run)
    for k in range(m):
        i = cand[k]
        if ri[RI_INIT, i] == 0:
            if entry == 0:
                s = 0.0
            else:
                s = float(prompt[i]) * pf_s
                if entry == 2:
                    tokens = float(phi[i]) if has_pred else dflt
                    s += max(tokens - 1.0, 0.0) * dec_s
            ri[RI_INIT, i] = 1
            ri[RI_LEVEL, i] = _entry_level(s, base)
            rf[RF_USED, i] = 0.0
            rf[RF_ENTERED, i] = arrival[i]
            rf[RF_LAST, i] = now
        if run[k]:
            rf[RF_USED, i] += dt
            while True:
                q = base * 2.0 ** ri[RI_LEVEL, i]
                used = rf[RF_USED, i]
                done = used >= q - 1e-12 if strict == 0 else used > q + 1e-12
                if not done:
                    break
                rf[RF_USED, i] = 0.0
                ri[RI_LEVEL, i] += 1
                rf[RF_ENTERED, i] = now
                g[G_DEMOTIONS] += 1
            rf[RF_LAST, i] = now
        elif use_thr and now - rf[RF_LAST, i] >= thr and ri[RI_LEVEL, i] > 0:
            ri[RI_LEVEL, i] = 0
            rf[RF_USED, i] = 0.0
            rf[RF_ENTERED, i] = now
            rf[RF_LAST, i] = now
        res[k] = ri[RI_LEVEL, i] * _LEVEL_SCALE + rf[RF_ENTERED, i]


@njit(cache=True)
def _program(fp, ip, cand, run, m, now, rep, arrival, prog_id, rf, ri, pf, xf, xi, g, res):
    """Ranks of the program-level schedulers (PLAS, ATLAS, PLAS x MLFQ;
    ``lpserve.policies.programs``, Autellix's discretized queues) of ``cand[:m]`` into
    ``res`` at ``now`` (s): a call enters the queue of its inherited program priority,
    runs FCFS within it, drops a queue per quantum of service and returns to queue 0 by
    the anti-starvation rule."""
    base, beta = fp[1], fp[2]
    atlas, two_level = ip[0], ip[1]
    last = xf[rep, X_LAST_NOW]
    dt = max(now - (now if math.isnan(last) else last), 0.0)
    xf[rep, X_LAST_NOW] = now
    # calls that left the replica's candidates since its last decision finished, in
    # ascending request order
    m0 = xi[rep, XI_M] if xi[rep, XI_VALID] else 0
    g[G_STAMP] += 1
    stamp = g[G_STAMP]
    for k in range(m):
        ri[RI_MARK, cand[k]] = stamp
    gone = np.empty(m0, np.int64)
    n_gone = 0
    for t in range(m0):
        i = xi[rep, N_XI_HEAD + t]
        if ri[RI_MARK, i] != stamp:
            gone[n_gone] = i
            n_gone += 1
    gone = np.sort(gone[:n_gone])
    for t in range(n_gone):
        i = gone[t]
        if ri[RI_INIT, i] == 0:
            continue
        ri[RI_INIT, i] = 0
        pr = ri[RI_PROG, i]
        pf[1, pr] = max(pf[1, pr], rf[RF_C6, i] + rf[RF_C7, i])
        pf[2, pr] += rf[RF_C4, i]
        pf[3, pr] += rf[RF_C5, i]
    for k in range(m):
        i = cand[k]
        pr = prog_id[i]
        if ri[RI_INIT, i] == 0:
            inh = pf[1, pr] if atlas else pf[0, pr]
            ri[RI_INIT, i] = 1
            ri[RI_PROG, i] = pr
            ri[RI_LEVEL, i] = 0 if two_level else _queue_of(inh, base)
            rf[RF_USED, i] = 0.0
            rf[RF_ENTERED, i] = arrival[i]
            rf[RF_C4, i] = 0.0
            rf[RF_C5, i] = 0.0
            rf[RF_C6, i] = inh
            rf[RF_C7, i] = 0.0
        if run[k]:
            rf[RF_USED, i] += dt
            rf[RF_C5, i] += dt
            rf[RF_C7, i] += dt
            pf[0, pr] += dt
            while rf[RF_USED, i] >= base * 2.0 ** ri[RI_LEVEL, i] - 1e-12:
                rf[RF_USED, i] = 0.0
                ri[RI_LEVEL, i] += 1
                rf[RF_ENTERED, i] = now
        else:
            rf[RF_C4, i] += dt
        if beta > 0.0 and ri[RI_LEVEL, i] > 0:
            wsum = pf[2, pr] + rf[RF_C4, i]
            ssum = pf[3, pr] + rf[RF_C5, i]
            if wsum >= beta * max(ssum, base):
                ri[RI_LEVEL, i] = 0
                rf[RF_USED, i] = 0.0
                rf[RF_ENTERED, i] = now
                rf[RF_C4, i] = 0.0
                rf[RF_C5, i] = 0.0
        level = ri[RI_LEVEL, i]
        if two_level:
            level = min(_queue_of(pf[0, pr], base), 63) * 64 + min(level, 63)
        res[k] = level * _LEVEL_SCALE + rf[RF_ENTERED, i]


@njit(cache=True)
def _wait(fp, ip, cand, run, m, now, arrival, prompt, out, res):
    """Twin of ``WAIT._rank`` (``lpserve/policies/wait.py``): ``fp`` = (quantum_s or 0,
    flush_after_s or inf, default threshold), ``ip`` = (number of listed types, then
    prompt, output and threshold of each). Running candidates rank first; the waiting
    ones of a type are held until its threshold ``n`` wait (or, with a flush, the oldest
    waited ``flush_after_s`` at the tick's start), then the ``n`` oldest rank by arrival."""
    for k in range(m):
        res[k] = _RUNNING_RANK if run[k] else np.inf
    w = _waiting_positions(run, m)
    nw = w.shape[0]
    # waiting positions by (prompt, output, arrival, request): stable sorts, last key first
    c = cand[:m]
    w = _stable_by(w, c.astype(np.float64))
    w = _stable_by(w, arrival[c])
    w = _stable_by(w, out[c].astype(np.float64))
    w = _stable_by(w, prompt[c].astype(np.float64))
    q_s, flush_s, n_types = fp[0], fp[1], ip[0]
    start = 0
    while start < nw:
        p0, o0 = prompt[cand[w[start]]], out[cand[w[start]]]
        end = start + 1
        while end < nw and prompt[cand[w[end]]] == p0 and out[cand[w[end]]] == o0:
            end += 1
        n = int(fp[2])
        for t in range(n_types):
            if ip[1 + 3 * t] == p0 and ip[2 + 3 * t] == o0:
                n = ip[3 + 3 * t]
                break
        if n > 0:
            due = end - start >= n
            if not due and not math.isinf(flush_s):
                tick_s = tick_index(now, q_s) * q_s
                due = tick_s - arrival[cand[w[start]]] >= flush_s
            if due:
                for q in range(start, min(end, start + n)):
                    res[w[q]] = arrival[cand[w[q]]]
        start = end


@njit(cache=True)
def next_tick_s(now_s, quantum_s):
    """Twin of :func:`lpserve.policy.roles.next_tick_s`: start (s) of the quantum tick after
    the one holding ``now_s`` (always > ``now_s``)."""
    return (tick_index(now_s, quantum_s) + 1.0) * quantum_s


@njit(cache=True)
def ask_timed(kind):
    """Whether the scheduler of ``kind`` is in :data:`ASK_TIMED`."""
    for t in ASK_TIMED:
        if kind == t:
            return True
    return False


@njit(cache=True)
def ranks(kind, fp, ip, cand, run, m, now, rep, arrival, prompt, gen, computed, out, tenant,
          plo, phi, has_pred, prog_id, total_blocks, block_tokens, rf, ri, pf, xf, xi, xr, g,
          res):
    """Ranks of the replica's candidates ``cand[:m]`` (waiting first, then running, with
    their ``run`` flags) into ``res[:m]``, by the scheduler of ``kind``.

    A time-sliced kind (``TICKED``; its quantum is ``fp[0]``) repeats its last ranks on
    this replica when the tick, the candidates and their running flags are unchanged
    (``xi``/``xf``/``xr`` hold the last decision's key and ranks)."""
    ticked = False
    for t in TICKED:
        if kind == t:
            ticked = True
    if ticked:
        tick = tick_of(now, fp[0])
        same = xi[rep, XI_VALID] == 1 and xi[rep, XI_M] == m and xf[rep, X_TICK] == tick
        if same:
            for k in range(m):
                if xi[rep, N_XI_HEAD + k] != cand[k] or xi[rep, N_XI_HEAD + m + k] != run[k]:
                    same = False
                    break
        if same:
            for k in range(m):
                res[k] = xr[rep, k]
            return
        _fresh(kind, fp, ip, cand, run, m, now, rep, arrival, prompt, gen, computed, out,
               tenant, plo, phi, has_pred, prog_id, total_blocks, block_tokens, rf, ri, pf,
               xf, xi, g, res)
        xi[rep, XI_VALID] = 1
        xi[rep, XI_M] = m
        xf[rep, X_TICK] = tick
        for k in range(m):
            xi[rep, N_XI_HEAD + k] = cand[k]
            xi[rep, N_XI_HEAD + m + k] = run[k]
            xr[rep, k] = res[k]
        return
    _fresh(kind, fp, ip, cand, run, m, now, rep, arrival, prompt, gen, computed, out, tenant,
           plo, phi, has_pred, prog_id, total_blocks, block_tokens, rf, ri, pf, xf, xi, g, res)
