"""Offline bounds for KV prefix caching: Belady, FOO (min-cost flow) and the prefix LP.

Setting (``models/kv-caching-flow.md`` section 1): requests ``r = 0..n-1`` are served in
trace order, cold start. Request ``r`` hits on the longest leading run of its prefix blocks
that is in the cache; after it is served all of its blocks are in the cache, and at most
``C`` blocks are kept until the next request (capacity in blocks; the request in flight is
not counted).

* :func:`block_accesses` — the flat access arrays every bound and replay shares (chain
  validation, dense block keys, previous/next use, recompute values).
* :func:`belady` — farthest-next-use eviction (``proofs/belady-unit-optimal.md``).
* :func:`foo` — FOO-L / FOO-U, the min-cost-flow LP of general caching with variable sizes
  and miss costs (``models/kv-caching-flow.md`` (3)-(5); FOO-L <= OPT <= FOO-U,
  ``proofs/foo-bounds.md``), on networkx (integer-scaled weights) or HiGHS.
* :func:`build` / :func:`solve` / :func:`certify` — the prefix-closed LP
  (``models/kv-caching-flow.md`` (6)-(9)) and its rounding; ``solve(..., integer=True)``
  gives the exact offline optimum on small instances.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lpserve.opt.solution import Solution, Status, highs_model, highs_status
from lpserve.trace import Trace, TraceError


class ChainError(TraceError):
    """A request's block list is not a valid hash chain (names the request index)."""


@dataclass(frozen=True, eq=False)
class BlockAccesses:
    """Every prefix-block access of a trace, flattened in service order.

    ``A`` accesses, ``n`` requests, ``K`` distinct blocks. Arrays (int64 unless noted):
        offsets (n+1,): request ``r`` owns accesses ``offsets[r]:offsets[r+1]``.
        key (A,): dense block key in ``0..K-1``.
        parent (A,): key of the previous block of the chain, -1 at depth 0.
        depth (A,): position of the block in its prompt (0 = first block).
        request (A,): request index of the access.
        tokens (A,): prompt tokens in the block (the last block may be partial).
        prev (A,): index of the previous access of the same key, -1 if first.
        next (A,): index of the next access of the same key, ``A`` if none.
        value_s (A,) float64: recompute seconds saved by a hit
            (``models/kv-caching-flow.md`` (10)); 1.0 each when no cost model was given.
        arrival_s (n,) float64: arrival times.
        prompt_tokens, output_tokens, wait_kind, thread (n,): the requests' token counts,
            ``Trace.wait_kind`` (-1 everywhere when the trace has none) and conversation
            (``program_id`` where the trace has one, else ``session_id``; -1 for none), for
            the session-aware evictors.
    """

    offsets: np.ndarray
    key: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    request: np.ndarray
    tokens: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    value_s: np.ndarray
    arrival_s: np.ndarray
    n_keys: int
    block_tokens: int
    name: str = "trace"
    digest: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: np.ndarray | None = None
    output_tokens: np.ndarray | None = None
    wait_kind: np.ndarray | None = None
    thread: np.ndarray | None = None

    @property
    def n_requests(self) -> int:
        """Requests ``n`` (``offsets`` has ``n + 1`` entries)."""
        return int(self.offsets.shape[0] - 1)

    @property
    def n_accesses(self) -> int:
        """Block accesses ``A`` over all prompts."""
        return int(self.key.shape[0])

    def next_request(self) -> np.ndarray:
        """Request index of the next use of each access's block, ``n`` if none; (A,)."""
        n = self.n_requests
        nxt = self.next
        out = np.full(nxt.shape, n, np.int64)
        m = nxt < self.n_accesses
        out[m] = self.request[nxt[m]]
        return out


def check_capacity(capacity_blocks: Any) -> int:
    """``capacity_blocks`` as an int >= 1, or a ValueError naming it."""
    if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, (int, np.integer)):
        raise ValueError(f"capacity_blocks must be a positive integer, got {capacity_blocks!r}")
    if capacity_blocks < 1:
        raise ValueError(f"capacity_blocks must be >= 1, got {capacity_blocks}")
    return int(capacity_blocks)


