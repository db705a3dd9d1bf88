"""The routing LP with prefix-cache locality and heterogeneous replicas
(``routing-locality``, ``models/routing-lp.md`` section 4).

* :func:`prefix_groups` -- the prefix groups of a trace with block ids: each request joins
  the group of the longest prefix it shares with an earlier request (the block chain it
  could find cached), the most frequent ones kept, the rest pooled.
* :func:`build_locality` -- the fluid LP (5)-(13) over those groups, every replica priced by
  its own cost model (GPU type, TP) with its own KV capacity row (10).
* :func:`locality_costs` -- per-(request, replica) costs of the assignment LP (1a) for a
  batch of requests given what each replica has cached and its backlog, with the pairs
  whose KV cannot hold the request forbidden (4a); the matrix stays totally unimodular
  (``proofs/assignment-integrality.md``).
* :func:`export_locality` -- the dual-index router (18): live cached tokens, each
  replica's own speed, the LP's prices; O(R) per request.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.opt.budget import Deadline
from lpserve.opt.routing_lp import build_fluid, certify_fluid, solve_fluid
from lpserve.opt.routing_profile import output_interval, replica_costs, replica_profile
from lpserve.opt.solution import Formulation, Solution

__all__ = ["ROUTING_LOCALITY", "build_locality", "export_locality", "locality_costs",
           "locality_profiles", "prefix_groups", "solve_locality"]


def prefix_groups(trace: Any, max_groups: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """``(keys (G,), group of each request (n,))``: a request's group is the chained hash
    of the longest leading run of its blocks that an earlier request had (the prefix it
    could reuse); the ``max_groups - 1`` most frequent such prefixes are kept and the rest
    pooled under key -1 (so are requests that share nothing). One group without block
    ids."""
    if max_groups < 1:
        raise ValueError(f"max_groups must be >= 1, got {max_groups!r}")
    n = len(trace)
    flat, off = getattr(trace, "block_flat", None), getattr(trace, "block_offsets", None)
    if flat is None or off is None or n == 0:
        return np.array([-1], np.int64), np.zeros(n, np.int64)
    flat_l, off_l = np.asarray(flat).tolist(), np.asarray(off).tolist()
    seen: set[int] = set()
    root = np.full(n, -1, np.int64)
    for i in range(n):
        h, best = 0, -1
        for b in flat_l[off_l[i]:off_l[i + 1]]:
            h = hash((h, b))
            if h not in seen:
                break
            best = h
        root[i] = best
        h = 0
        for b in flat_l[off_l[i]:off_l[i + 1]]:
            h = hash((h, b))
            seen.add(h)
    vals, cnt = np.unique(root[root != -1], return_counts=True)
    top = vals[np.argsort(-cnt, kind="stable")][:max(0, max_groups - 1)]
    keys = np.concatenate([top, [-1]]).astype(np.int64)
    index = {int(k): q for q, k in enumerate(keys)}
    g = np.array([index.get(int(r), keys.size - 1) for r in root.tolist()], np.int64)
    return keys, g


def build_locality(instance: Any, *, max_groups: int = 16, **fluid_options: Any) -> Any:
    """The fluid LP of ``instance`` over its prefix groups (:func:`prefix_groups`), each
    replica priced by its own cost model, prefill by each prompt's own time
    (``exact_prefill=True`` unless given); ``fluid_options`` go to
    :func:`lpserve.opt.routing_lp.build_fluid` (``rate_scale``, ``utilization``, ...)."""
    if "groups" in fluid_options:
        raise ValueError("build_locality: the groups are the trace's prefix groups; call "
                         "build_fluid(groups=...) to give others")
    fluid_options.setdefault("exact_prefill", True)
    return build_fluid(instance, groups=prefix_groups(instance.trace, max_groups),
                       **fluid_options)


def locality_profiles(instance: Any, costs: Any = None) -> list[Any]:
    """One :class:`~lpserve.opt.routing_profile.ReplicaProfile` per replica of
    ``instance`` (replicas of one type share one), tabulated up to its longest sequence."""
    tr = instance.trace
    lo, hi, _ = output_interval(tr)
    c_max = int(max((np.asarray(tr.prompt_tokens) + hi).max(initial=0), 2))
    made: dict[int, Any] = {}
    out = []
    for c in replica_costs(instance, costs):
        if id(c) not in made:
            made[id(c)] = replica_profile(
                c, c_max=c_max, gpu_memory_fraction=instance.cluster.gpu_memory_fraction)
        out.append(made[id(c)])
    return out


def locality_costs(instance: Any, cached_tokens: np.ndarray, *,
                   backlog_s: np.ndarray | None = None,
                   costs: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``(cost_s (n, R), allowed (n, R))`` of the assignment LP for the requests of
    ``instance`` (1a), (4a): c_ij = backlog_j + T_j(s_i | h_ij) + E[decode_j], with
    ``T_j(s | h) = T_j(s) - T_j(h) + T_j(1)`` the replica's own prefill of the uncached
    part, and ``allowed`` where replica j's KV holds prompt + predicted upper output.
    Pass both to :func:`lpserve.opt.routing_lp.build_assignment` (``cost_s=``,
    ``allowed=``)."""
    tr = instance.trace
    s = np.asarray(tr.prompt_tokens, np.int64)
    lo, hi, _ = output_interval(tr)
    profs = locality_profiles(instance, costs)
    R = len(profs)
    h = np.asarray(cached_tokens, np.int64)
    if h.shape != (s.size, R) or np.any(h < 0) or np.any(h > s[:, None]):
        raise ValueError(f"cached_tokens must be ({s.size}, {R}) integers in [0, prompt], "
                         f"got shape {h.shape}")
    b = np.zeros(R) if backlog_s is None else np.asarray(backlog_s, np.float64)
    if b.shape != (R,) or np.any(b < 0):
        raise ValueError(f"backlog_s must be {R} non-negative seconds, got {backlog_s!r}")
    C = np.stack([b[j] + p.prefill_cached_s(s, h[:, j]) + p.expected_decode_s(s, lo, hi)
                  for j, p in enumerate(profs)], axis=1)
    allowed = np.stack([s + hi <= p.kv_tokens for p in profs], axis=1)
    return C, allowed


