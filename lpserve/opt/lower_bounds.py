"""Lower bounds on total end-to-end latency that scale to large traces.

* :func:`area_bound` — the abstract round model (``models/lower-bounds.md`` (2)–(4)):
  each request needs ``o_i`` rounds, and the ``k`` requests that finish first have used
  at least the ``k`` smallest memory areas ``s_i o_i + o_i (o_i + 1) / 2`` token-rounds.
* :func:`cost_bound` — the real GPU cost model (``models/lower-bounds.md`` (5)–(9)): each
  request needs at least its prefill (with every reusable prefix block cached) plus
  ``o_i - 1`` decode iterations at the smallest possible batch, and holds at least its
  context in KV memory during each of them; the cluster holds at most ``sum_j K_j`` tokens.

Both are closed forms (no solver). The LP relaxation of the scheduling IP lives in
:mod:`lpserve.opt.schedule_ip` (``schedule-lp``). Proofs: ``proofs/area-bound.md``,
``proofs/cost-bound.md``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lpserve.opt.exact import KVProblem
from lpserve.opt.solution import Formulation, Solution, SolutionError, Status


def order_statistic_bound(release: np.ndarray, alone: np.ndarray, area: np.ndarray,
                          capacity: float) -> np.ndarray:
    """Lower bounds on the sorted completion times ``C_(1) <= ... <= C_(n)``, shape (n,).

    ``C_(k) >= max(L_(k), min(release) + A_k / capacity)`` where ``L_(k)`` is the k-th
    smallest of ``release + alone`` and ``A_k`` the sum of the k smallest areas
    (``models/lower-bounds.md`` (4)). Units: time as ``release``; area / capacity in time.
    """
    if release.size == 0:
        return np.zeros(0)
    L = np.sort(release + alone)
    A = np.cumsum(np.sort(area))
    return np.maximum(L, float(release.min()) + A / float(capacity))


def area_bound(problem: KVProblem) -> float:
    """Lower bound on the optimal total latency (rounds) of the round model
    (``models/lower-bounds.md`` (4)); integer-valued completions allow rounding up."""
    if problem.oversized().size:
        raise ValueError(f"request {int(problem.oversized()[0])} exceeds memory_tokens; "
                         "the instance is infeasible")
    a = problem.arrival_round.astype(np.float64)
    c = order_statistic_bound(a, problem.output_tokens.astype(np.float64),
                              problem.area_token_rounds().astype(np.float64),
                              float(problem.memory_tokens))
    return float(np.sum(np.ceil(c - 1e-9)) - a.sum())


# ==================================================================== cost-model bound
@dataclass(frozen=True, eq=False)
class CostBoundModel:
    """Per-request ingredients of the cost-model bound (arrays shape (n,)).

    Attributes:
        arrival_s: a_i (s).
        alone_s: L_i - a_i, least possible e2e latency of i (s), min over replicas.
        area_token_s: least KV token-seconds i must occupy, min over replicas, counting a
            full prompt block that m requests share as 1/m of a block for each (7).
        capacity_tokens: sum over replicas of KV capacity K_j (tokens).
        cached_tokens: prompt tokens assumed cached, c_hat_i: the leading blocks that some
            other request of the trace also holds (5).
        shared_discount_tokens: sigma_i (tokens), what sharing removes from i's
            context in the area term (7).
        memory_term: bool, requests whose release is their arrival (no parent): only
            they enter the order statistics of (9).
        digest: instance digest.
    """

    arrival_s: np.ndarray
    alone_s: np.ndarray
    area_token_s: np.ndarray
    capacity_tokens: float
    cached_tokens: np.ndarray
    digest: str = ""
    build_s: float = 0.0
    infeasible: np.ndarray | None = None
    message: str = ""
    shared_discount_tokens: np.ndarray | None = None
    memory_term: np.ndarray | None = None


def reusable_prefix_tokens(trace: Any) -> np.ndarray:
    """Tokens of each prompt that some earlier request could have left in a prefix cache:
    the leading run of its blocks that appeared in any earlier request, times the block
    size, capped at ``prompt - 1`` (an engine computes at least one token). Zeros when
    the trace has no block ids. int64 shape (n,).

    An estimate for the routing fluid model; the cost-model bound uses
    :func:`prefix_sharing`, which also counts blocks of later requests."""
    n = len(trace.prompt_tokens)
    out = np.zeros(n, dtype=np.int64)
    flat, off = getattr(trace, "block_flat", None), getattr(trace, "block_offsets", None)
    bt = int(getattr(trace, "block_tokens", 0) or 0)
    if flat is None or off is None or bt <= 0:
        return out
    seen: set[int] = set()
    flat_l, off_l = np.asarray(flat).tolist(), np.asarray(off).tolist()
    for i in range(n):
        blocks = flat_l[off_l[i]:off_l[i + 1]]
        run = 0
        for b in blocks:
            if b in seen:
                run += 1
            else:
                break
        out[i] = run * bt
        seen.update(blocks)
    return np.minimum(out, np.maximum(np.asarray(trace.prompt_tokens, np.int64) - 1, 0))


def prefix_sharing(trace: Any, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Which KV blocks of each prompt other requests of ``trace`` can share
    (``models/lower-bounds.md`` (5), (7); the keys of ``models/simulator.md`` (5)).

    Request ``i``'s full prompt block ``j`` of ``block_tokens`` tokens carries the content
    key (trace prefix chain up to the trace block holding its last token, ``j``); ``m_ij``
    is the number of requests whose prompts carry that key (1 if the block lies outside
    the trace's known prefix blocks). Returns ``(cached, discount)``, shape (n,):

    * ``cached`` (int64 tokens): ``min(run * block_tokens, prompt - 1)``, ``run`` the
      leading blocks with ``m_ij >= 2``: at most this much of the prompt can come from KV
      that another request computed; the rest ``i`` computes itself.
    * ``discount`` (float64 tokens): ``sum_j block_tokens * (1 - 1/m_ij)``. While ``i``
      holds its context the pool holds each shared block once for up to ``m_ij`` holders,
      so charging each holder ``block_tokens / m_ij`` never over-counts the pool.

    Both over the requests given (more requests only lower the bound). Zeros without block
    ids.
    """
    bc = int(block_tokens)
    if bc < 1:
        raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    s = np.asarray(trace.prompt_tokens, np.int64)
    n = s.size
    cached = np.zeros(n, np.int64)
    discount = np.zeros(n, np.float64)
    flat, off = getattr(trace, "block_flat", None), getattr(trace, "block_offsets", None)
    bt = int(getattr(trace, "block_tokens", 0) or 0)
    if flat is None or off is None or bt <= 0 or n == 0:
        return cached, discount
    flat_l, off_l = np.asarray(flat).tolist(), np.asarray(off).tolist()
    n_full = (s // bc).tolist()
    # a trie of trace prefix chains: node of (parent node, block id)
    child: dict[tuple[int, int], int] = {}
    paths: list[list[int]] = []
    holders: list[list[int]] = []          # per node: n_full of every request through it
    for i in range(n):
        node, path = -1, []
        for b in flat_l[off_l[i]:off_l[i + 1]]:
            key = (node, b)
            nxt = child.get(key)
            if nxt is None:
                nxt = len(holders)
                child[key] = nxt
                holders.append([])
            holders[nxt].append(n_full[i])
            node = nxt
            path.append(node)
        paths.append(path)
    sorted_holders = [np.sort(np.asarray(h, np.int64)) for h in holders]
    for i in range(n):
        nf, path = n_full[i], paths[i]
        if nf == 0 or not path:
            continue
        j = np.arange(nf, dtype=np.int64)
        kb = ((j + 1) * bc - 1) // bt                  # trace block of each block's last token
        inside = kb < len(path)
        m = np.ones(nf, np.int64)
        for k in np.unique(kb[inside]).tolist():
            sel = np.flatnonzero(kb == k)
            h = sorted_holders[path[k]]
            # requests through this chain node whose prompt has block j full
            m[sel] = h.size - np.searchsorted(h, j[sel] + 1, side="left")
        shared = m >= 2
        run = int(np.argmin(shared)) if not shared.all() else nf
        cached[i] = min(run * bc, max(int(s[i]) - 1, 0))
        discount[i] = float(np.sum(bc * (1.0 - 1.0 / m[shared])))
    return cached, discount


def _decode_tables(cost: Any, c_max: int, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """Prefix sums over contexts c = 0..c_max of a lower bound on one single-request
    decode iteration's time (s) and of c times it (token-s); the time at c is the exact
    time at the grid point at or below c (valid when time is non-decreasing in context)."""
    pts = np.arange(0, c_max + 1, grid, dtype=np.int64)
    t_pts = cost.decode_alone_s(pts)
    t = np.repeat(t_pts, grid)[:c_max + 1]
    c = np.arange(c_max + 1, dtype=np.float64)
    T1 = np.concatenate([[0.0], np.cumsum(t)])
    T2 = np.concatenate([[0.0], np.cumsum(c * t)])
    return T1, T2


def prefill_rate_s_per_token(cost: Any, max_tokens: int) -> tuple[float, float]:
    """(r, t1): ``r = min_{1 <= n <= max_tokens} t(prefill n tokens) / n`` (s per token, on
    every n up to 8192 and a dense geometric grid above) and ``t1`` = time of a one-token
    prefill, the shortest iteration that can hold a prefill chunk."""
    n_max = max(int(max_tokens), 1)
    dense = np.arange(1, min(n_max, 8192) + 1)
    extra = np.unique(np.geomspace(8192, n_max, 512).astype(np.int64)) if n_max > 8192 \
        else np.zeros(0, np.int64)
    n = np.concatenate([dense, extra[extra > 8192]])
    t = cost.prefill_alone_s(n)
    return float(np.min(t / n)), float(t[0])


def prefill_lower_bound_s(cost: Any, uncached_tokens: np.ndarray) -> np.ndarray:
    """Least total time (s) of the iterations that carry a prompt's uncached tokens, however
    they are chunked: ``max(t1, r * tokens)`` (``models/lower-bounds.md`` (5)), shape (n,)."""
    u = np.asarray(uncached_tokens, dtype=np.float64)
    if u.size == 0:
        return np.zeros(0)
    r, t1 = prefill_rate_s_per_token(cost, int(u.max()))
    return np.maximum(t1, r * u)


def build_cost_bound(instance: Any, *, replica_costs: Sequence[Any] | None = None,
                     max_grid_points: int = 8192,
                     sharing: tuple[np.ndarray, np.ndarray] | None = None) -> CostBoundModel:
    """Ingredients of the cost-model bound for ``instance``.

    Args:
        replica_costs: one cost model per replica; default: the instance's
            (``Instance.replica_cost_models``, heterogeneous clusters included).
        max_grid_points: decode times are evaluated on at most this many contexts and
            lower-bounded in between (monotonicity).
        sharing: ``(cached, discount)`` of :func:`prefix_sharing`, shape (n,) each, when
            they were computed over a larger set of requests (requests that ran but are
            not bounded here can still have filled the prefix cache); default: over
            ``instance.trace``.
    """
    t0 = time.perf_counter()
    trace = instance.trace
    costs = list(replica_costs) if replica_costs is not None else \
        instance.replica_cost_models()
    if not costs:
        raise ValueError("replica_costs must hold at least one cost model, got []")
    a = np.asarray(trace.arrival_s, dtype=np.float64)
    s = np.asarray(trace.prompt_tokens, np.int64)
    o = np.asarray(trace.output_tokens, np.int64)
    n = a.size
    if sharing is None:
        sharing = prefix_sharing(trace, instance.cluster.block_tokens)
    cached = np.asarray(sharing[0], np.int64)
    discount = np.asarray(sharing[1], np.float64)
    if cached.shape != (n,) or discount.shape != (n,):
        raise ValueError(f"sharing arrays must have shape ({n},), got {cached.shape} and "
                         f"{discount.shape}")
    parent = getattr(trace, "parent", None)
    memory_term = np.ones(n, bool) if parent is None else np.asarray(parent) < 0
    cap = np.array([float(c.kv_capacity_tokens(instance.cluster.gpu_memory_fraction))
                    for c in costs])
    peak = s + o
    too_big = np.flatnonzero(peak > cap.max()) if n else np.zeros(0, np.int64)
    if too_big.size:
        i = int(too_big[0])
        return CostBoundModel(a, np.zeros(n), np.zeros(n), float(cap.sum()), cached,
                              instance.digest(), time.perf_counter() - t0, too_big,
                              f"request {i} (prompt_tokens={int(s[i])}, output_tokens="
                              f"{int(o[i])}) needs {int(peak[i])} KV tokens > the largest "
                              f"replica capacity {int(cap.max())}", discount, memory_term)
    alone = np.full(n, np.inf)
    area = np.full(n, np.inf)
    c_max = int(peak.max()) if n else 0
    grid = max(1, -(-(c_max + 1) // max_grid_points))
    seen: set[int] = set()
    for cost in costs:
        if id(cost) in seen:
            continue
        seen.add(id(cost))
        pre = prefill_lower_bound_s(cost, s - cached)                           # (5)
        T1, T2 = _decode_tables(cost, c_max, grid)
        # decode iterations 2..o_i run with contexts >= s_i .. s_i + o_i - 2   (6)
        lo, hi = s, s + o - 1
        dec = T1[hi] - T1[lo]
        ar = (T2[hi] - T2[lo]) - discount * dec                                 # (7)
        alone = np.minimum(alone, pre + dec)
        area = np.minimum(area, ar)
    return CostBoundModel(a, alone, np.maximum(area, 0.0), float(cap.sum()), cached,
                          instance.digest(), time.perf_counter() - t0, None, "", discount,
                          memory_term)


def cost_bound_total(arrival_s: np.ndarray, alone_s: np.ndarray, area_token_s: np.ndarray,
                     capacity_tokens: float, memory_term: np.ndarray) -> tuple[float, np.ndarray]:
    """``models/lower-bounds.md`` (9): the bound on the total e2e latency (s) of these
    requests, and the completion-time bounds of the requests in ``memory_term`` (sorted).

    Requests outside ``memory_term`` (released after their arrival, by a parent) add
    ``alone_s`` only; the order statistics run over the others. Arrays shape (n,)."""
    m = np.asarray(memory_term, bool)
    c = order_statistic_bound(arrival_s[m], alone_s[m], area_token_s[m], capacity_tokens)
    total = float(c.sum() - arrival_s[m].sum()) + float(alone_s[~m].sum())
    return total, c


def solve_cost_bound(model: CostBoundModel, solver: str = "closed-form",
                     time_limit_s: float | None = None) -> Solution:
    """Evaluate the bound (``models/lower-bounds.md`` (9)); status OPTIMAL with
    ``objective == bound`` = the bound on total e2e latency (s), or INFEASIBLE naming a
    request that fits on no replica."""
    t0 = time.perf_counter()
    if model.infeasible is not None and model.infeasible.size:
        return Solution("cost-bound", Status.INFEASIBLE, wall_s=model.build_s,
                        digest=model.digest, message=model.message, objective_units="s",
                        primal={"infeasible_requests": model.infeasible})
    total, c = cost_bound_total(model.arrival_s, model.alone_s, model.area_token_s,
                                model.capacity_tokens, _memory_term(model))
    isolated = float(model.alone_s.sum())
    n = model.arrival_s.size
    return Solution("cost-bound", Status.OPTIMAL, total, total,
                    model.build_s + time.perf_counter() - t0, model.digest,
                    primal={"latency_lb_s": model.alone_s.copy(),
                            "area_token_s": model.area_token_s.copy(),
                            "completion_lb_s": c, "cached_tokens": model.cached_tokens,
                            "shared_discount_tokens": model.shared_discount_tokens},
                    objective_units="s",
                    info={"n_requests": int(n), "isolated_total_s": isolated,
                          "memory_term_gain_s": total - isolated,
                          "mean_e2e_lb_s": total / n if n else 0.0,
                          "capacity_tokens": model.capacity_tokens})


def certify_cost_bound(model: CostBoundModel, solution: Solution) -> dict[str, float]:
    """Residuals: recomputed bound minus reported, and negative ingredients."""
    if not solution.solved:
        return {"objective_residual": 0.0, "negative_terms": 0.0}
    total, _ = cost_bound_total(model.arrival_s, model.alone_s, model.area_token_s,
                                model.capacity_tokens, _memory_term(model))
    return {"objective_residual": abs(total - solution.objective),
            "negative_terms": float(np.sum(model.alone_s < 0) + np.sum(model.area_token_s < 0))}


def _memory_term(model: CostBoundModel) -> np.ndarray:
    n = model.arrival_s.size
    return np.ones(n, bool) if model.memory_term is None else model.memory_term


def _no_export(solution: Solution, instance: Any) -> Any:
    raise SolutionError(f"{solution.formulation} is a bound and exports no policy")


# --------------------------------------------------------------- abstract-model area bound
def build_area(instance: Any, *, memory_tokens: int | None = None,
               round_s: float = 1.0) -> tuple[KVProblem, str]:
    """The round model of ``instance`` (:meth:`KVProblem.from_instance`: rounds of
    ``round_s`` seconds, KV memory ``memory_tokens`` or the instance's unit-round cost model)
    and the instance digest."""
    return KVProblem.from_instance(instance, memory_tokens, round_s), instance.digest()


def solve_area(model: tuple[KVProblem, str], solver: str = "closed-form",
               time_limit_s: float | None = None) -> Solution:
    """The area bound of ``models/lower-bounds.md`` (4) in closed form (total latency,
    rounds): OPTIMAL with objective = bound, or INFEASIBLE naming the first request whose
    peak KV exceeds ``memory_tokens``. ``solver`` and ``time_limit_s`` are accepted for the
    :class:`Formulation` interface and unused."""
    t0 = time.perf_counter()
    p, digest = model
    bad = p.oversized()
    if bad.size:
        i = int(bad[0])
        return Solution("schedule-area", Status.INFEASIBLE, digest=digest,
                        message=f"request {i} needs {int(p.peak_tokens()[i])} tokens > "
                                f"memory_tokens {p.memory_tokens}", objective_units="rounds",
                        primal={"infeasible_requests": bad})
    v = area_bound(p)
    return Solution("schedule-area", Status.OPTIMAL, v, v, time.perf_counter() - t0, digest,
                    objective_units="rounds")


def certify_area(model: tuple[KVProblem, str], solution: Solution) -> dict[str, float]:
    """``{"objective_residual": |area bound recomputed - reported|}`` (rounds; 0 for an
    unsolved solution)."""
    if not solution.solved:
        return {"objective_residual": 0.0}
    return {"objective_residual": abs(area_bound(model[0]) - solution.objective)}


COST_BOUND = Formulation("cost-bound", build_cost_bound, solve_cost_bound, certify_cost_bound,
                         _no_export, is_bound=True)
SCHEDULE_AREA = Formulation("schedule-area", build_area, solve_area, certify_area, _no_export,
                            is_bound=True)