def recompute_values_s(prompt_tokens: np.ndarray, offsets: np.ndarray, block_tokens: int,
                       cost: Any) -> np.ndarray:
    """Seconds of prefill work each block access saves (``models/kv-caching-flow.md`` (10)).

    Block ``k`` of a prompt of ``P`` tokens covers tokens ``[kB, min((k+1)B, P))``; its value
    is ``T(end) - T(start)`` with ``T(x)`` the cost model's time of a ``x``-token prefill from
    scratch and ``T(0) := T(1)`` (the one-token step a full hit still pays). Later blocks cost
    more (attention grows with context). Shape ``(A,)`` float64.
    """
    counts = np.diff(offsets)
    req = np.repeat(np.arange(counts.size), counts)
    depth = np.arange(int(offsets[-1])) - offsets[req]
    start = depth * block_tokens
    end = np.minimum(start + block_tokens, np.asarray(prompt_tokens)[req])
    pts = np.unique(np.concatenate([[1], np.maximum(start, 1), np.maximum(end, 1)]))
    times = cost.prefill_alone_s(pts)
    t_end = times[np.searchsorted(pts, np.maximum(end, 1))]
    t_start = times[np.searchsorted(pts, np.maximum(start, 1))]
    return np.maximum(t_end - t_start, 0.0)