def export_locality(solution: Solution, instance: Any, *, chunk_tokens: int = 2048,
                    **options: Any) -> Any:
    """The dual-index router (18)-(20) of a solved ``routing-locality`` (or
    ``routing-fluid``) model of ``instance``: each replica's own prefill and decode
    fits, the duals of the prefill, decode, GPU and KV rows, live cached tokens, backlog
    and batch. ``chunk_tokens``: the engine's prefill budget per iteration; ``options``
    (``backlog``, ``prefill``, ``decode``) go to
    :class:`~lpserve.policies.routers_locality.LocalityIndexRouter`."""
    from lpserve.policies.routers_locality import LocalityIndexRouter

    solution.require_solved(instance.digest())
    p, d = solution.primal, solution.dual
    profs = locality_profiles(instance)
    R = p["tpot_s"].size
    if len(profs) != R:
        raise ValueError(f"export_locality: the solution has {R} replicas, the instance "
                         f"{len(profs)}")
    lam = p["rate_per_s"].sum(axis=1)
    Dbar = float(lam @ p["class_output_tokens"] / lam.sum())
    Pbar = float(lam @ p["class_prompt_tokens"] / lam.sum())
    prices = {k: np.asarray(d.get(k, np.zeros(R)), np.float64)
              for k in ("prefill", "decode", "gpu", "kv")}
    return LocalityIndexRouter.from_profiles(profs, chunk_tokens=chunk_tokens, prices=prices,
                                             default_output_tokens=Dbar,
                                             mean_prompt_tokens=Pbar, **options)


def solve_locality(model: Any, solver: str = "highs", time_limit_s: float | None = None,
                   deadline: Deadline | None = None) -> Solution:
    """:func:`lpserve.opt.routing_lp.solve_fluid` on a locality model, the solution named
    ``routing-locality`` (``deadline`` from ``lp.solve`` wins over ``time_limit_s``)."""
    from dataclasses import replace

    return replace(solve_fluid(model, solver=solver, time_limit_s=time_limit_s,
                               deadline=deadline),
                   formulation="routing-locality")


ROUTING_LOCALITY = Formulation("routing-locality", build_locality, solve_locality,
                               certify_fluid, export_locality)
