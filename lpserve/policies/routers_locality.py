"""The dual-index router of the locality-aware routing LP (``models/routing-lp.md`` (18)-(20)).

:class:`LocalityIndexRouter` sends each arriving request to

    argmin_m  TTFT_m(P | h_m) + prices_m . use_m(P - h_m, D) + D (theta_m + decode prices)

over the replicas that can hold the prompt: ``h_m`` the prompt's tokens cached on
replica ``m`` (``RouterView.cached_tokens``, from KV events); ``TTFT_m`` the prompt tokens
still to prefill there plus the uncached part of this prompt, at the replica's own chunk
rate (with the quadratic attention term of its cost model, so the attention over the
cached prefix is priced), slowed by the decodes that share each iteration (19);
``theta_m`` the request's TPOT with the replica's current batch (20); the prices the
duals of the fluid LP's prefill, decode, GPU-time and KV rows. It is the LP's objective,
latency, for this one request at the live state, priced by the LP. The replica loop runs
in numba (:mod:`lpserve.policies._routing_kernels`): O(R) per request.

With identical replicas, no cached tokens and zero prices the index is a constant plus
the backlog term: in the fluid router's form (``backlog="requests"``,
``prefill="static"``, ``decode="reference"``) it routes exactly as
join-the-shortest-queue, in the default form with the same batch everywhere as
join-the-least-work (``proofs/routing-locality-index.md``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.policies._routing_kernels import N_COEF, locality_route
from lpserve.policies.session_returns import SessionReturns
from lpserve.policy import Meta, Router, RouterView

__all__ = ["LocalityIndexRouter"]

BACKLOGS = ("tokens", "requests")
PREFILLS = ("live", "static")
DECODES = ("live", "marginal", "reference", "none")
FAMILIES = ("prefill", "decode", "gpu", "kv")


def _vec(name: str, x: Any, R: int, positive: bool = True) -> np.ndarray:
    v = np.asarray(x, np.float64)
    if v.shape != (R,) or not np.all(np.isfinite(v)) or \
            (np.any(v <= 0) if positive else np.any(v < 0)):
        raise ValueError(f"LocalityIndexRouter.{name} must be {R} finite "
                         f"{'positive' if positive else 'non-negative'} values, got {x!r}")
    v.setflags(write=False)
    return v


class LocalityIndexRouter(Router):
    """``argmin_m`` of (18) over the replicas that can hold the prompt: estimated TTFT on
    ``m`` + dual prices x resource use + the request's decode time there.

    Args (arrays of shape ``(R,)``, one entry per replica):
        chunk_s: time of one prefill chunk of ``chunk_tokens`` tokens (s), and
            ``attention_s``: the quadratic coefficient of prefill time (s per token^2):
            a prompt of P tokens with h cached costs ``(P - h) chunk_s / chunk_tokens +
            attention_s (P^2 - h^2)`` (18a).
        decode_fit: ``(R, 3)`` decode iteration time ``d0 + d1 k + d2 c`` of ``k``
            decodes holding ``c`` context tokens in all (s).
        prefill_tokens_per_s, decode_tokens_per_s: mu^P, mu^D of the fluid LP (to turn
            the GPU-time price into a price per token); tpot_s: tau at its reference batch.
        prices: dual prices by row family (``"prefill"``, ``"decode"``, ``"gpu"``,
            ``"kv"``), each (R,) and >= 0; missing families are 0.
        default_output_tokens: D when the request has no predicted interval.
        request_s: w, GPU seconds of a mean request (the ``requests`` backlog's weight).
        backlog: ``"tokens"`` (prompt tokens still to prefill, ``prefill_tokens``) or
            ``"requests"`` (``outstanding x w``, the fluid router's (17)).
        prefill: ``"live"`` slows prefill by the decodes sharing each iteration (19):
            ``1 + (d0 + d1 running + d2 kv) / chunk_s``; ``"static"`` does not.
        decode: the request's decode term: ``"live"`` ``D x`` its TPOT with the current
            batch (20), ``"marginal"`` that plus the delay it adds to the running batch,
            ``"reference"`` ``D tau``, ``"none"`` no decode term (TTFT only).
        sessions: price the delay the request's prefill adds to sessions between turns
            whose context is on the replica, at the sessions' observed return rate (21)
            (:class:`~lpserve.policies.session_returns.SessionReturns`; the router then
            reads completions). No term for traces without sessions. On by default: with
            it the router is within 1.03 x the best deployed router's mean TTFT on every
            case of ``benchmarks/routing_kv_aware.py``, without it up to 1.27 x on the
            homogeneous agentic ones (``models/routing-lp.md`` (21)).
    """

    name = "lp-locality"
    meta = Meta(online=True, clairvoyant=False, stochastic=False)

    def __init__(self, *, chunk_s: Any, chunk_tokens: int, attention_s: Any,
                 decode_fit: Any, prefill_tokens_per_s: Any, decode_tokens_per_s: Any,
                 tpot_s: Any, prices: dict[str, Any] | None = None,
                 default_output_tokens: float = 256.0, request_s: Any = None,
                 backlog: str = "tokens", prefill: str = "live", decode: str = "live",
                 sessions: bool = True) -> None:
        for what, v, ok in (("backlog", backlog, BACKLOGS), ("prefill", prefill, PREFILLS),
                            ("decode", decode, DECODES)):
            if v not in ok:
                raise ValueError(f"LocalityIndexRouter.{what} must be one of {ok}, got {v!r}")
        tau = np.asarray(tpot_s, np.float64)
        R = tau.size
        self.R = R
        self.tau = _vec("tpot_s", tau, R)
        self.chunk_s = _vec("chunk_s", chunk_s, R)
        if not (isinstance(chunk_tokens, (int, np.integer)) and chunk_tokens >= 1):
            raise ValueError(f"chunk_tokens must be a positive integer, got {chunk_tokens!r}")
        self.chunk_tokens = int(chunk_tokens)
        self.attention_s = _vec("attention_s", attention_s, R, positive=False)
        muP = _vec("prefill_tokens_per_s", prefill_tokens_per_s, R)
        muD = _vec("decode_tokens_per_s", decode_tokens_per_s, R)
        d = np.asarray(decode_fit, np.float64)
        if d.shape != (R, 3) or not np.all(np.isfinite(d)):
            raise ValueError(f"decode_fit must be a finite ({R}, 3) array, got {d.shape}")
        self.d0, self.d1, self.d2 = (_vec("decode_fit", d[:, j], R, positive=False)
                                     for j in range(3))
        prices = dict(prices or {})
        bad = sorted(set(prices) - set(FAMILIES))
        if bad:
            raise ValueError(f"LocalityIndexRouter.prices: unknown families {bad}")
        self.prices = {k: _vec(f"prices[{k!r}]", prices.get(k, np.zeros(R)), R,
                               positive=False) for k in FAMILIES}
        if not default_output_tokens >= 1:
            raise ValueError(f"default_output_tokens must be >= 1, got {default_output_tokens!r}")
        self.default_output_tokens = float(default_output_tokens)
        self.W = np.ones(R) if request_s is None else _vec("request_s", request_s, R)
        self.backlog, self.prefill, self.decode = backlog, prefill, decode
        pr = self.prices
        # (18): seconds per prompt token of a chunk, prices per uncached token, per output
        # token and per KV token-second
        self.per_token = self.chunk_s / self.chunk_tokens
        self.Bp = pr["prefill"] + pr["gpu"] / muP
        self.Cp = pr["decode"] + pr["gpu"] / muD
        self.E = pr["kv"] * self.tau
        coef = np.empty((N_COEF, R))
        coef[:] = [self.per_token, self.attention_s, self.chunk_s, self.Bp, self.Cp, self.E,
                   self.d0, self.d1, self.d2, self.W, self.tau]
        coef.setflags(write=False)
        self.coef = coef
        self.modes = np.array([BACKLOGS.index(backlog), PREFILLS.index(prefill),
                               DECODES.index(decode)], np.int64)
        self.modes.setflags(write=False)
        self.reads_completions = bool(sessions)
        self._returns = SessionReturns(R) if sessions else None
        self._none = np.zeros(R)

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget the sessions between turns and their return rate (21)."""
        if self._returns is not None:
            self._returns.reset(self.R)

    @classmethod
    def from_profiles(cls, profiles: list[Any], *, chunk_tokens: int = 2048,
                      prices: dict[str, Any] | None = None,
                      default_output_tokens: float = 256.0, mean_prompt_tokens: float = 1024.0,
                      **options: Any) -> "LocalityIndexRouter":
        """From one :class:`~lpserve.opt.routing_profile.ReplicaProfile` per replica (zero
        prices unless given); ``w_m`` = GPU seconds of a request of the mean prompt and
        output on ``m`` (17); ``options``: ``backlog``, ``prefill``, ``decode``,
        ``sessions``."""
        muP = np.array([p.prefill_tokens_per_s for p in profiles])
        muD = np.array([p.decode_tokens_per_s for p in profiles])
        return cls(chunk_s=np.array([float(p.prefill_s(np.array([chunk_tokens]))[0])
                                     for p in profiles]),
                   chunk_tokens=chunk_tokens,
                   attention_s=np.array([max(p.prefill_quadratic()[2], 0.0) for p in profiles]),
                   decode_fit=np.stack([p.decode_fit for p in profiles]),
                   prefill_tokens_per_s=muP, decode_tokens_per_s=muD,
                   tpot_s=np.array([p.tpot_s for p in profiles]), prices=prices,
                   default_output_tokens=default_output_tokens,
                   request_s=mean_prompt_tokens / muP + default_output_tokens / muD, **options)

    def _need(self, view: RouterView, field: str) -> np.ndarray:
        v = getattr(view, field)
        if v is None:
            raise ValueError(f"router {self.name!r} reads RouterView.{field}, which this "
                             "view does not provide")
        return v

    def route(self, view: RouterView) -> np.ndarray:
        """One replica per arriving request, (n,) int64: ``argmin_m`` of (18) over the
        replicas that can hold the prompt (:func:`~lpserve.policies._routing_kernels.
        locality_route`)."""
        if view.n_replicas != self.R:
            raise ValueError(f"router {self.name!r} was built for {self.R} replicas, the view "
                             f"has {view.n_replicas}")
        H = self._need(view, "cached_tokens")
        if self.backlog == "tokens":
            backlog = self._need(view, "prefill_tokens")
            sq = view.prefill_square_tokens
            backlog_sq = self._none if sq is None else sq
        else:
            backlog, backlog_sq = view.outstanding, self._none
        lo, hi = view.predicted_lo, view.predicted_hi
        D = ((lo + hi) / 2.0 if lo is not None and hi is not None
             else np.full(len(view), self.default_output_tokens))
        ret = self._returns if view.phase != "decode" else None
        if ret is not None:
            ret.observe(view.now_s, view.completions, view.session_id)
        out = locality_route(self.coef, view.prompt_tokens.astype(np.float64), D, H, backlog,
                             backlog_sq, view.running, view.used_blocks, float(view.block_tokens),
                             view.max_prompt_tokens, self.modes,
                             self._none if ret is None else ret.resident,
                             0.0 if ret is None else ret.rate_per_s)
        if ret is not None:
            ret.routed(view.request, view.session_id, out, view.arrival_s)
        return out
