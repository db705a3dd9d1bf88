"""Routers exported from the routing formulations (``models/routing-lp.md`` (15)–(17)).

* :class:`AssignmentRouter` — offline table: request index -> replica from the integral
  assignment LP.
* :class:`FluidSplitRouter` — each request's class (prompt bucket x predicted-output
  bucket x prefix group) picks a replica at random with the fluid LP's split
  ``a_cm / lambda_c``.
* :class:`DualIndexRouter` — sends each request to ``argmin_m`` of its expected latency on
  ``m`` + the LP's dual prices x the resources it uses on ``m`` + live queue work
  ``outstanding_m x w_m`` (requests routed in the same call count as outstanding).

All three are built from a solved :class:`~lpserve.opt.solution.Solution` (the
formulation's ``export`` refuses an unsolved one) and keep only numpy arrays, so they
pickle and run in every engine.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from lpserve.policy import Meta, Router, RouterView


def _predicted_output(view: RouterView, default_tokens: float) -> np.ndarray:
    lo, hi = view.predicted_lo, view.predicted_hi
    if lo is not None and hi is not None:
        return (np.asarray(lo, np.float64) + np.asarray(hi, np.float64)) / 2.0
    return np.full(len(view), float(default_tokens))


class AssignmentRouter(Router):
    """Replica of each trace request from an offline assignment; requests outside the
    table go round robin."""

    name = "lp-assignment"
    meta = Meta(online=False, clairvoyant=False, stochastic=False)

    def __init__(self, replica_of_request: np.ndarray) -> None:
        self.table = np.asarray(replica_of_request, dtype=np.int64).copy()
        self.table.setflags(write=False)
        self._next = 0

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Restart the round-robin counter for requests outside the table."""
        self._next = 0

    def route(self, view: RouterView) -> np.ndarray:
        """``table[request]`` for requests inside the table, round robin for the others,
        clipped to ``n_replicas - 1`` (int64 ``(n_arriving,)``)."""
        req = view.request
        out = np.empty(req.size, dtype=np.int64)
        ok = (req >= 0) & (req < self.table.size)
        out[ok] = self.table[req[ok]]
        k = int((~ok).sum())
        out[~ok] = (self._next + np.arange(k)) % view.n_replicas
        self._next = (self._next + k) % max(view.n_replicas, 1)
        return np.minimum(out, view.n_replicas - 1)


class _ClassLookup:
    """Class of a request from bucket edges and prefix group (tenant), as in the LP."""

    def __init__(self, primal: dict[str, np.ndarray]) -> None:
        self.prompt_edges = np.asarray(primal["prompt_edges"], np.float64)
        self.output_edges = np.asarray(primal["output_edges"], np.float64)
        self.prompt_list = self.prompt_edges.tolist()   # for scalar bisection
        self.output_list = self.output_edges.tolist()
        keys = np.asarray(primal["group_keys"], np.int64)
        self.group_of = {int(k): q for q, k in enumerate(keys) if k >= 0}
        self.other = int(np.flatnonzero(keys == -1)[0]) if np.any(keys == -1) else 0
        self.n_groups = keys.size
        self.default_output = float(np.mean(primal["class_output_tokens"]))

    def groups(self, tenant: np.ndarray) -> np.ndarray:
        return np.array([self.group_of.get(int(t), self.other) for t in tenant], np.int64)

    def keys(self, view: RouterView) -> np.ndarray:
        p = np.searchsorted(self.prompt_edges, view.prompt_tokens, side="right")
        d = np.searchsorted(self.output_edges, _predicted_output(view, self.default_output),
                            side="right")
        return (p * (self.output_edges.size + 1) + d) * self.n_groups + self.groups(view.tenant)


class FluidSplitRouter(Router):
    """Random routing with the fluid LP's per-class split (``models/routing-lp.md`` (15))."""

    name = "lp-fluid-split"
    meta = Meta(online=True, clairvoyant=False, stochastic=True)

    def __init__(self, class_keys: np.ndarray, split: np.ndarray, lookup: _ClassLookup,
                 fallback: np.ndarray) -> None:
        self.class_keys = np.asarray(class_keys, np.int64)
        cum = np.cumsum(np.maximum(split, 0), axis=1)
        self.cum = cum / np.maximum(cum[:, -1:], 1e-300)
        self.fallback = np.cumsum(fallback) / max(float(np.sum(fallback)), 1e-300)
        self.lookup = lookup
        self._index = {int(k): c for c, k in enumerate(self.class_keys)}
        self._rng = np.random.default_rng(0)

    @classmethod
    def from_solution(cls, solution: Any) -> "FluidSplitRouter":
        """The router of a solved fluid LP: ``primal["split"]`` (classes x replicas rates
        in requests/s) gives each class's routing probabilities; requests of a class the LP
        did not see use the replicas' total rates ``rate_per_s.sum(axis=0)``."""
        p = solution.primal
        lk = _ClassLookup(p)
        P, D, g = p["class_prompt_tokens"], p["class_output_tokens"], p["class_group"]
        keys = ((np.searchsorted(lk.prompt_edges, P, side="right") * (lk.output_edges.size + 1)
                 + np.searchsorted(lk.output_edges, D, side="right")) * lk.n_groups + g)
        return cls(keys, p["split"], lk, p["rate_per_s"].sum(axis=0))

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Take ``rng`` as the router's only source of randomness."""
        self._rng = rng

    def route(self, view: RouterView) -> np.ndarray:
        """A replica per arriving request, int64 ``(n_arriving,)``, drawn with its class's
        split (one uniform draw per request, inverted through the cumulative split), clipped to
        ``n_replicas - 1``."""
        if len(view) == 1:              # the common case: scalars, one search of length R
            lk = self.lookup
            lo, hi = view.predicted_lo, view.predicted_hi
            D = (float(lo[0]) + float(hi[0])) / 2.0 if lo is not None and hi is not None \
                else lk.default_output
            k = ((bisect_right(lk.prompt_list, float(view.prompt_tokens[0]))
                  * (lk.output_edges.size + 1) + bisect_right(lk.output_list, D))
                 * lk.n_groups + lk.group_of.get(int(view.tenant[0]), lk.other))
            c = self._index.get(k)
            cum = self.fallback if c is None else self.cum[c]
            m = int(np.searchsorted(cum, self._rng.random(), side="right"))
            return np.array([min(m, view.n_replicas - 1)], dtype=np.int64)
        keys = self.lookup.keys(view)
        u = self._rng.random(keys.size)
        out = np.empty(keys.size, dtype=np.int64)
        for q, k in enumerate(keys.tolist()):
            c = self._index.get(k)
            cum = self.fallback if c is None else self.cum[c]
            out[q] = int(np.searchsorted(cum, u[q], side="right"))
        return np.minimum(out, view.n_replicas - 1)


