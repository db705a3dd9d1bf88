"""Agentic sessions on their own clocks, and the composer that puts them on a common one
(layer 0: numpy only).

A :class:`Sessions` holds many sessions (e.g. the kv-cache-tester Claude Code sessions read
by :func:`lpserve.trace.loaders.read_sessions`), each with its requests' times since the
session's first request, token counts, prefix-block ids (unique per session: two sessions
never share a block), why the client waits after each response (``Trace.wait_kind``) and
which agent of the session sent it (0 the main agent, ``k >= 1`` its ``k``-th sub-agent,
whose requests are on the main agent's clock).

Real sessions carry no common clock. :func:`compose` makes a workload from them: a start
time per session (a seeded Poisson process of session starts, a fixed number of
concurrent sessions, or given times), each session keeping its own gaps.
:func:`split` divides sessions into a part to fit parameters on and a held-out part to
report on.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from lpserve.arrays import readonly
from lpserve.trace import LoadReport, Trace, TraceError
from lpserve.trace.csr import take_blocks

__all__ = ["Sessions", "compose", "split"]


@dataclass(frozen=True, eq=False)
class Sessions:
    """``S`` sessions with ``N`` requests in all, as read-only arrays.

    Attributes:
        offsets: int64 (S+1,): session ``s`` owns requests ``offsets[s]:offsets[s+1]``,
            sorted by ``t_s``.
        t_s: float64 (N,): seconds since the session's first request.
        prompt_tokens, output_tokens: int64 (N,), >= 1.
        block_flat, block_offsets: prefix-block ids in CSR layout (one id per full block of
            ``block_tokens`` tokens), unique across sessions.
        block_tokens: tokens per block.
        wait_kind: int64 (N,): ``Trace.wait_kind`` codes (tool call, user turn, -1 unknown).
        agent: int64 (N,): 0 for the main agent, ``k`` for the session's ``k``-th sub-agent.
        side: bool (N,): a side request (title, summary, ...), not a step of the agent loop.
        prev: int64 (N,): the request this one follows (the same agent's previous request;
            for a sub-agent's first request, the latest request of its parent agent at or
            before it), -1 for none.
        names: the sessions' ids in the source (S,).
        report: what the reader read and dropped.
    """

    offsets: np.ndarray
    t_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    block_flat: np.ndarray
    block_offsets: np.ndarray
    block_tokens: int
    wait_kind: np.ndarray
    agent: np.ndarray
    side: np.ndarray
    prev: np.ndarray
    names: tuple[str, ...]
    report: LoadReport = field(default_factory=LoadReport)

    def __post_init__(self) -> None:
        src = self.report.source or "sessions"
        S, N = len(self.names), int(self.t_s.shape[0])
        if self.offsets.shape != (S + 1,) or self.offsets[0] != 0 or self.offsets[-1] != N \
                or np.any(np.diff(self.offsets) < 1):
            raise TraceError(f"{src}: session offsets do not partition {N} requests into "
                             f"{S} non-empty sessions")
        for k in ("prompt_tokens", "output_tokens", "wait_kind", "agent", "side", "prev",
                  "block_offsets"):
            want = N + 1 if k == "block_offsets" else N
            if getattr(self, k).shape != (want,):
                raise TraceError(f"{src}: field {k!r} has shape {getattr(self, k).shape}, "
                                 f"expected ({want},)")
        local = np.diff(self.t_s)
        local[self.offsets[1:-1] - 1] = 0.0  # session boundaries
        if np.any(local < 0):
            i = int(np.flatnonzero(local < 0)[0]) + 1
            raise TraceError(f"{src}: request {i} is earlier than the one before it in its "
                             "session")
        for f in ("offsets", "t_s", "prompt_tokens", "output_tokens", "block_flat",
                  "block_offsets", "wait_kind", "agent", "side", "prev"):
            object.__setattr__(self, f, readonly(getattr(self, f)))

    @property
    def n_sessions(self) -> int:
        """Number of sessions S."""
        return len(self.names)

    @property
    def n_requests(self) -> int:
        """Number of requests N over all sessions (sub-agents flattened in)."""
        return int(self.t_s.shape[0])

    @property
    def session(self) -> np.ndarray:
        """Session index of every request, int64 (N,)."""
        return np.repeat(np.arange(self.n_sessions), np.diff(self.offsets))

    @property
    def span_s(self) -> np.ndarray:
        """Time from each session's first to its last request, float64 (S,)."""
        return self.t_s[self.offsets[1:] - 1] - self.t_s[self.offsets[:-1]]

    @property
    def n_blocks(self) -> int:
        """Number of prefix-block ids over all requests (length of ``block_flat``)."""
        return int(self.block_flat.shape[0])

    def take(self, idx: Sequence[int] | np.ndarray) -> "Sessions":
        """The sessions at indices ``idx`` (distinct, in the given order)."""
        idx = np.asarray(idx, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_sessions):
            raise TraceError(f"take: session index out of range 0..{self.n_sessions - 1}")
        if np.unique(idx).size != idx.size:
            raise TraceError("take: session indices must be distinct (a session used twice "
                             "would share its blocks with itself)")
        lengths = np.diff(self.offsets)[idx]
        offs = np.zeros(idx.size + 1, np.int64)
        np.cumsum(lengths, out=offs[1:])
        req = np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1]) for s in idx]) \
            if idx.size else np.zeros(0, np.int64)
        newpos = np.full(self.n_requests, -1, np.int64)
        newpos[req] = np.arange(req.size)
        prev = self.prev[req]
        flat, boffs = take_blocks(self.block_flat, self.block_offsets, req)
        return Sessions(
            offsets=offs, t_s=self.t_s[req], prompt_tokens=self.prompt_tokens[req],
            output_tokens=self.output_tokens[req], block_flat=flat, block_offsets=boffs,
            block_tokens=self.block_tokens, wait_kind=self.wait_kind[req],
            agent=self.agent[req], side=self.side[req],
            prev=np.where(prev >= 0, newpos[np.clip(prev, 0, None)], -1),
            names=tuple(self.names[s] for s in idx.tolist()),
            report=replace(self.report, n_kept=int(req.size)))