def block_accesses(trace: Trace, *, cost: Any = None, validate: bool = True) -> BlockAccesses:
    """Flatten ``trace``'s prefix blocks into :class:`BlockAccesses`.

    Raises :class:`~lpserve.trace.TraceError` for a trace without block ids and
    :class:`ChainError` (naming the request) when a block id appears under two different
    predecessors or twice in one prompt, i.e. the lists are not hash chains.
    ``cost``: an ``lpserve.cost`` model to weight hits by recompute seconds.
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be an lpserve.Trace, got {type(trace).__name__}")
    if trace.block_flat is None:
        raise TraceError(
            f"{trace.name}: trace has no prefix block ids (field 'block_flat' is None); "
            "cache replay needs block ids such as Mooncake 'hash_ids', or derive them with "
            "lpserve.trace.generate.with_shared_prefixes / sessions")
    flat = np.asarray(trace.block_flat, np.int64)
    offs = np.asarray(trace.block_offsets, np.int64)
    n, A = len(trace), int(flat.size)
    counts = np.diff(offs)
    req = np.repeat(np.arange(n, dtype=np.int64), counts)
    depth = np.arange(A, dtype=np.int64) - offs[req]
    ids, key = np.unique(flat, return_inverse=True)
    key = key.astype(np.int64).reshape(-1)
    parent = np.where(depth > 0, np.roll(key, 1), -1).astype(np.int64)
    order = np.argsort(key, kind="stable")  # accesses grouped by key, in time order
    ks = key[order]
    same = np.zeros(A, bool)
    if A:
        same[1:] = ks[1:] == ks[:-1]
    if validate and A:
        first = np.empty(A, np.int64)
        grp = np.flatnonzero(~same)
        first[order] = np.repeat(order[grp], np.diff(np.append(grp, A)))
        bad = parent != parent[first]
        if bad.any():
            a = int(np.flatnonzero(bad)[0])
            r, f = int(req[a]), int(first[a])
            raise ChainError(
                f"{trace.name}: block list of request {r} is not a valid hash chain: block id "
                f"{int(flat[a])} at position {int(depth[a])} follows "
                f"{'nothing' if depth[a] == 0 else int(flat[a - 1])}, but in request "
                f"{int(req[f])} it follows "
                f"{'nothing' if depth[f] == 0 else int(flat[f - 1])}")
    prev = np.full(A, -1, np.int64)
    nxt = np.full(A, A, np.int64)
    if A:
        prev[order[1:][same[1:]]] = order[:-1][same[1:]]
        nxt[order[:-1][same[1:]]] = order[1:][same[1:]]
    B = int(trace.block_tokens)
    tokens = np.minimum(B, np.asarray(trace.prompt_tokens)[req] - depth * B).clip(1)
    value = (np.ones(A) if cost is None
             else recompute_values_s(np.asarray(trace.prompt_tokens), offs, B, cost))
    none = np.full(n, -1, np.int64)
    thread = trace.program_id if trace.program_id is not None else trace.session_id
    return BlockAccesses(offsets=offs, key=key, parent=parent, depth=depth, request=req,
                         tokens=tokens.astype(np.int64), prev=prev, next=nxt, value_s=value,
                         arrival_s=np.asarray(trace.arrival_s, np.float64),
                         n_keys=int(ids.size), block_tokens=B, name=trace.name,
                         digest=trace.digest(), info={"cost_weighted": cost is not None},
                         prompt_tokens=np.asarray(trace.prompt_tokens, np.int64),
                         output_tokens=np.asarray(trace.output_tokens, np.int64),
                         wait_kind=none if trace.wait_kind is None else
                         np.asarray(trace.wait_kind, np.int64),
                         thread=none if thread is None else np.asarray(thread, np.int64))


def prefix_hits_from_mask(acc: BlockAccesses, kept: np.ndarray) -> np.ndarray:
    """Prefix hits per request when access ``a`` finds its block iff ``kept[a]``: the
    longest leading run of kept accesses. int64 ``(n,)``."""
    kept = np.asarray(kept, bool)
    miss = np.flatnonzero(~kept)
    offs = acc.offsets
    first_miss = np.searchsorted(miss, offs[:-1])
    stop = np.where(first_miss < miss.size, miss[np.minimum(first_miss, miss.size - 1)],
                    acc.n_accesses)
    return (np.minimum(stop, offs[1:]) - offs[:-1]).astype(np.int64)


# ===================================================================================== Belady
def belady(acc: BlockAccesses, capacity_blocks: int, *, tie: str = "shallow") -> np.ndarray:
    """Belady MIN on blocks: after each request evict the blocks whose next use is farthest.

    Next use is measured in requests. ``tie`` orders blocks next used by the same request:
    ``"shallow"`` evicts the shallower block first (prefix-unaware, the classical rule on the
    block sequence), ``"deep"`` the deeper one first (keeps prefixes whole). Returns the
    prefix hits per request, int64 ``(n,)``. Pure Python with a lazy heap,
    O(A log A). Optimal for unit blocks when every request holds one block
    (``proofs/belady-unit-optimal.md``).
    """
    C = check_capacity(capacity_blocks)
    if tie not in ("shallow", "deep"):
        raise ValueError(f"tie must be 'shallow' or 'deep', got {tie!r}")
    nreq = acc.next_request().tolist()
    key = acc.key.tolist()
    depth = acc.depth.tolist()
    offs = acc.offsets.tolist()
    sgn = 1 if tie == "shallow" else -1
    in_cache = bytearray(acc.n_keys)
    stamp = [0] * acc.n_keys
    heap: list[tuple[int, int, int, int]] = []
    size = 0
    hits = np.zeros(acc.n_requests, np.int64)
    for r in range(acc.n_requests):
        a0, a1 = offs[r], offs[r + 1]
        j = a0
        while j < a1 and in_cache[key[j]]:
            j += 1
        hits[r] = j - a0
        for a in range(a0, a1):
            k = key[a]
            if not in_cache[k]:
                in_cache[k] = 1
                size += 1
            stamp[k] = a
            heapq.heappush(heap, (-nreq[a], sgn * depth[a], a, k))
        while size > C:
            _, _, a, k = heapq.heappop(heap)
            if stamp[k] != a or not in_cache[k]:
                continue
            in_cache[k] = 0
            size -= 1
    return hits


# ===================================================================================== FOO
def foo(step: Any, obj: Any, size: Any, cost: Any, capacity: float, *,
        backend: str = "highs", scale: int = 1000) -> Solution:
    """FOO on a general caching trace (``models/kv-caching-flow.md`` (3)-(5)).

    Access ``t`` (arrays of shape ``(T,)``, sorted by ``step``) asks for object ``obj[t]`` of
    ``size[t]`` (>0) at time step ``step[t]``; a miss costs ``cost[t]``. Capacity holds
    between consecutive steps. Returns a :class:`Solution` whose ``bound`` is FOO-L (the LP
    optimum: least total miss cost of the non-compulsory accesses) and ``objective`` FOO-U
    (miss cost of the feasible schedule that rounds every fractional interval down);
    ``primal["x"]`` is the LP keep-fraction of each interval, ``primal["interval_end"]`` the
    access each interval serves. ``backend="networkx"`` runs network simplex on weights
    ``round(scale * cost / size)`` (exact for integer unit costs); ``"highs"`` solves the
    node-arc LP. Compulsory misses are left out of both (``info["compulsory_cost"]``).
    """
    t0 = time.perf_counter()
    step = np.asarray(step, np.int64)
    obj = np.asarray(obj, np.int64)
    size = np.asarray(size, np.float64)
    cst = np.asarray(cost, np.float64)
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    if size.size and size.min() <= 0:
        raise ValueError("size must be > 0 for every access")
    if step.size and np.any(np.diff(step) < 0):
        raise ValueError("step must be non-decreasing")
    order = np.argsort(obj, kind="stable")
    same = np.zeros(obj.size, bool)
    same[1:] = obj[order][1:] == obj[order][:-1]
    end = order[1:][same[1:]]  # the access each interval serves
    start = order[:-1][same[1:]]
    keep = step[start] < step[end]  # same-step repeats hit trivially
    end, start = end[keep], start[keep]
    a, b = step[start], step[end]
    s, c = size[end], cst[end]
    info = {"n_intervals": int(end.size), "compulsory_cost": float(cst.sum() - cst[end].sum()
                                                                   - cst[order[1:][same[1:]]
                                                                         [~keep]].sum())}
    if backend == "networkx":
        f, msg, exact = _foo_networkx(a, b, s, c, capacity, int(step.max(initial=0)) + 1, scale)
        status = Status.OPTIMAL if exact else Status.FEASIBLE
    elif backend == "highs":
        f, status, msg = _foo_highs(a, b, s, c, capacity, int(step.max(initial=0)) + 1)
    else:
        raise ValueError(f"backend must be 'highs' or 'networkx', got {backend!r}")
    if f is None:
        return Solution("foo", status, wall_s=time.perf_counter() - t0, message=msg,
                        objective_units="miss cost", info=info)
    x = np.clip((s - f) / s, 0.0, 1.0)
    lower = float(np.sum(c * (1 - x)))
    xr = (x >= 1 - 1e-7).astype(np.float64)
    upper = float(np.sum(c * (1 - xr)))
    info["n_fractional"] = int(np.count_nonzero((x > 1e-7) & (x < 1 - 1e-7)))
    return Solution("foo", status,
                    objective=upper, bound=lower if status == Status.OPTIMAL else math.nan,
                    wall_s=time.perf_counter() - t0, message=msg,
                    primal={"x": x, "x_rounded": xr, "interval_start": start,
                            "interval_end": end},
                    objective_units="miss cost", info=info)


def _foo_networkx(a, b, s, c, capacity, n_nodes, scale):
    import networkx as nx

    G = nx.DiGraph()
    G.add_nodes_from(range(n_nodes), demand=0)
    for t in range(n_nodes - 1):
        G.add_edge(t, t + 1, capacity=int(math.floor(capacity)), weight=0)
    w = np.rint(scale * c / s).astype(np.int64)
    exact = bool(np.allclose(w, scale * c / s) and np.allclose(s, np.rint(s)))
    si = np.rint(s).astype(np.int64)
    for i in range(a.size):
        aux = ("i", i)
        G.add_edge(int(a[i]), aux, capacity=int(si[i]), weight=int(w[i]))
        G.add_edge(aux, int(b[i]), capacity=int(si[i]), weight=0)
        G.nodes[int(a[i])]["demand"] -= int(si[i])
        G.nodes[int(b[i])]["demand"] += int(si[i])
    try:
        _, flow = nx.network_simplex(G)
    except nx.NetworkXUnfeasible as exc:  # cannot happen: outer arcs carry everything
        return None, f"networkx: {exc}", False
    f = np.array([flow[int(a[i])][("i", i)] for i in range(a.size)], np.float64)
    return f, "networkx network_simplex", exact


def _foo_highs(a, b, s, c, capacity, n_nodes):
    """Node-arc LP: columns = inner flows g_0..g_{m-2} then outer flows f_i."""
    from scipy import sparse

    m, ni = n_nodes, a.size
    ng = max(m - 1, 0)
    rows = np.concatenate([np.arange(ng), np.arange(1, m), a, b])
    cols = np.concatenate([np.arange(ng), np.arange(ng), ng + np.arange(ni),
                           ng + np.arange(ni)])
    vals = np.concatenate([np.ones(ng), -np.ones(ng), np.ones(ni), -np.ones(ni)])
    A = sparse.csc_matrix((vals, (rows, cols)), shape=(m, ng + ni))
    supply = np.zeros(m)
    np.add.at(supply, a, s)
    np.add.at(supply, b, -s)
    h = highs_model(col_cost=np.concatenate([np.zeros(ng), c / s]),
                    col_lower=np.zeros(ng + ni),
                    col_upper=np.concatenate([np.full(ng, float(capacity)), s]),
                    row_lower=supply, row_upper=supply, a_start=A.indptr, a_index=A.indices,
                    a_value=A.data)
    h.run()
    status, _, _, msg = highs_status(h, has_integers=False)
    if status != Status.OPTIMAL:
        return None, status, msg
    xs = np.asarray(h.getSolution().col_value)
    return xs[ng:], status, msg


# ===================================================================================== prefix LP
@dataclass(frozen=True, eq=False)
class PrefixLP:
    """The prefix-closed caching LP of ``models/kv-caching-flow.md`` (6)-(9).

    Columns: ``g`` (n-1,) blocks kept across each gap between requests, then ``h`` (J,) the
    hit fraction of each access that has an earlier use (``access`` (J,) its index in
    ``acc``; ``start``/``end`` (J,) the requests its interval spans). CSC matrix arrays as
    :func:`~lpserve.opt.solution.highs_model` takes them.
    """

    acc: BlockAccesses
    capacity_blocks: int
    access: np.ndarray
    start: np.ndarray
    end: np.ndarray
    col_cost: np.ndarray
    col_upper: np.ndarray
    row_lower: np.ndarray
    row_upper: np.ndarray
    a_start: np.ndarray
    a_index: np.ndarray
    a_value: np.ndarray
    n_gap: int
    build_s: float

    @property
    def total_value(self) -> float:
        """Sum of ``value_s`` over every access: the objective if every access hit
        (recompute seconds, or accesses when built without a cost model)."""
        return float(self.acc.value_s.sum())


def build(trace: Trace | BlockAccesses, capacity_blocks: int, *, cost: Any = None) -> PrefixLP:
    """Build the prefix LP (pure, deterministic): node-arc rows (7), precedence rows (8).

    ``trace`` may be a :class:`~lpserve.trace.Trace` or prepared :class:`BlockAccesses`;
    ``cost`` (an ``lpserve.cost`` model) makes the objective recompute seconds
    (``models/kv-caching-flow.md`` (10)) instead of block hits.
    """
    from scipy import sparse

    t0 = time.perf_counter()
    C = check_capacity(capacity_blocks)
    acc = trace if isinstance(trace, BlockAccesses) else block_accesses(trace, cost=cost)
    n = acc.n_requests
    J = np.flatnonzero(acc.prev >= 0)
    start = acc.request[acc.prev[J]]
    end = acc.request[J]
    nj, ng = J.size, max(n - 1, 0)
    col_of = np.full(acc.n_accesses, -1, np.int64)
    col_of[J] = ng + np.arange(nj)
    # node rows 0..n-1: g_r - g_{r-1} - sum_{start=r} h + sum_{end=r} h = 0   (7)
    rows = [np.arange(ng), np.arange(1, n), start, end]
    cols = [np.arange(ng), np.arange(ng), col_of[J], col_of[J]]
    vals = [np.ones(ng), -np.ones(ng), -np.ones(nj), np.ones(nj)]
    # precedence rows: h_a - h_{a-1} <= 0 for hit-able accesses below depth 0   (8)
    P = J[acc.depth[J] > 0]
    pr = n + np.arange(P.size)
    rows += [pr, pr]
    cols += [col_of[P], col_of[P - 1]]
    vals += [np.ones(P.size), -np.ones(P.size)]
    if P.size and np.any(col_of[P - 1] < 0):
        raise ChainError(f"{acc.name}: a reused block's parent has no earlier use; "
                         "build the accesses with validate=True")
    A = sparse.csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(n + P.size, ng + nj))
    A.sort_indices()
    return PrefixLP(acc=acc, capacity_blocks=C, access=J, start=start, end=end,
                    col_cost=np.concatenate([np.zeros(ng), -acc.value_s[J]]),
                    col_upper=np.concatenate([np.full(ng, float(C)), np.ones(nj)]),
                    row_lower=np.concatenate([np.zeros(n), np.full(P.size, -np.inf)]),
                    row_upper=np.zeros(n + P.size), a_start=A.indptr, a_index=A.indices,
                    a_value=A.data, n_gap=ng, build_s=time.perf_counter() - t0)


def occupancy(model: PrefixLP, kept: np.ndarray) -> np.ndarray:
    """Blocks kept across each gap (n-1,) when interval ``j`` is kept iff ``kept[j]``."""
    diff = np.zeros(model.acc.n_requests + 1)
    k = np.asarray(kept, np.float64)
    np.add.at(diff, model.start, k)
    np.add.at(diff, model.end, -k)
    return np.cumsum(diff)[:model.n_gap]


class _Empty(Exception):
    """Internal: the model has no columns."""


def solve(model: PrefixLP, *, integer: bool = False, time_limit_s: float | None = None,
          round_tol: float = 1e-6) -> Solution:
    """Solve the prefix LP (or, with ``integer=True``, the exact ILP) with HiGHS.

    Minimization of missed value. ``bound`` = least missed value the LP allows (so
    ``1 - bound/total`` upper-bounds the hit rate); ``objective`` = missed value of the
    rounded schedule (keep interval ``j`` iff ``h_j >= 1 - round_tol``; hits recounted
    prefix-closed), which is feasible. ``primal``: ``h`` (J,), ``g`` (n-1,), ``kept`` (A,)
    bool per access, ``hits`` (n,) rounded prefix hits per request. ``info`` carries hit
    rates: ``hit_rate_lp``, ``hit_rate_rounded`` (block-weighted when the model is unit
    valued) and ``value_lp``, ``value_rounded``.
    """
    t0 = time.perf_counter()
    nc = model.col_cost.size
    try:
        if nc == 0:  # one request or nothing reused: the empty schedule is optimal
            status, bnd, msg, xs = Status.OPTIMAL, 0.0, "empty model", np.zeros(0)
            raise _Empty
        h = highs_model(col_cost=model.col_cost, col_lower=np.zeros(nc),
                        col_upper=model.col_upper, row_lower=model.row_lower,
                        row_upper=model.row_upper, a_start=model.a_start,
                        a_index=model.a_index, a_value=model.a_value, integer=integer,
                        time_limit_s=time_limit_s)
        h.run()
        status, obj, bnd, msg = highs_status(h, has_integers=integer)
        xs = (np.asarray(h.getSolution().col_value) if status in (Status.OPTIMAL,
                                                                 Status.FEASIBLE) else None)
    except _Empty:
        pass
    except Exception as exc:  # a solver failure is a status, not an exception
        return Solution("kv-prefix-lp", Status.ERROR, wall_s=time.perf_counter() - t0,
                        digest=model.acc.digest, message=f"{type(exc).__name__}: {exc}")
    total = model.total_value
    info = {"n_intervals": int(model.access.size), "n_requests": model.acc.n_requests,
            "capacity_blocks": model.capacity_blocks, "build_s": model.build_s,
            "integer": integer, "total_value": total}
    if status not in (Status.OPTIMAL, Status.FEASIBLE):
        return Solution("kv-prefix-lp", status, wall_s=time.perf_counter() - t0 + model.build_s,
                        digest=model.acc.digest, message=msg, info=info)
    g, hv = xs[:model.n_gap], np.clip(xs[model.n_gap:], 0.0, 1.0)
    kept = np.zeros(model.acc.n_accesses, bool)
    kept[model.access] = hv >= 1 - round_tol
    hits_mask = np.zeros_like(kept)
    hits = prefix_hits_from_mask(model.acc, kept)
    for r in np.flatnonzero(hits):  # mark the accesses that are prefix hits
        hits_mask[model.acc.offsets[r]:model.acc.offsets[r] + hits[r]] = True
    value_rounded = float(model.acc.value_s[hits_mask].sum())
    value_lp = -bnd if math.isfinite(bnd) else math.nan  # HiGHS minimizes -sum(v h)
    A = max(model.acc.n_accesses, 1)
    info.update(value_lp=value_lp, value_rounded=value_rounded,
                hit_rate_lp=float(hv.sum()) / A, hit_rate_rounded=float(hits_mask.sum()) / A,
                n_fractional=int(np.count_nonzero((hv > round_tol) & (hv < 1 - round_tol))))
    return Solution("kv-prefix-lp", status, objective=total - value_rounded,
                    bound=total - value_lp,
                    wall_s=time.perf_counter() - t0 + model.build_s, digest=model.acc.digest,
                    primal={"h": hv, "g": g, "kept": hits_mask, "hits": hits}, message=msg,
                    objective_units="s" if model.acc.info.get("cost_weighted") else "blocks",
                    info=info)


def certify(model: PrefixLP, solution: Solution, *, tol: float = 1e-6) -> dict[str, float]:
    """Residuals of a solved prefix LP: ``capacity`` (max blocks over C of the LP ``g`` and
    of the rounded schedule), ``balance`` (max node-row residual of (7)), ``precedence``
    (max ``h_a - h_{a-1}``), ``rounded_vs_lp`` (rounded value minus LP value, <= tol when
    the bound holds). All <= tol for a valid solution."""
    solution.require_solved(model.acc.digest)
    from scipy import sparse

    hv, g = solution.primal["h"], solution.primal["g"]
    A = sparse.csc_matrix((model.a_value, model.a_index, model.a_start),
                          shape=(model.row_lower.size, model.col_cost.size))
    act = A @ np.concatenate([g, hv])
    n = model.acc.n_requests
    kept_int = solution.primal["kept"][model.access]
    occ = occupancy(model, kept_int)
    occ_lp = occupancy(model, hv)
    out = {
        "capacity": float(max(np.max(g, initial=0.0), np.max(occ, initial=0.0),
                              np.max(occ_lp, initial=0.0)) - model.capacity_blocks),
        "balance": float(np.max(np.abs(act[:n]), initial=0.0)),
        "precedence": float(np.max(act[n:], initial=0.0)),
        "rounded_vs_lp": float(solution.info["value_rounded"] - solution.info["value_lp"]),
    }
    return out


def export(solution: Solution, acc: BlockAccesses) -> np.ndarray:
    """The rounded offline schedule as a bool mask ``(A,)``: access ``a`` is a prefix hit.
    Refuses an unsolved solution or one solved for another trace."""
    solution.require_solved(acc.digest)
    return np.asarray(solution.primal["kept"], bool).copy()
