"""vLLM's CPU KV offload on the compiled replica engine (numba): the host tier and the load
stream of ``models/simulator.md`` (35) (``EngineConfig.kv_offload_gib``).

vLLM V1's ``OffloadingConnector`` (``--kv-offloading-backend native
--kv-offloading-size GIB``) copies every full KV block to pinned host memory as it is
computed (write-through) and keeps the host blocks in LRU order. A request whose prompt
misses the GPU prefix cache at block ``k`` looks the following blocks up in the host tier;
the leading run found there is loaded to the GPU (host to device, asynchronously, beside
the model's iterations) and the request is scheduled once its load ends, with those tokens
counted as computed. Its plain-Python model, the oracle of the tests, is
``tests/oracles/offload.py``.

The tier holds block keys (the content keys of :func:`lpserve.sim._state_kernels.block_keys`)
in least-recently-used order: an open-addressing table (linear probing, backward-shift
deletion) from key to a node of a doubly linked list, oldest first. Loads run one at a
time on the replica's load stream, so their ends grow in the order they are issued; a
queue in that order, with a request's entry valid while ``load_end`` still holds its end,
gives the next end in O(1) amortised. Work is per admission and per prefill chunk, linear
in the blocks they touch; none per decode iteration.

``Off`` (``OFF_FIELDS``): ``oi`` int header (``O_*``), ``of`` float header (``OF_*``),
``hk``/``hv`` the table (key, node; ``hv < 0`` empty), ``nkey``/``nprev``/``nnext`` the
nodes, ``load_end`` the end of each request's load (s; float64 ``(n,)``, 0 for none),
``qt``/``qi`` the load queue, ``price`` the seconds to load ``k`` blocks (float64,
``cost.swap_time_s(k, b) * kv_scale``). A replica without offload has ``oi[O_ON] == 0``
and arrays of one element.
"""
from __future__ import annotations

import math
from collections import namedtuple
from typing import Any

import numpy as np
from numba import njit

from lpserve.sim import _pool as P
from lpserve.sim._structs import OFF_FIELDS, new_off

__all__ = ["GIB", "Off", "CompiledOffload", "for_replica", "offload_struct", "match", "touch",
           "admit_load", "next_end", "loading", "tier_blocks"]

#: bytes per GiB (vLLM's ``--kv-offloading-size`` is in GiB)
GIB = 1 << 30


