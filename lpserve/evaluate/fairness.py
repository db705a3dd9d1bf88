"""Measuring fairness across tenants: the service each tenant received over time and the
largest service difference between two tenants that were both backlogged.

:func:`with_service_recorder` wraps a policy's budget-controller slot with a
:class:`ServiceRecorder` that notes, independently of the policy, every output token the
engine produces (request, replica, time of the iteration's end) and forwards every call
to the controller the policy had (a VTC scheduler's meter, or none). With the run's
:class:`~lpserve.sim.Result`, :func:`max_service_difference` finds, per replica and pair
of tenants, the largest change of the difference of their service over any interval in
which both had a request waiting on that replica (``proofs/fairness-vtc.md``):

``max_{[t1, t2] within a joint backlog} |(W_f(t1, t2) / w_f) - (W_g(t1, t2) / w_g)|``,

with ``W = input_price * prompt tokens admitted + output_price * output tokens``; a
prompt counts at the request's admission (``first_scheduled_s``), a token at the end of
the iteration that produced it. Requests must not be preempted (the waiting interval of
a request is ``[arrival, first scheduled]``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from lpserve.cost import iteration_time
from lpserve.policy import BudgetController, Policy

__all__ = ["ServiceRecorder", "max_service_difference", "with_service_recorder"]

_EMPTY = np.zeros(0, np.int64)


class ServiceRecorder(BudgetController):
    """Records every produced output token and forwards to ``inner`` (or does nothing).

    :attr:`events` is a list of ``(end_s, replica, request, tokens)``: ``tokens`` output
    tokens of ``request`` produced by the iteration on ``replica`` that ended at ``end_s``.
    Decode runs are unrolled iteration by iteration with the engine's cost function.
    """

    name = "service-recorder"

    def __init__(self, inner: BudgetController | None = None) -> None:
        self.inner = inner
        self.events: list[tuple[float, int, int, int]] = []

    def bind(self, cluster: Any, slo: Any, tiers: tuple = ()) -> None:
        """Pass the instance's ``cluster``, ``slo`` and ``tiers`` to the wrapped
        controller, if any (its parameters that mirror the instance)."""
        if self.inner is not None:
            self.inner.bind(cluster, slo, tiers)

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Clear :attr:`events` and reset the wrapped controller, if any, with the same
        ``cluster`` and ``rng``."""
        self.events = []
        if self.inner is not None:
            self.inner.reset(cluster, rng)

    def budget(self, view: Any) -> int:
        """The wrapped controller's prefill-token budget, else ``view.cap_tokens``
        (the engine's own budget)."""
        return int(view.cap_tokens) if self.inner is None else int(self.inner.budget(view))

    def decode_limit(self, view: Any) -> int:
        """The wrapped controller's limit on the decode run, else ``view.max_iters``."""
        return int(view.max_iters) if self.inner is None else int(self.inner.decode_limit(view))

    def observe(self, view: Any) -> None:
        """Record one token for each request in ``view.produced_request`` at
        ``view.now_s``, then forward the view."""
        rep = int(view.replica[1])
        for i in view.produced_request.tolist():
            self.events.append((float(view.now_s), rep, int(i), 1))
        if self.inner is not None:
            self.inner.observe(view)

    def observe_decode_run(self, view: Any, n_iters: int) -> None:
        """Record one token per request per iteration of the decode run, at end times
        accumulated with :func:`lpserve.cost.iteration_time` over contexts that grow by one token
        per iteration, then forward the view."""
        rep = int(view.replica[1])
        ctx = np.array(view.context, np.int64)
        t = float(view.now_s)
        req = view.request.tolist()
        for _ in range(int(n_iters)):
            t += float(iteration_time(view.cost_params, _EMPTY, _EMPTY, ctx))
            ctx += 1
            self.events.extend((t, rep, int(i), 1) for i in req)
        if self.inner is not None:
            self.inner.observe_decode_run(view, n_iters)


def with_service_recorder(policy: Policy) -> tuple[Policy, ServiceRecorder]:
    """A copy of ``policy`` whose budget controller is a :class:`ServiceRecorder` around
    the original one, and that recorder. A scheduler that is also the controller (VTC)
    keeps being told every iteration."""
    rec = ServiceRecorder(policy.engine.budget_controller)
    eng = replace(policy.engine, budget_controller=rec)
    return policy.with_(engine=eng, meta=policy.meta), rec


def _points(times: np.ndarray, kinds: np.ndarray, lo: float, hi: float,
            reading: str) -> np.ndarray:
    """Event counts (prefixes of the sorted events) at which the service is read within
    the joint backlog ``[lo, hi]``: ``"start"``: at ``lo``, before the admissions at each
    event time in ``[lo, hi]`` and after every event at each event time in ``[lo, hi)``
    (every value the service takes at an instant of ``[lo, hi]``); ``"end"``: after every
    event at each event time in ``[lo, hi]``."""
    k0 = int(np.searchsorted(times, lo, side="left"))
    k1 = int(np.searchsorted(times, hi, side="right"))
    inside = np.unique(times[k0:k1])
    after = np.searchsorted(times, inside, side="right")
    if reading == "end":
        return after
    left = np.searchsorted(times, inside, side="left")
    tokens = np.array([int(np.count_nonzero(kinds[a:b] == 0)) for a, b in zip(left, after)],
                      np.int64)
    at_lo = [k0] if not inside.size or inside[0] > lo else []  # no event at lo itself
    return np.r_[at_lo, left + tokens, after[inside < hi]].astype(np.int64)


