"""Numba kernels of the drift-plus-penalty (DPP) prefill controller, each beside a
plain-Python ``_ref`` twin that gives the same results (tests assert equality).

The mathematics is ``models/lyapunov-pd.md``; equation numbers are cited beside the code.

Arrays
------
``cp`` (float64) controller parameters, layout ``CP_*``:
    V (penalty weight), S_TBT (s), EPS (allowed fraction of token gaps above S_TBT),
    ETA (token unit of the backlog, tokens), THETA (KV occupancy target in [0, 1]),
    GRAIN (step of the chunk menu, tokens), BT (tokens per KV block).
``st`` (float64) per-replica controller state, layout ``ST_*``: the virtual queues
    ``Z_TBT`` (token gaps) and ``Z_KV`` (occupancy), running sums for time averages, and a
    log-spaced histogram of observed token gaps (``HIST_*``).
``params``: the cost model's flat array (``lpserve.cost.iteration_time``).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from lpserve.cost import decode_sums, iteration_time, iteration_time_ref, iteration_time_sums

CP_V = 0
CP_S_TBT = 1
CP_EPS = 2
CP_ETA = 3
CP_THETA = 4
CP_GRAIN = 5
CP_BT = 6
N_CP = 7

ST_ZT = 0          # virtual queue of token gaps slower than S_TBT, eq. (5)
ST_ZM = 1          # virtual queue of KV occupancy above THETA, eq. (6)
ST_SLOTS = 2       # iterations observed
ST_PEN = 3         # sum of per-iteration penalties p(t), eq. (7) (s)
ST_Q = 4           # sum over iterations of the prefill backlog Q(t) (tokens)
ST_GAPS = 5        # token gaps observed (TBT samples)
ST_VIOL = 6        # token gaps > S_TBT
ST_ZT_SUM = 7      # sum of Z_TBT over iterations
ST_ZM_SUM = 8      # sum of Z_KV over iterations
ST_LAST_PEN = 9    # penalty of the last decision (charged when the iteration runs)
ST_LAST_U = 10     # prefill tokens of the last decision
ST_MAX_Q = 11      # largest backlog seen (tokens)
ST_SLOT_VIOL = 12  # sum over iterations of n_dec * 1[T > S_TBT]
ST_SLOT_DEC = 13   # sum over iterations of n_dec
HIST_START = 16
HIST_BINS = 240
HIST_LO_LOG10 = -4.0  # 0.1 ms
HIST_BINS_PER_DECADE = 40.0
N_ST = HIST_START + HIST_BINS


# =====================================================================================
# per-slot decision, eq. (9)
# =====================================================================================
@njit(cache=True)
def _value(q_class, w_class, u, eta, used):
    """Backlog weight served by ``u`` tokens: greedy over classes by weight, eq. (10)
    (``used``: bool scratch of one entry per class)."""
    n = q_class.shape[0]
    used[:] = False
    left = float(u)
    val = 0.0
    for _ in range(n):
        best = -1
        bw = -1.0
        for c in range(n):
            if not used[c] and q_class[c] > 0.0 and w_class[c] * q_class[c] > bw:
                bw = w_class[c] * q_class[c]
                best = c
        if best < 0 or left <= 0.0:
            break
        used[best] = True
        take = min(left, q_class[best])
        val += (w_class[best] * q_class[best] / eta) * (take / eta)
        left -= take
    return val


@njit(cache=True)
def _plan_time(params, plan_tokens, plan_cached, u, n_dec, ctx_sum, win_sum, buf_t, buf_c):
    """Iteration time when ``u`` prefill tokens fill the plan in order, eq. (8), beside the
    decode batch of ``n_dec`` requests with the context sums ``ctx_sum, win_sum``
    (``lpserve.cost._kernels.decode_sums``)."""
    k = 0
    left = u
    for i in range(plan_tokens.shape[0]):
        if left <= 0:
            break
        c = min(left, plan_tokens[i])
        buf_t[k] = c
        buf_c[k] = plan_cached[i]
        left -= c
        k += 1
    if left > 0:
        buf_t[k] = left
        buf_c[k] = 0
        k += 1
    return iteration_time_sums(params, buf_t[:k], buf_c[:k], n_dec, ctx_sum, win_sum)


def _plan_time_ref(params, plan_tokens, plan_cached, u, ctx, iter_time):
    ts, cs, left = [], [], u
    for c_max, cached in zip(plan_tokens, plan_cached):
        if left <= 0:
            break
        c = min(left, int(c_max))
        ts.append(c)
        cs.append(int(cached))
        left -= c
    if left > 0:
        ts.append(left)
        cs.append(0)
    return float(iter_time(params, np.array(ts, np.int64), np.array(cs, np.int64),
                           np.asarray(ctx, np.int64)))


@njit(cache=True)
def dpp_decide(params, cp, st, q_class, w_class, plan_tokens, plan_cached, ctx, used_blocks,
               total_blocks, cap_tokens):
    """Prefill tokens ``u`` for the next iteration: the minimizer of eq. (9) on the menu.

    Args:
        q_class: float64 ``(C,)`` prefill backlog per class (tokens).
        w_class: float64 ``(C,)`` class weights (>= 0).
        plan_tokens, plan_cached: int64 ``(P,)`` the engine's prefill candidates in the
            order it fills a budget: tokens left to prefill and tokens already in KV
            (``u`` tokens become the chunks of the first candidates, eq. (8)).
        ctx: int64 ``(n_dec,)`` contexts of the running decodes.
        used_blocks, total_blocks: KV blocks in use / in the pool.
        cap_tokens: most prefill tokens the engine can place (budget and memory).

    Returns ``u`` (int); writes the decision's penalty and ``u`` into ``st``.
    """
    empty = np.zeros(0, np.int64)
    buf_t = np.zeros(plan_tokens.shape[0] + 1, np.int64)
    buf_c = np.zeros(plan_tokens.shape[0] + 1, np.int64)
    n_dec = ctx.shape[0]
    q_tot = 0.0
    for c in range(q_class.shape[0]):
        q_tot += q_class[c]
    cap = min(float(cap_tokens), q_tot)
    cap_i = int(max(cap, 0.0))
    ctx_sum, win_sum = decode_sums(params, ctx)
    t0 = iteration_time_sums(params, empty, empty, n_dec, ctx_sum, win_sum) if n_dec > 0 \
        else 0.0
    used = np.zeros(q_class.shape[0], np.bool_)
    V = cp[CP_V]
    S = cp[CP_S_TBT]
    eta = cp[CP_ETA]
    grain = int(cp[CP_GRAIN])
    bt = cp[CP_BT]
    best_u = 0
    best_j = math.inf
    best_p = 0.0
    k = 0
    while True:
        u = k * grain
        if u > cap_i:
            if (k - 1) * grain >= cap_i:
                break
            u = cap_i
        if u == 0:
            t = t0
        else:
            t = _plan_time(params, plan_tokens, plan_cached, u, n_dec, ctx_sum, win_sum,
                           buf_t, buf_c)
        pen = n_dec * (t - t0)
        j = V * pen - _value(q_class, w_class, u, eta, used)
        if n_dec > 0 and t > S:
            j += st[ST_ZT] * n_dec
        j += st[ST_ZM] * math.ceil(u / bt) / max(total_blocks, 1)
        if j <= best_j:  # ties go to the larger chunk (work conservation)
            best_j = j
            best_u = u
            best_p = pen
        if u >= cap_i:
            break
        k += 1
    st[ST_LAST_PEN] = best_p
    st[ST_LAST_U] = best_u
    return best_u


def _value_ref(q_class, w_class, u, eta):
    order = sorted((c for c in range(len(q_class)) if q_class[c] > 0),
                   key=lambda c: (-(w_class[c] * q_class[c]), c))
    left, val = float(u), 0.0
    for c in order:
        if left <= 0:
            break
        take = min(left, q_class[c])
        val += (w_class[c] * q_class[c] / eta) * (take / eta)
        left -= take
    return val


def dpp_decide_ref(params, cp, st, q_class, w_class, plan_tokens, plan_cached, ctx,
                   used_blocks, total_blocks, cap_tokens, iter_time=iteration_time_ref):
    """Plain-Python twin of :func:`dpp_decide`."""
    n_dec = len(ctx)
    e = np.zeros(0, np.int64)
    ctx = np.asarray(ctx, np.int64)
    cap_i = int(max(min(float(cap_tokens), float(sum(q_class))), 0.0))
    t0 = float(iter_time(params, e, e, ctx)) if n_dec else 0.0
    grain = int(cp[CP_GRAIN])
    menu = list(range(0, cap_i + 1, grain))
    if menu[-1] != cap_i:
        menu.append(cap_i)
    best = (math.inf, 0, 0.0)
    for u in menu:
        t = t0 if u == 0 else _plan_time_ref(params, plan_tokens, plan_cached, u, ctx,
                                             iter_time)
        pen = n_dec * (t - t0)
        j = cp[CP_V] * pen - _value_ref(q_class, w_class, u, cp[CP_ETA])
        if n_dec > 0 and t > cp[CP_S_TBT]:
            j += st[ST_ZT] * n_dec
        j += st[ST_ZM] * math.ceil(u / cp[CP_BT]) / max(total_blocks, 1)
        if j <= best[0]:
            best = (j, u, pen)
    st[ST_LAST_PEN] = best[2]
    st[ST_LAST_U] = best[1]
    return best[1]


# =====================================================================================
# observation: queue updates (5), (6) and statistics
# =====================================================================================
@njit(cache=True)
def _hist_add(st, gap_s, count):
    if gap_s <= 0.0:
        b = 0
    else:
        b = int(math.floor((math.log10(gap_s) - HIST_LO_LOG10) * HIST_BINS_PER_DECADE))
        b = min(max(b, 0), HIST_BINS - 1)
    st[HIST_START + b] += count


@njit(cache=True)
def dpp_observe(cp, st, dt_s, n_dec, used_blocks, total_blocks, q_tokens, gaps_s):
    """Account one iteration of ``dt_s`` seconds with ``n_dec`` decodes.

    ``gaps_s`` are the token gaps (TBT samples) the iteration produced; ``q_tokens`` the
    prefill backlog when it was planned. Updates Z_TBT by eq. (5), Z_KV by eq. (6).
    """
    _observe_slot(cp, st, dt_s, n_dec, used_blocks, total_blocks, q_tokens)
    S = cp[CP_S_TBT]
    for g in gaps_s:
        st[ST_GAPS] += 1.0
        if g > S:
            st[ST_VIOL] += 1.0
        _hist_add(st, g, 1.0)


@njit(cache=True)
def dpp_observe_equal(cp, st, dt_s, n_dec, used_blocks, total_blocks, q_tokens, gap_s):
    """:func:`dpp_observe` of an iteration whose ``n_dec`` token gaps all equal ``gap_s``
    (a decode run's iterations after its first): the counts grow by ``n_dec`` at once,
    the same floats as one by one (whole numbers below 2**53)."""
    _observe_slot(cp, st, dt_s, n_dec, used_blocks, total_blocks, q_tokens)
    st[ST_GAPS] += float(n_dec)
    if gap_s > cp[CP_S_TBT]:
        st[ST_VIOL] += float(n_dec)
    _hist_add(st, gap_s, float(n_dec))


@njit(cache=True)
def _observe_slot(cp, st, dt_s, n_dec, used_blocks, total_blocks, q_tokens):
    """The per-iteration part of :func:`dpp_observe`: queues (5), (6) and slot counts."""
    S = cp[CP_S_TBT]
    viol = 1.0 if dt_s > S else 0.0
    st[ST_SLOTS] += 1.0
    st[ST_PEN] += st[ST_LAST_PEN]
    st[ST_Q] += q_tokens
    st[ST_MAX_Q] = max(st[ST_MAX_Q], q_tokens)
    st[ST_ZT_SUM] += st[ST_ZT]
    st[ST_ZM_SUM] += st[ST_ZM]
    st[ST_SLOT_VIOL] += n_dec * viol
    st[ST_SLOT_DEC] += n_dec
    st[ST_ZT] = max(st[ST_ZT] + n_dec * (viol - cp[CP_EPS]), 0.0)
    st[ST_ZM] = max(st[ST_ZM] + used_blocks / max(total_blocks, 1) - cp[CP_THETA], 0.0)
    st[ST_LAST_PEN] = 0.0
    st[ST_LAST_U] = 0.0


def _hist_add_ref(st, gap_s, count):
    if gap_s <= 0.0:
        b = 0
    else:
        b = int(math.floor((math.log10(gap_s) - HIST_LO_LOG10) * HIST_BINS_PER_DECADE))
        b = min(max(b, 0), HIST_BINS - 1)
    st[HIST_START + b] += count


def dpp_observe_ref(cp, st, dt_s, n_dec, used_blocks, total_blocks, q_tokens, gaps_s):
    """Plain-Python twin of :func:`dpp_observe`."""
    viol = 1.0 if dt_s > cp[CP_S_TBT] else 0.0
    st[ST_SLOTS] += 1.0
    st[ST_PEN] += st[ST_LAST_PEN]
    st[ST_Q] += q_tokens
    st[ST_MAX_Q] = max(st[ST_MAX_Q], q_tokens)
    st[ST_ZT_SUM] += st[ST_ZT]
    st[ST_ZM_SUM] += st[ST_ZM]
    st[ST_SLOT_VIOL] += n_dec * viol
    st[ST_SLOT_DEC] += n_dec
    st[ST_ZT] = max(st[ST_ZT] + n_dec * (viol - cp[CP_EPS]), 0.0)
    st[ST_ZM] = max(st[ST_ZM] + used_blocks / max(total_blocks, 1) - cp[CP_THETA], 0.0)
    st[ST_LAST_PEN] = 0.0
    st[ST_LAST_U] = 0.0
    for g in gaps_s:
        st[ST_GAPS] += 1.0
        if g > cp[CP_S_TBT]:
            st[ST_VIOL] += 1.0
        _hist_add_ref(st, g, 1.0)


# =====================================================================================
# runs of pure-decode iterations (the simulator's fast path)
# =====================================================================================
@njit(cache=True)
def dpp_decode_run(params, cp, st, ctx0, held0, first_gap_s, used0, total_blocks, q_tokens,
                   q_class, w_class, plan_tokens, plan_cached, cap_tokens, u0, n_iters,
                   decide, now_s):
    """Observe ``n_iters`` pure-decode iterations of one fixed batch, in order.

    Iteration ``k`` sees contexts ``ctx0 + k``; its first iteration already holds its
    blocks (``held0``), later ones take a block when a token crosses a block boundary
    (as ``lpserve.sim._kernels.decode_advance``). ``first_gap_s[j]`` is request ``j``'s
    gap before its first token of the run minus the first iteration's time (0 for a
    request that decoded in the iteration before).

    With ``decide`` true the kernel instead stops *before* the first iteration ``k >= 1``
    whose decision, eq. (9), would differ from ``u0`` and returns that ``k`` (or
    ``n_iters``) without changing ``st``; the caller then runs that many iterations and
    calls again with ``decide`` false.

    Returns ``(k, end_s)``: iterations (run or allowed) and the end time of the last one
    (``now_s`` plus the iteration times, summed in order as the simulator does).
    """
    m = ctx0.shape[0]
    ctx = ctx0.copy()
    held = held0.copy()
    used = used0
    empty = np.zeros(0, np.int64)
    gaps = np.zeros(m, np.float64)
    work = st.copy() if decide else st
    for k in range(n_iters):
        if k >= 1:  # the planner gives iteration k its new blocks before deciding
            for j in range(m):
                if ctx[j] + 1 > held[j] * cp[CP_BT]:
                    held[j] += 1
                    used += 1
        if decide and k >= 1:
            u = dpp_decide(params, cp, work, q_class, w_class, plan_tokens, plan_cached, ctx,
                           used, total_blocks, cap_tokens)
            if u != u0:
                return k, now_s
        dt = iteration_time(params, empty, empty, ctx)
        now_s += dt
        for j in range(m):
            ctx[j] += 1
        work[ST_LAST_PEN] = 0.0  # no prefill ran: a pure-decode iteration has no penalty
        if k == 0:
            for j in range(m):
                gaps[j] = dt + first_gap_s[j]
            dpp_observe(cp, work, dt, m, used, total_blocks, q_tokens, gaps)
        else:  # every request's gap is this iteration's time
            dpp_observe_equal(cp, work, dt, m, used, total_blocks, q_tokens, dt)
    return n_iters, now_s


def dpp_decode_run_ref(params, cp, st, ctx0, held0, first_gap_s, used0, total_blocks,
                       q_tokens, q_class, w_class, plan_tokens, plan_cached, cap_tokens, u0,
                       n_iters, decide, now_s, iter_time=iteration_time_ref):
    """Plain-Python twin of :func:`dpp_decode_run`."""
    m = len(ctx0)
    ctx = np.array(ctx0, np.int64)
    held = np.array(held0, np.int64)
    used = used0
    e = np.zeros(0, np.int64)
    work = st.copy() if decide else st
    for k in range(n_iters):
        if k >= 1:
            for j in range(m):
                if ctx[j] + 1 > held[j] * cp[CP_BT]:
                    held[j] += 1
                    used += 1
        if decide and k >= 1:
            u = dpp_decide_ref(params, cp, work, q_class, w_class, plan_tokens, plan_cached,
                               ctx, used, total_blocks, cap_tokens, iter_time)
            if u != u0:
                return k, now_s
        dt = float(iter_time(params, e, e, ctx))
        now_s += dt
        gaps = np.array([dt + (first_gap_s[j] if k == 0 else 0.0) for j in range(m)])
        ctx += 1
        work[ST_LAST_PEN] = 0.0
        dpp_observe_ref(cp, work, dt, m, used, total_blocks, q_tokens, gaps)
    return n_iters, now_s


# =====================================================================================
# the slotted model of the theorem (i.i.d. arrivals and decode counts)
# =====================================================================================
@njit(cache=True)
def dpp_slotted(params, cp, arrivals_tokens, n_dec, ctx_tokens, cap_tokens, total_blocks):
    """Run the controller on the slotted model of ``models/lyapunov-pd.md`` section 4.

    Slot ``t`` has ``n_dec[t]`` decodes of context ``ctx_tokens`` (exogenous, i.i.d.)
    and ``arrivals_tokens[t]`` new prefill tokens arriving at its end; the controller
    picks ``u(t)`` by eq. (9); the backlog follows eq. (3) and the iteration takes the
    cost model's time. KV occupancy is held at zero (``THETA`` then never binds).

    Returns ``(st, backlog)``: the final state (time averages in its sums) and the
    backlog ``Q(t)`` per slot (tokens).
    """
    T = arrivals_tokens.shape[0]
    st = np.zeros(N_ST, np.float64)
    q = np.zeros(1, np.float64)
    w = np.ones(1, np.float64)
    backlog = np.zeros(T, np.float64)
    one = np.zeros(1, np.int64)
    zero = np.zeros(1, np.int64)
    plan = np.zeros(1, np.int64)
    nogaps = np.zeros(0, np.float64)
    for t in range(T):
        ctx = np.full(n_dec[t], ctx_tokens, np.int64)
        backlog[t] = q[0]
        plan[0] = int(q[0])
        u = dpp_decide(params, cp, st, q, w, plan, zero, ctx, np.int64(0), total_blocks,
                       cap_tokens - n_dec[t])
        one[0] = u
        dt = iteration_time(params, one, zero, ctx)
        dpp_observe(cp, st, dt, n_dec[t], np.int64(0), total_blocks, q[0], nogaps)
        q[0] = q[0] - u + arrivals_tokens[t]
    return st, backlog


def dpp_slotted_ref(params, cp, arrivals_tokens, n_dec, ctx_tokens, cap_tokens, total_blocks,
                    iter_time=iteration_time_ref):
    """Plain-Python twin of :func:`dpp_slotted`."""
    st = np.zeros(N_ST, np.float64)
    q = np.zeros(1, np.float64)
    w = np.ones(1, np.float64)
    backlog = np.zeros(len(arrivals_tokens), np.float64)
    for t in range(len(arrivals_tokens)):
        ctx = np.full(int(n_dec[t]), ctx_tokens, np.int64)
        backlog[t] = q[0]
        u = dpp_decide_ref(params, cp, st, q, w, [int(q[0])], [0], ctx, 0, total_blocks,
                           cap_tokens - int(n_dec[t]), iter_time)
        dt = float(iter_time(params, np.array([u], np.int64), np.zeros(1, np.int64), ctx))
        dpp_observe_ref(cp, st, dt, int(n_dec[t]), 0, total_blocks, q[0], np.zeros(0))
        q[0] = q[0] - u + arrivals_tokens[t]
    return st, backlog