class DualIndexRouter(Router):
    """``argmin_m`` of ``A_m + B_m P + C_m D + E_m (P D + D^2/2) - saving[g, m]
    + w_m (outstanding_m + routed_now_m)`` (``models/routing-lp.md`` (16)–(17)).

    ``A_m + B_m P`` is the linear fit of prefill time, ``C_m`` is TPOT plus the decode and
    GPU prices, ``B_m`` also carries the prefill and GPU prices, ``E_m`` is the KV price x
    TPOT (Little's law KV token-seconds), ``saving`` the prefill time a resident prefix
    saves, ``w_m`` the GPU seconds of an average request on ``m`` times ``queue_weight``.
    """

    name = "lp-dual-index"
    meta = Meta(online=True, clairvoyant=False, stochastic=False)

    def __init__(self, A: np.ndarray, B: np.ndarray, C: np.ndarray, E: np.ndarray,
                 W: np.ndarray, saving: np.ndarray, lookup: _ClassLookup) -> None:
        self.A, self.B, self.C, self.E, self.W = (np.asarray(x, np.float64) for x in (A, B, C, E, W))
        self.saving = np.asarray(saving, np.float64)
        self.lookup = lookup

    @classmethod
    def from_solution(cls, solution: Any, queue_weight: float = 1.0) -> "DualIndexRouter":
        """The index router of a solved fluid LP: the prefill fit, rates and TPOT from
        ``primal``, the dual prices of the ``prefill``, ``decode``, ``gpu`` and ``kv`` rows from
        ``dual`` (0 where absent), and ``w_m = queue_weight x (Pbar / muP_m + Dbar / muD_m)`` with
        the rate-weighted mean prompt ``Pbar`` and output ``Dbar`` (tokens)."""
        p, d = solution.primal, solution.dual
        fit = p["prefill_fit"]                                # (R, 2): intercept, slope
        muP, muD, tpot = p["prefill_tokens_per_s"], p["decode_tokens_per_s"], p["tpot_s"]
        R = tpot.size
        pP, pD = d.get("prefill", np.zeros(R)), d.get("decode", np.zeros(R))
        pG, pK = d.get("gpu", np.zeros(R)), d.get("kv", np.zeros(R))
        A = fit[:, 0]
        B = fit[:, 1] + pP + pG / muP
        C = tpot + pD + pG / muD
        E = pK * tpot
        lam = p["rate_per_s"].sum(axis=1)
        Pbar = float(lam @ p["class_prompt_tokens"] / lam.sum())
        Dbar = float(lam @ p["class_output_tokens"] / lam.sum())
        W = queue_weight * (Pbar / muP + Dbar / muD)
        return cls(A, B, C, E, W, p["group_saving_s"], _ClassLookup(p))

    def route(self, view: RouterView) -> np.ndarray:
        """``argmin_m`` of the index for each arriving request, in order, int64
        ``(n_arriving,)``; each routed request adds ``w_m`` of queue work to its replica for the
        requests after it in the same call."""
        n = len(view)
        if n == 1:                      # the common case: scalar features, one length-R pass
            P = float(view.prompt_tokens[0])
            lo, hi = view.predicted_lo, view.predicted_hi
            D = (float(lo[0]) + float(hi[0])) / 2.0 if lo is not None and hi is not None \
                else self.lookup.default_output
            score = self.A + P * self.B + D * self.C + (P * D + 0.5 * D * D) * self.E
            if self.saving.shape[0] > 1:
                score = score - self.saving[self.lookup.group_of.get(int(view.tenant[0]),
                                                                     self.lookup.other)]
            elif self.saving.shape[0] == 1:
                score = score - self.saving[0]
            score += view.outstanding * self.W
            return np.array([int(score.argmin())], dtype=np.int64)
        P = view.prompt_tokens.astype(np.float64)
        D = _predicted_output(view, self.lookup.default_output)
        g = self.lookup.groups(view.tenant) if self.saving.shape[0] > 1 else np.zeros(n, np.int64)
        base = (self.A[None, :] + P[:, None] * self.B[None, :] + D[:, None] * self.C[None, :]
                + (P * D + 0.5 * D * D)[:, None] * self.E[None, :] - self.saving[g])
        q = view.outstanding.astype(np.float64) * self.W
        out = np.empty(n, dtype=np.int64)
        for i in range(n):
            m = int(np.argmin(base[i] + q))
            out[i] = m
            q[m] += self.W[m]
        return out