def _intervals(lo: np.ndarray, hi: np.ndarray) -> list[tuple[float, float]]:
    """Union of closed intervals ``[lo_k, hi_k]`` as sorted disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted(zip(lo.tolist(), hi.tolist())):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]):
    i = j = 0
    out = []
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a <= b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def max_service_difference(result: Any, recorder: ServiceRecorder, *,
                           input_price: float = 1.0, output_price: float = 2.0,
                           weights: Mapping[int, float] | None = None,
                           reading: str = "start") -> dict[str, Any]:
    """Largest change of the (weighted) service difference of two tenants over an
    interval in which both were backlogged on the same replica (see the module docstring).

    ``reading`` says what the service at an instant ``t`` counts: ``"start"`` (what
    ``proofs/fairness-vtc.md`` bounds) the tokens produced by ``t`` and the prompts
    admitted before ``t``, i.e. before the admissions of a decision at ``t``, at every
    instant of the joint backlog; ``"end"`` also the prompts admitted at ``t``, at the
    service events' times only (the statement the named counterexample breaks).

    Returns ``{"max": value, "pair": (replica, f, g) or None, "by_pair": {(replica, f, g):
    value}}``; raises ValueError if a request was preempted or the recorded tokens do not
    add up to the tokens each request generated.
    """
    if reading not in ("start", "end"):
        raise ValueError(f"max_service_difference: reading must be 'start' or 'end', got "
                         f"{reading!r}")
    a = result.arrays
    if int(np.sum(a["preemptions"])):
        raise ValueError("max_service_difference: requests were preempted, so their waiting "
                         "intervals are not [arrival, first scheduled]")
    w = {int(k): float(v) for k, v in dict(weights or {}).items()}
    n = a["request"].shape[0]
    tokens = np.zeros(n, np.int64)
    for _, _, i, k in recorder.events:
        tokens[i] += k
    if not np.array_equal(tokens, a["generated_tokens"]):
        bad = int(np.flatnonzero(tokens != a["generated_tokens"])[0])
        raise ValueError(f"max_service_difference: the recorder saw {tokens[bad]} tokens of "
                         f"request {bad}, the run generated {a['generated_tokens'][bad]}")
    tenant = a["tenant"]
    rep = a["replica"]
    start = a["first_scheduled_s"]
    # service events per replica: (time, kind, tenant, weighted amount); at one time the
    # tokens (kind 0: the iteration that ended then) come before the admissions (kind 1:
    # the decision made then)
    ev: dict[int, list[tuple[float, int, int, float]]] = {}
    for i in np.flatnonzero(np.isfinite(start)).tolist():
        t = int(tenant[i])
        ev.setdefault(int(rep[i]), []).append(
            (float(start[i]), 1, t, input_price * float(a["prompt_tokens"][i]) / w.get(t, 1.0)))
    for end, r, i, k in recorder.events:
        t = int(tenant[i])
        ev.setdefault(r, []).append((end, 0, t, output_price * k / w.get(t, 1.0)))
    by_pair: dict[tuple[int, int, int], float] = {}
    horizon = float(np.nanmax(np.r_[a["finish_s"], a["arrival_s"]]))
    for r in sorted(set(rep[rep >= 0].tolist())):
        on = rep == r
        events = sorted(ev.get(r, []))
        times = np.array([e[0] for e in events])
        kinds = np.array([e[1] for e in events], np.int64)
        ten_ids = sorted(set(tenant[on].tolist()))
        back = {}
        for f in ten_ids:
            m = on & (tenant == f)
            hi = np.where(np.isfinite(start[m]), start[m], horizon)
            back[f] = _intervals(a["arrival_s"][m], hi)
        cum = {}
        for f in ten_ids:
            amt = np.array([e[3] if e[2] == f else 0.0 for e in events])
            cum[f] = np.r_[0.0, np.cumsum(amt)]  # cum[f][k]: the first k events
        for x, f in enumerate(ten_ids):
            for g in ten_ids[x + 1:]:
                best = 0.0
                diff = cum[f] - cum[g]
                for lo, hi in _intersect(back[f], back[g]):
                    d = diff[_points(times, kinds, lo, hi, reading)]
                    if d.size:
                        best = max(best, float(d.max() - d.min()))
                by_pair[(r, f, g)] = best
    if not by_pair:
        return {"max": 0.0, "pair": None, "by_pair": {}}
    pair = max(by_pair, key=by_pair.get)
    return {"max": by_pair[pair], "pair": pair, "by_pair": by_pair}