def tier_blocks(gib: float, kv_bytes_per_token: float, block_tokens: int) -> int:
    """Host blocks of ``block_tokens`` tokens in ``gib`` GiB of host memory for a model whose
    KV takes ``kv_bytes_per_token`` bytes per token (every tensor-parallel rank together)."""
    if kv_bytes_per_token <= 0:
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token!r}")
    return int(gib * GIB // (kv_bytes_per_token * block_tokens))

Off = namedtuple("Off", OFF_FIELDS)

# oi (int64)
(O_ON, O_CAP, O_N, O_HEAD, O_TAIL, O_FREE, O_NODES, O_STORED, O_DROPPED, O_LOADED, O_HIT,
 O_QH, O_QT, O_MASK) = range(14)
N_OI = 14
# of (float64)
OF_FREE_S, OF_LOAD_S = range(2)


def offload_struct(gib: float, cost: Any, block_tokens: int, kv_scale: float,
                   n_requests: int, max_keys: int, key_bound: int) -> tuple[Off, Any]:
    """``(arrays, struct)`` of a replica's offload with ``gib`` GiB of host tier (0: off).

    ``max_keys`` is the most block keys one request has (the key buffer's length) and
    ``key_bound`` the most distinct keys the run can key (its prompts' full blocks), so the
    table holds what the run can hold: at most ``min(H + max_keys, key_bound)`` keys, the
    tier's ``H`` blocks plus one touch's new keys before the oldest are dropped."""
    oi = np.zeros(N_OI, np.int64)
    oi[O_HEAD] = oi[O_TAIL] = oi[O_FREE] = -1
    if not gib:
        one_i, one_f = np.zeros(1, np.int64), np.zeros(1)
        a = Off(oi, np.zeros(2), np.zeros(1, np.int64), np.full(1, -1, np.int64), one_i,
                one_i.copy(), one_i.copy(), one_f, one_f.copy(), one_i.copy(), one_f.copy())
        return a, new_off(*a)
    cap = tier_blocks(gib, cost.kv_bytes_per_token, block_tokens)
    if cap < 1:
        raise ValueError(f"EngineConfig.kv_offload_gib={gib!r} holds no KV block of "
                         f"{block_tokens} tokens "
                         f"({cost.kv_bytes_per_token * block_tokens:,.0f} bytes)")
    nodes = max(min(cap + max_keys, key_bound), 1) + 1
    size = 1 << int(2 * nodes - 1).bit_length()
    oi[O_ON], oi[O_CAP], oi[O_MASK] = 1, cap, size - 1
    price = np.asarray(cost.swap_times_s(np.arange(max_keys + 1), block_tokens),
                       np.float64) * float(kv_scale)
    a = Off(oi, np.zeros(2), np.zeros(size, np.int64), np.full(size, -1, np.int64),
            np.zeros(nodes, np.int64), np.zeros(nodes, np.int64), np.zeros(nodes, np.int64),
            np.zeros(n_requests), np.zeros(2 * n_requests + 2),
            np.zeros(2 * n_requests + 2, np.int64), price)
    return a, new_off(*a)


def for_replica(ctx: Any, req: Any, cost: Any = None) -> tuple[Any, "CompiledOffload | None"]:
    """``(struct, counters)`` of the offload of a compiled replica of run context ``ctx``
    over the run's request arrays ``req`` (``counters`` None without offload), its loads
    priced by ``cost`` (the replica's cost model; default the run's)."""
    gib = ctx.policy.engine.kv_offload_gib
    bt, max_keys = ctx.block_tokens, int(req.keybuf.shape[0])
    bound = int(np.minimum(req.prompt // bt, max_keys).sum()) if gib else 0
    a, s = offload_struct(gib, ctx.cost if cost is None else cost, bt, ctx.kv_scale,
                          int(req.prompt.shape[0]),
                          max_keys, bound)
    return s, (CompiledOffload(a) if gib else None)


class CompiledOffload:
    """The counters of a compiled replica's offload (``Result.stats["offload"]``)."""

    def __init__(self, arrays: Off) -> None:
        self.a = arrays

    def stats(self) -> dict:
        """``tier_blocks``, ``hit_tokens``, ``loaded_blocks``, ``load_s`` (s),
        ``stored_blocks``, ``dropped_blocks``."""
        oi = self.a.oi
        return {"tier_blocks": int(oi[O_CAP]), "hit_tokens": int(oi[O_HIT]),
                "loaded_blocks": int(oi[O_LOADED]), "load_s": float(self.a.of[OF_LOAD_S]),
                "stored_blocks": int(oi[O_STORED]), "dropped_blocks": int(oi[O_DROPPED])}


# ===================================================================================== tier
@njit(cache=True)
def _find(off, key):
    """Table index holding ``key``, or the empty index where it would go."""
    mask = off.oi[O_MASK]
    j = P.mix64(key) & mask
    while off.hv[j] >= 0:
        if off.hk[j] == key:
            return j
        j = (j + 1) & mask
    return j


@njit(cache=True)
def _delete(off, j):
    """Empty table index ``j`` (backward shift, so probing stays exact)."""
    mask = off.oi[O_MASK]
    hk, hv = off.hk, off.hv
    hv[j] = -1
    i = j
    k = (j + 1) & mask
    while hv[k] >= 0:
        home = P.mix64(hk[k]) & mask
        # move k to the hole at i when its home is not in (i, k] (cyclically)
        if (k > i and (home <= i or home > k)) or (k < i and (home <= i and home > k)):
            hk[i] = hk[k]
            hv[i] = hv[k]
            hv[k] = -1
            i = k
        k = (k + 1) & mask


@njit(cache=True)
def _unlink(off, x):
    """Remove host-tier entry ``x`` from the tier's recency list."""
    oi, pv, nx = off.oi, off.nprev, off.nnext
    if pv[x] >= 0:
        nx[pv[x]] = nx[x]
    else:
        oi[O_HEAD] = nx[x]
    if nx[x] >= 0:
        pv[nx[x]] = pv[x]
    else:
        oi[O_TAIL] = pv[x]


@njit(cache=True)
def _append(off, x):
    """Append host-tier entry ``x`` at the recent end of the tier's recency list."""
    oi = off.oi
    off.nprev[x] = oi[O_TAIL]
    off.nnext[x] = -1
    if oi[O_TAIL] >= 0:
        off.nnext[oi[O_TAIL]] = x
    else:
        oi[O_HEAD] = x
    oi[O_TAIL] = x


@njit(cache=True)
def match(off, keys, start, n):
    """Length of the leading run of ``keys[start:n]`` held by the tier."""
    m = 0
    for t in range(start, n):
        if off.hv[_find(off, keys[t])] < 0:
            break
        m += 1
    return m


@njit(cache=True)
def touch(off, keys, lo, hi):
    """Mark ``keys[lo:hi]`` used now (stored if absent), the last first, then drop the
    least recently used keys beyond the capacity (``HostTier.touch``)."""
    oi = off.oi
    for t in range(hi - 1, lo - 1, -1):
        key = keys[t]
        j = _find(off, key)
        if off.hv[j] >= 0:
            x = off.hv[j]
            _unlink(off, x)
        else:
            if oi[O_FREE] >= 0:
                x = oi[O_FREE]
                oi[O_FREE] = off.nnext[x]
            else:
                x = oi[O_NODES]
                oi[O_NODES] += 1
            off.hk[j] = key
            off.hv[j] = x
            off.nkey[x] = key
            oi[O_N] += 1
            oi[O_STORED] += 1
        _append(off, x)
    while oi[O_N] > oi[O_CAP]:
        x = oi[O_HEAD]
        _unlink(off, x)
        _delete(off, _find(off, off.nkey[x]))
        off.nnext[x] = oi[O_FREE]
        oi[O_FREE] = x
        oi[O_N] -= 1
        oi[O_DROPPED] += 1


# ===================================================================================== loads
@njit(cache=True)
def next_end(off, now):
    """The first end of a load after ``now`` (``inf`` with none); ended loads and those
    replaced by a later admission leave the queue (``Offload.next_end_s``)."""
    oi, qt, qi, le = off.oi, off.qt, off.qi, off.load_end
    h, t = oi[O_QH], oi[O_QT]
    while h < t and (qt[h] <= now or le[qi[h]] != qt[h]):
        h += 1
    oi[O_QH] = h
    return qt[h] if h < t else math.inf


@njit(cache=True)
def loading(off, i, now):
    """Whether request ``i`` waits for its load at ``now``."""
    return off.oi[O_ON] != 0 and off.load_end[i] > now


@njit(cache=True)
def admit_load(off, i, n_load, cached, gpu_tokens, now):
    """Request ``i`` is admitted with ``n_load`` blocks to load (``Offload.admit`` after
    its touch): a load lost to a preemption is forgotten, this one queues on the load
    stream. Returns the seconds the request waits (0 without a load)."""
    off.load_end[i] = 0.0
    if n_load == 0:
        return 0.0
    oi, of = off.oi, off.of
    load_s = off.price[n_load]
    end = max(now, of[OF_FREE_S]) + load_s
    of[OF_FREE_S] = end
    off.load_end[i] = end
    if oi[O_QT] == off.qt.shape[0]:  # compact: at most one live entry per request
        m = 0
        for k in range(oi[O_QH], oi[O_QT]):
            if off.load_end[off.qi[k]] == off.qt[k]:
                off.qt[m] = off.qt[k]
                off.qi[m] = off.qi[k]
                m += 1
        oi[O_QH], oi[O_QT] = 0, m
    off.qt[oi[O_QT]] = end
    off.qi[oi[O_QT]] = i
    oi[O_QT] += 1
    oi[O_HIT] += cached - min(gpu_tokens, cached)
    oi[O_LOADED] += n_load
    of[OF_LOAD_S] += load_s
    return end - now