def split(sessions: Sessions, held_out: float = 0.5, *, seed: int = 0
          ) -> tuple[Sessions, Sessions]:
    """``(fit, held_out)``: a seeded random partition of the sessions, ``held_out`` of
    them (rounded, at least one each) in the second part. Fit parameters on the first part
    and report on the second."""
    S = sessions.n_sessions
    if not (0.0 < held_out < 1.0) or S < 2:
        raise TraceError(f"split: held_out must be in (0, 1) and there must be >= 2 "
                         f"sessions, got {held_out!r} and {S}")
    perm = np.random.default_rng(seed).permutation(S)
    k = min(max(int(round(held_out * S)), 1), S - 1)
    return sessions.take(np.sort(perm[k:])), sessions.take(np.sort(perm[:k]))


def _starts(span: np.ndarray, rate_per_s: float | None, concurrent: int | None,
            start_s: Any, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    S = span.size
    given = [x is not None for x in (rate_per_s, concurrent, start_s)]
    if sum(given) > 1:
        raise TraceError("compose: give at most one of rate_per_s, concurrent, start_s")
    if rate_per_s is not None:
        if not (isinstance(rate_per_s, (int, float)) and np.isfinite(rate_per_s)
                and rate_per_s > 0):
            raise TraceError(f"compose: rate_per_s must be a finite number > 0, got "
                             f"{rate_per_s!r}")
        st = np.cumsum(rng.exponential(1.0 / rate_per_s, size=S))
        return st - st[0], f"Poisson session starts at {rate_per_s:g}/s"
    if concurrent is not None:
        if isinstance(concurrent, bool) or not isinstance(concurrent, (int, np.integer)) \
                or concurrent < 1:
            raise TraceError(f"compose: concurrent must be an integer >= 1, got "
                             f"{concurrent!r}")
        # closed population: each of `concurrent` slots starts its next session when its
        # current session sends its last request
        free = np.zeros(int(concurrent))
        st = np.empty(S)
        for s in range(S):
            k = int(np.argmin(free))
            st[s] = free[k]
            free[k] += span[s]
        return st, f"{int(concurrent)} concurrent sessions"
    if start_s is not None:
        st = np.asarray(start_s, np.float64)
        if st.shape != (S,) or not np.all(np.isfinite(st)) or np.any(st < 0):
            raise TraceError(f"compose: start_s must be {S} finite times >= 0, got shape "
                             f"{st.shape}")
        return st, "given session starts"
    return np.zeros(S), "every session starts at 0"


def compose(sessions: Sessions, *, rate_per_s: float | None = None,
            concurrent: int | None = None, start_s: Any = None, shuffle: bool = True,
            seed: int = 0, horizon_s: float | None = None, dependencies: bool = False,
            name: str = "sessions") -> Trace:
    """Put ``sessions`` on one clock: session ``s`` starts at ``start[s]`` and its request
    ``j`` arrives at ``start[s] + t_s[j]``.

    Args:
        sessions: the sessions to place (each at most once: their blocks stay distinct).
        rate_per_s: session starts form a Poisson process of this rate (the first at 0).
        concurrent: a closed population: this many slots, each starting its next session
            when its current one sends its last request (the first ones at 0).
        start_s: the start time of each session (S,), in the given order.
        shuffle: place the sessions in a seeded random order (else in the given order);
            ignored with ``start_s``.
        seed: seeds the order and the Poisson starts.
        horizon_s: keep only requests arriving before this time (the rest are counted in
            ``report.dropped``).
        dependencies: set ``Trace.parent`` to each request's ``prev`` (the simulator then
            releases a request only once the one it follows has finished).
        name: the trace's label.

    Returns a :class:`~lpserve.trace.Trace` with block ids, ``session_id`` (the session's
    index in ``sessions``), ``program_id`` (one per agent of a session) and
    ``wait_kind``. With none of ``rate_per_s``/``concurrent``/``start_s`` every session
    starts at 0.
    """
    rng = np.random.default_rng(seed)
    S = sessions.n_sessions
    order = rng.permutation(S) if shuffle and start_s is None else np.arange(S)
    st_ordered, how = _starts(sessions.span_s[order], rate_per_s, concurrent, start_s, rng)
    start = np.empty(S)
    start[order] = st_ordered
    sess = sessions.session
    arrival = start[sess] + sessions.t_s
    keep = np.ones(arrival.size, bool)
    dropped: dict[str, int] = {}
    if horizon_s is not None:
        if not (np.isfinite(horizon_s) and horizon_s > 0):
            raise TraceError(f"compose: horizon_s must be a finite number > 0, got "
                             f"{horizon_s!r}")
        keep = arrival < horizon_s
        dropped[f"arrives at or after horizon_s={horizon_s:g}"] = int((~keep).sum())
    idx = np.flatnonzero(keep)
    idx = idx[np.lexsort((idx, arrival[idx]))]  # by arrival, then session order
    if idx.size == 0:
        raise TraceError(f"compose: no request arrives before horizon_s={horizon_s!r}")
    newpos = np.full(arrival.size, -1, np.int64)
    newpos[idx] = np.arange(idx.size)
    prog_base = np.zeros(S + 1, np.int64)
    n_agents = np.zeros(S, np.int64)
    np.maximum.at(n_agents, sess, sessions.agent + 1)
    np.cumsum(n_agents, out=prog_base[1:])
    parent = None
    if dependencies:
        p = sessions.prev[idx]
        parent = np.where(p >= 0, newpos[np.clip(p, 0, None)], -1)
    flat, offs = take_blocks(sessions.block_flat, sessions.block_offsets, idx)
    rep = LoadReport(source=sessions.report.source or name,
                     format=sessions.report.format or "sessions",
                     n_read=sessions.report.n_read or sessions.n_requests,
                     dropped=tuple(sessions.report.dropped)
                     + tuple((k, v) for k, v in dropped.items() if v),
                     labels=tuple(sessions.report.labels) + (
                         ("composition", f"{S} sessions, {how}, seed {seed}"),))
    return Trace(arrival_s=arrival[idx], prompt_tokens=sessions.prompt_tokens[idx],
                 output_tokens=sessions.output_tokens[idx], block_flat=flat,
                 block_offsets=offs, block_tokens=sessions.block_tokens,
                 session_id=sess[idx], program_id=prog_base[sess[idx]] + sessions.agent[idx],
                 parent=parent, wait_kind=sessions.wait_kind[idx], name=name,
                 report=replace(rep, n_kept=int(idx.size)))
