"""Numba kernels of the simulator, each beside a plain-Python ``_ref`` twin.

``decode_advance`` advances a fixed batch of decoding requests through whole runs of
iterations between two events, with exact per-iteration times from the cost kernel.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from lpserve.cost import iteration_time, iteration_time_ref

# why a run of decode iterations stopped
STOP_LIMIT = 0    # max_iters reached
STOP_TIME = 1     # the next iteration would start at or after stop_s
STOP_MEMORY = 2   # the next iteration needs more new blocks than are free without eviction
STOP_DONE = 3     # a request produced its last token in the iteration just run


@njit(cache=True)
def decode_advance(params, ctx, gen, out, held, block_tokens, free_blocks, used_blocks,
                   now_s, stop_s, max_iters):
    """Run pure-decode iterations of one batch in place until an event.

    Args:
        params: cost-model parameters (float64), see ``lpserve.cost.iteration_time``.
        ctx: int64 ``(m,)`` tokens in KV per request (the decode context); +1 per iteration.
        gen: int64 ``(m,)`` output tokens produced so far; +1 per iteration.
        out: int64 ``(m,)`` output tokens each request will produce in total.
        held: int64 ``(m,)`` KV blocks held; +1 when an iteration's token needs a new block.
        block_tokens: tokens per KV block.
        free_blocks: blocks that can be taken without eviction.
        used_blocks: blocks in use on the replica at the start (for the utilization integral).
        now_s: start time of the next iteration (s).
        stop_s: no iteration starts at or after this time (s).
        max_iters: most iterations to run.

    An empty batch returns at once with ``STOP_DONE``.

    Returns:
        ``(n_iters, now_s, new_blocks, stop_reason, used_block_seconds)``: iterations run,
        end time of the last one, blocks taken, one of the ``STOP_*`` codes, and the
        integral of blocks in use over the run (block * s).
    """
    empty = np.zeros(0, np.int64)
    m = ctx.shape[0]
    n = 0
    taken = 0
    area = 0.0
    reason = STOP_LIMIT
    if m == 0:  # an empty batch takes no time: nothing to run
        return n, now_s, taken, STOP_DONE, area
    while n < max_iters:
        if now_s >= stop_s:
            reason = STOP_TIME
            break
        need = 0
        for j in range(m):
            if ctx[j] + 1 > held[j] * block_tokens:
                need += 1
        if taken + need > free_blocks:
            reason = STOP_MEMORY
            break
        dt = iteration_time(params, empty, empty, ctx)
        now_s += dt
        done = False
        for j in range(m):
            if ctx[j] + 1 > held[j] * block_tokens:
                held[j] += 1
            ctx[j] += 1
            gen[j] += 1
            if gen[j] >= out[j]:
                done = True
        taken += need
        area += (used_blocks + taken) * dt
        n += 1
        if done:
            reason = STOP_DONE
            break
    return n, now_s, taken, reason, area


def decode_advance_ref(params, ctx, gen, out, held, block_tokens, free_blocks, used_blocks,
                       now_s, stop_s, max_iters, iter_time=iteration_time_ref):
    """Plain-Python twin of :func:`decode_advance` (same arguments and results)."""
    m = len(ctx)
    n = taken = 0
    area = 0.0
    reason = STOP_LIMIT
    if m == 0:
        return n, now_s, taken, STOP_DONE, area
    while n < max_iters:
        if now_s >= stop_s:
            reason = STOP_TIME
            break
        grows = [ctx[j] + 1 > held[j] * block_tokens for j in range(m)]
        if taken + sum(grows) > free_blocks:
            reason = STOP_MEMORY
            break
        dt = float(iter_time(params, np.zeros(0, np.int64), np.zeros(0, np.int64),
                             np.asarray(ctx, np.int64)))
        now_s += dt
        for j in range(m):
            held[j] += int(grows[j])
            ctx[j] += 1
            gen[j] += 1
        taken += sum(grows)
        area += (used_blocks + taken) * dt
        n += 1
        if any(gen[j] >= out[j] for j in range(m)):
            reason = STOP_DONE
            break
    return n, now_s, taken, reason, area


# =====================================================================================
# compiled replica: the whole event loop of one replica for static-rank policies
# =====================================================================================
# The plain-Python twin of ``replica_advance`` is :class:`lpserve.sim.replica.Replica`
# (reference mode plans every iteration in Python); tests assert identical results.

# cfg layout
C_BATCHING = 0      # 0 prefill-first, 1 decode-first, 2 mixed, 3 static
C_MAX_SEQS = 1
C_BUDGET = 2
C_CHUNKED = 3
C_RESERVE = 4       # reserved blocks per request at admission (0: incremental)
C_WM = 5            # watermark blocks
C_BT = 6            # tokens per block
C_TOTAL = 7         # blocks
# ist layout (int state)
I_FREE = 0
I_NRUN = 1
I_NWAIT = 2
I_SEQ = 3           # next back-of-queue sequence number (increasing)
I_FRONT = 4         # next front-of-queue sequence number (decreasing, negative)
I_ITERS = 5
I_DITERS = 6
# fst layout (float state)
F_NOW = 0
F_AREA = 1
# status / reason codes shared with lpserve.sim.state
ST_WAITING = 1
ST_RUNNING = 2
ST_FINISHED = 3
ST_REJECTED = 4
R_CTX_KV = 1
R_CTX_BUDGET = 2


@njit(cache=True)
def _remove_running(run, ist, i):
    n = ist[I_NRUN]
    k = 0
    while run[k] != i:
        k += 1
    for j in range(k, n - 1):
        run[j] = run[j + 1]
    ist[I_NRUN] = n - 1


@njit(cache=True)
def _remove_waiting(w_id, w_key, w_seq, ist, pos):
    n = ist[I_NWAIT] - 1
    w_id[pos] = w_id[n]
    w_key[pos] = w_key[n]
    w_seq[pos] = w_seq[n]
    ist[I_NWAIT] = n


@njit(cache=True)
def _finish(i, run, ist, fst, held, finish, status):
    finish[i] = fst[F_NOW]
    status[i] = ST_FINISHED
    _remove_running(run, ist, i)
    ist[I_FREE] += held[i]
    held[i] = 0


@njit(cache=True)
def _produce(i, run, ist, fst, held, gen, out, first_token, finish, status):
    gen[i] += 1
    if np.isnan(first_token[i]):
        first_token[i] = fst[F_NOW]
    if gen[i] >= out[i]:
        _finish(i, run, ist, fst, held, finish, status)


@njit(cache=True)
def _waiting_order(w_key, w_seq, n):
    """Positions of the first ``n`` waiting entries sorted by (key, seq); +inf excluded."""
    o1 = np.argsort(w_seq[:n], kind="mergesort")
    o2 = np.argsort(w_key[:n][o1], kind="mergesort")
    order = o1[o2]
    m = 0
    for k in range(n):
        if w_key[order[k]] != np.inf:
            m += 1
    return order[:m]


@njit(cache=True)
def _admit_waiting(cfg, ist, fst, w_id, w_key, w_seq, prompt, gen, reason, status, computed,
                   seen, held, run, first_sched, ch_id, ch_tok, ch_cached, bt, total,
                   allow_chunk, n_ch, budget):
    """Admit waiting requests in key order as prefill chunks (``models/simulator.md``):
    stop at the batch cap, the token budget or the KV watermark; reject requests that can
    never fit. Returns the new chunk count and the budget left."""
    order = _waiting_order(w_key, w_seq, ist[I_NWAIT])
    ids = w_id[order].copy()
    for k in range(ids.shape[0]):
        i = ids[k]
        if ist[I_NRUN] >= cfg[C_MAX_SEQS] or budget <= 0:
            break
        L = prompt[i] + gen[i]
        chunk = L
        dropped = False
        target = 0
        if chunk > budget:
            if not allow_chunk:
                if L > cfg[C_BUDGET]:
                    reason[i] = R_CTX_BUDGET
                    dropped = True
                else:
                    break
            else:
                chunk = budget
        if not dropped:
            target = cfg[C_RESERVE] if cfg[C_RESERVE] > 0 else (chunk + bt - 1) // bt
            full = cfg[C_RESERVE] if cfg[C_RESERVE] > 0 else (L + bt - 1) // bt
            if full > total - cfg[C_WM]:
                reason[i] = R_CTX_KV
                dropped = True
            elif ist[I_FREE] - target < cfg[C_WM]:
                break
        pos = 0
        while w_id[pos] != i:
            pos += 1
        _remove_waiting(w_id, w_key, w_seq, ist, pos)
        if dropped:
            status[i] = ST_REJECTED
            continue
        computed[i] = 0
        seen[i] += L
        ist[I_FREE] -= target - held[i]
        held[i] = target
        ch_id[n_ch] = i
        ch_tok[n_ch] = chunk
        ch_cached[n_ch] = 0
        n_ch += 1
        budget -= chunk
        if np.isnan(first_sched[i]):
            first_sched[i] = fst[F_NOW]
        run[ist[I_NRUN]] = i
        ist[I_NRUN] += 1
        status[i] = ST_RUNNING
    return n_ch, budget


@njit(cache=True)
def replica_advance(params, cfg, ist, fst, stop_s, run, w_id, w_key, w_seq, rkey, prompt,
                    out, computed, gen, held, first_sched, first_token, finish, preempt,
                    status, reason, seen):
    """Advance one replica until its next iteration would start at or after ``stop_s``.

    Static ranks (``rkey[i]``, lower first, ties by queue position), recompute
    preemption of the worst-ranked running request, no prefix caching. Arrays: ``run``
    (running ids in admission order, ``ist[I_NRUN]`` valid), ``w_id``/``w_key``/``w_seq``
    (waiting entries, ``ist[I_NWAIT]`` valid), per-request arrays of shape ``(n,)``
    updated in place. Returns True when the replica went idle before ``stop_s``.
    """
    bt = cfg[C_BT]
    total = cfg[C_TOTAL]
    cap = cfg[C_MAX_SEQS] + 1
    ch_id = np.empty(cap, np.int64)
    ch_tok = np.empty(cap, np.int64)
    ch_cached = np.empty(cap, np.int64)
    dec = np.empty(cap, np.int64)
    part = np.empty(cap, np.int64)
    while fst[F_NOW] < stop_s:
        n_run = ist[I_NRUN]
        if n_run == 0 and ist[I_NWAIT] == 0:
            return True
        n_ch = 0
        budget = cfg[C_BUDGET]
        admit_ok = ist[I_NWAIT] > 0 and not (cfg[C_BATCHING] == 3 and n_run > 0)
        resumed = False
        do_admit_now = cfg[C_BATCHING] == 0 and admit_ok
        if cfg[C_BATCHING] == 0:
            admit_ok = False
        if do_admit_now:  # prefill-first: admit whole prompts before any decode
            n_ch, budget = _admit_waiting(cfg, ist, fst, w_id, w_key, w_seq, prompt, gen,
                                          reason, status, computed, seen, held, run,
                                          first_sched, ch_id, ch_tok, ch_cached, bt, total,
                                          False, n_ch, budget)
        if cfg[C_BATCHING] == 0 and n_ch > 0:
            n_dec = 0
        else:
            # phases of the running requests
            n_dec = 0
            n_part = 0
            for k in range(ist[I_NRUN]):
                i = run[k]
                left = prompt[i] + gen[i] - computed[i]
                if left == 1:
                    dec[n_dec] = i
                    n_dec += 1
                elif left > 1:
                    part[n_part] = i
                    n_part += 1
            need = 0
            for k in range(n_dec):
                if computed[dec[k]] + 1 > held[dec[k]] * bt:
                    need += 1
            while need > ist[I_FREE]:
                # victim: worst (rank, running position)
                v = run[0]
                vk = rkey[v]
                for k in range(1, ist[I_NRUN]):
                    if rkey[run[k]] >= vk:
                        v = run[k]
                        vk = rkey[v]
                if ist[I_NRUN] == 1:
                    _remove_running(run, ist, v)
                    ist[I_FREE] += held[v]
                    held[v] = 0
                    status[v] = ST_REJECTED
                    reason[v] = R_CTX_KV
                else:
                    computed[v] = 0
                    ist[I_FREE] += held[v]
                    held[v] = 0
                    preempt[v] += 1
                    status[v] = ST_WAITING
                    _remove_running(run, ist, v)
                    n = ist[I_NWAIT]
                    w_id[n] = v
                    w_key[n] = rkey[v]
                    w_seq[n] = ist[I_FRONT]
                    ist[I_FRONT] -= 1
                    ist[I_NWAIT] = n + 1
                m = 0
                for k in range(n_dec):
                    if dec[k] != v:
                        dec[m] = dec[k]
                        m += 1
                n_dec = m
                m = 0
                for k in range(n_part):
                    if part[k] != v:
                        part[m] = part[k]
                        m += 1
                n_part = m
                need = 0
                for k in range(n_dec):
                    if computed[dec[k]] + 1 > held[dec[k]] * bt:
                        need += 1
                admit_ok = False
                resumed = True
            for k in range(n_dec):
                i = dec[k]
                if computed[i] + 1 > held[i] * bt:
                    held[i] += 1
                    ist[I_FREE] -= 1
            budget -= n_dec
            if cfg[C_BATCHING] == 1 and n_part > 0:
                # partial prefills in (rank, running position) order
                pos_in_run = np.empty(n_part, np.int64)
                for k in range(n_part):
                    j = 0
                    while run[j] != part[k]:
                        j += 1
                    pos_in_run[k] = j
                pk = np.empty(n_part)
                for k in range(n_part):
                    pk[k] = rkey[part[k]]
                o1 = np.argsort(pos_in_run, kind="mergesort")
                o2 = np.argsort(pk[o1], kind="mergesort")
                porder = part[:n_part][o1[o2]].copy()
                for k in range(n_part):
                    if budget <= 0:
                        break
                    i = porder[k]
                    L = prompt[i] + gen[i]
                    c = min(L - computed[i], budget)
                    room = (held[i] + ist[I_FREE]) * bt - computed[i]
                    c = min(c, room)
                    if c <= 0:
                        continue
                    target = (computed[i] + c + bt - 1) // bt
                    if target > held[i]:
                        ist[I_FREE] -= target - held[i]
                        held[i] = target
                    ch_id[n_ch] = i
                    ch_tok[n_ch] = c
                    ch_cached[n_ch] = computed[i]
                    n_ch += 1
                    budget -= c
            if admit_ok and budget > 0 and cfg[C_BATCHING] != 0:  # after decodes
                n_ch, budget = _admit_waiting(cfg, ist, fst, w_id, w_key, w_seq, prompt, gen,
                                              reason, status, computed, seen, held, run,
                                              first_sched, ch_id, ch_tok, ch_cached, bt, total,
                                              cfg[C_CHUNKED] != 0, n_ch, budget)
            if n_ch == 0 and n_dec == 0:
                if resumed:
                    continue
                return True
        any_new = False
        for k in range(n_dec):
            if gen[dec[k]] == 0:
                any_new = True
        used = total - ist[I_FREE]
        if n_ch > 0 or resumed or any_new:
            dc = np.empty(n_dec, np.int64)
            for k in range(n_dec):
                dc[k] = computed[dec[k]]
            dt = iteration_time(params, ch_tok[:n_ch], ch_cached[:n_ch], dc)
            fst[F_NOW] += dt
            fst[F_AREA] += used * dt
            ist[I_ITERS] += 1
            if n_ch == 0:
                ist[I_DITERS] += 1
            done = np.empty(n_ch + n_dec, np.int64)
            nd = 0
            for k in range(n_ch):
                i = ch_id[k]
                computed[i] += ch_tok[k]
                if computed[i] == prompt[i] + gen[i]:
                    done[nd] = i
                    nd += 1
            for k in range(n_dec):
                computed[dec[k]] += 1
                done[nd] = dec[k]
                nd += 1
            for k in range(nd):
                _produce(done[k], run, ist, fst, held, gen, out, first_token, finish, status)
            continue
        idx = dec[:n_dec].copy()
        ctx = computed[idx]
        g = gen[idx]
        h = held[idx]
        n_it, now2, taken, why, area = decode_advance(
            params, ctx, g, out[idx], h, bt, ist[I_FREE], used, fst[F_NOW], stop_s,
            1 << 62)
        for k in range(n_dec):
            i = idx[k]
            computed[i] = ctx[k]
            gen[i] = g[k]
            held[i] = h[k]
        ist[I_FREE] -= taken
        fst[F_NOW] = now2
        fst[F_AREA] += area
        ist[I_ITERS] += n_it
        ist[I_DITERS] += n_it
        for k in range(n_dec):
            i = idx[k]
            if gen[i] >= out[i]:
                _finish(i, run, ist, fst, held, finish, status)
    return False
