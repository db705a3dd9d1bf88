"""Seeded, vectorized workload generators (layer 0: numpy only).

Arrival processes and length distributions are small frozen specs with a
``sample(n, rng)`` method, so a workload is data (it can live in a sweep's TOML) and
every run is reproducible from its seed:

>>> from lpserve import generate as g
>>> tr = g.synthetic(1000, arrivals=g.Poisson(rate_per_s=3.0),
...                  prompt=g.LogNormal(mean=1000, cv=1.0), output=g.Uniform(16, 512), seed=0)

Structured workloads build on top of it: :func:`with_shared_prefixes` (system prompts,
few-shot examples, RAG documents as nested prefix groups with block ids),
:func:`sessions` (multi-turn chats whose later turns extend earlier prompts) and
:func:`agentic_programs` (DAGs of calls with parent links).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from lpserve.trace import LoadReport, Trace, TraceError, pack_blocks


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise TraceError(msg)


def _pos(name: str, v: float) -> None:
    _check(isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v) and v > 0,
           f"{name} must be a finite number > 0, got {v!r}")


def _count(n: int) -> None:
    _check(isinstance(n, (int, np.integer)) and n >= 0, f"n must be an integer >= 0, got {n!r}")


# ============================================================================ arrivals
class ArrivalProcess(Protocol):
    """The arrival-process interface: a frozen spec whose ``sample(n, rng)`` returns
    ``n`` arrival times (float64 seconds, shape ``(n,)``, non-decreasing, the first at 0)."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` non-decreasing arrival times in seconds, the first at 0."""


def _from_gaps(gaps: np.ndarray) -> np.ndarray:
    t = np.cumsum(gaps)
    return t - t[0] if t.size else t


@dataclass(frozen=True)
class Poisson:
    """Poisson arrivals: i.i.d. exponential inter-arrival times of mean ``1/rate_per_s``."""

    rate_per_s: float

    def __post_init__(self) -> None:
        _pos("Poisson.rate_per_s", self.rate_per_s)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` arrival times in seconds, shape ``(n,)``, starting at 0: cumulative sums of
        exponential gaps of mean ``1 / rate_per_s``."""
        _count(n)
        return _from_gaps(rng.exponential(1.0 / self.rate_per_s, size=n))


@dataclass(frozen=True)
class GammaRenewal:
    """Bursty renewal arrivals: Gamma inter-arrival times with mean ``1/rate_per_s`` and
    coefficient of variation ``cv`` (``cv = 1`` is Poisson, ``cv > 1`` is burstier)."""

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        _pos("GammaRenewal.rate_per_s", self.rate_per_s)
        _pos("GammaRenewal.cv", self.cv)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` arrival times in seconds, shape ``(n,)``, starting at 0: cumulative sums of
        Gamma gaps with shape ``1 / cv**2`` and mean ``1 / rate_per_s``."""
        _count(n)
        shape = 1.0 / self.cv**2
        scale = 1.0 / (self.rate_per_s * shape)
        return _from_gaps(rng.gamma(shape, scale, size=n))


@dataclass(frozen=True)
class MMPP:
    """Markov-modulated Poisson process.

    A continuous-time Markov chain over states ``k`` with exponential dwell times of mean
    ``mean_dwell_s[k]``; on leaving a state the next one is drawn uniformly among the
    others. In state ``k`` requests arrive as Poisson at ``rates_per_s[k]``. The long-run
    rate is ``sum(rate_k * dwell_k) / sum(dwell_k)`` (:attr:`mean_rate_per_s`).
    """

    rates_per_s: tuple[float, ...]
    mean_dwell_s: tuple[float, ...]

    def __post_init__(self) -> None:
        _check(len(self.rates_per_s) >= 2 and len(self.rates_per_s) == len(self.mean_dwell_s),
               "MMPP needs >= 2 states and one mean dwell time per rate, got "
               f"rates {self.rates_per_s!r}, dwells {self.mean_dwell_s!r}")
        for r in self.rates_per_s:
            _check(math.isfinite(r) and r >= 0, f"MMPP.rates_per_s must be >= 0, got {r!r}")
        _check(max(self.rates_per_s) > 0, "MMPP.rates_per_s must have a positive rate")
        for d in self.mean_dwell_s:
            _pos("MMPP.mean_dwell_s", d)

    @property
    def mean_rate_per_s(self) -> float:
        """Long-run arrival rate in requests/s: the dwell-weighted mean of ``rates_per_s``."""
        r, d = np.asarray(self.rates_per_s), np.asarray(self.mean_dwell_s)
        return float((r * d).sum() / d.sum())

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` arrival times in seconds, shape ``(n,)``, starting at 0.

        The chain starts in a state drawn from its stationary law (proportional to the mean
        dwell times); state periods are drawn 64 at a time and each period gets a Poisson count
        of points placed uniformly inside it.
        """
        _count(n)
        k = len(self.rates_per_s)
        rates, dwell = np.asarray(self.rates_per_s), np.asarray(self.mean_dwell_s)
        out = np.empty(n)
        got, t = 0, 0.0
        state = int(rng.choice(k, p=dwell / dwell.sum()))  # stationary start
        while got < n:
            # draw a batch of state periods at once, then Poisson points inside each
            m = 64
            steps = rng.integers(1, k, size=m)
            states = (state + np.cumsum(np.r_[0, steps[:-1]])) % k
            lengths = rng.exponential(dwell[states])
            counts = rng.poisson(rates[states] * lengths)
            starts = t + np.r_[0.0, np.cumsum(lengths)[:-1]]
            total = int(counts.sum())
            pts = np.repeat(starts, counts) + rng.random(total) * np.repeat(lengths, counts)
            # sort within each period (periods are already in order)
            pts = np.sort(pts)
            take = min(total, n - got)
            out[got:got + take] = pts[:take]
            got += take
            t = starts[-1] + lengths[-1]
            state = int((states[-1] + steps[-1]) % k)
        return out - out[0] if n else out


# ============================================================================ lengths
class LengthDist(Protocol):
    """The length-distribution interface: a frozen spec whose ``sample(n, rng)``
    returns ``n`` token counts (int64, shape ``(n,)``, each >= 1)."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` token counts (int64, >= 1)."""


@dataclass(frozen=True)
class Constant:
    """Every request has exactly ``tokens`` tokens (an integer >= 1)."""

    tokens: int

    def __post_init__(self) -> None:
        _check(int(self.tokens) == self.tokens and self.tokens >= 1,
               f"Constant.tokens must be an integer >= 1, got {self.tokens!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` copies of ``tokens``, int64, shape ``(n,)`` (``rng`` is not used)."""
        return np.full(n, int(self.tokens), np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on ``[lo, hi]`` inclusive."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        _check(int(self.lo) == self.lo and self.lo >= 1 and int(self.hi) == self.hi
               and self.hi >= self.lo, f"Uniform needs integers 1 <= lo <= hi, got "
               f"lo={self.lo!r}, hi={self.hi!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` token counts drawn uniformly on ``[lo, hi]``, int64, shape ``(n,)``."""
        return rng.integers(int(self.lo), int(self.hi) + 1, size=n).astype(np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Log-normal token counts with the given ``mean`` and coefficient of variation ``cv``
    (before rounding to integers >= 1 and capping at ``max_tokens``, if given)."""

    mean: float
    cv: float
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        _pos("LogNormal.mean", self.mean)
        _pos("LogNormal.cv", self.cv)
        if self.max_tokens is not None:
            _check(self.max_tokens >= 1, f"LogNormal.max_tokens must be >= 1, got "
                   f"{self.max_tokens!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` token counts, int64, shape ``(n,)``: log-normal draws with the spec's mean
        and cv, rounded to the nearest integer, at least 1 and at most ``max_tokens``."""
        s2 = math.log1p(self.cv**2)
        mu = math.log(self.mean) - s2 / 2
        x = np.maximum(1, np.rint(rng.lognormal(mu, math.sqrt(s2), size=n)))
        if self.max_tokens is not None:
            x = np.minimum(x, self.max_tokens)
        return x.astype(np.int64)


@dataclass(frozen=True)
class Zipf:
    """Zipf-distributed token counts: ``P(k) ∝ k^-a`` on ``1..max_tokens``."""

    a: float
    max_tokens: int

    def __post_init__(self) -> None:
        _pos("Zipf.a", self.a)
        _check(int(self.max_tokens) == self.max_tokens and self.max_tokens >= 1,
               f"Zipf.max_tokens must be an integer >= 1, got {self.max_tokens!r}")

    def probabilities(self) -> np.ndarray:
        """``P(k)`` for ``k = 1..max_tokens``, float64, shape ``(max_tokens,)``, summing to 1."""
        w = np.arange(1, int(self.max_tokens) + 1, dtype=np.float64) ** -float(self.a)
        return w / w.sum()

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` token counts in ``1..max_tokens`` drawn with :meth:`probabilities`, int64,
        shape ``(n,)``."""
        p = self.probabilities()
        return (rng.choice(p.size, size=n, p=p) + 1).astype(np.int64)


@dataclass(frozen=True)
class Empirical:
    """Resample observed token counts (e.g. ``Empirical(trace.prompt_tokens)``)."""

    values: tuple[int, ...] | np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        v = np.asarray(self.values)
        _check(v.ndim == 1 and v.size > 0, "Empirical needs a non-empty 1-D array of counts")
        _check(bool(np.all(v >= 1)), "Empirical token counts must all be >= 1")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` token counts drawn uniformly with replacement from ``values``, int64,
        shape ``(n,)``."""
        v = np.asarray(self.values, dtype=np.int64)
        return v[rng.integers(0, v.size, size=n)]


@dataclass(frozen=True)
class EmpiricalJoint:
    """Resample (prompt, output) pairs jointly from observed requests, keeping their
    correlation (the seed benchmarks resample ShareGPT's and the Azure traces' pairs)."""

    prompt_tokens: np.ndarray = field(repr=False)
    output_tokens: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        p, o = np.asarray(self.prompt_tokens), np.asarray(self.output_tokens)
        _check(p.ndim == 1 and p.size > 0 and p.shape == o.shape,
               "EmpiricalJoint needs two non-empty 1-D arrays of equal length")
        _check(bool(np.all(p >= 1) and np.all(o >= 1)),
               "EmpiricalJoint token counts must all be >= 1")

    @classmethod
    def from_trace(cls, trace: Trace) -> "EmpiricalJoint":
        """The (prompt, output) pairs of ``trace``; :class:`TraceError` when it is empty."""
        _check(len(trace) > 0, f"{trace.name}: cannot resample lengths from an empty trace")
        return cls(trace.prompt_tokens, trace.output_tokens)

    def sample_pairs(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(prompt_tokens, output_tokens)``, each int64 of shape ``(n,)``: ``n`` pairs
        drawn uniformly with replacement."""
        i = rng.integers(0, len(self.prompt_tokens), size=n)
        return (np.asarray(self.prompt_tokens, np.int64)[i],
                np.asarray(self.output_tokens, np.int64)[i])


@dataclass(frozen=True)
class TotalSplit:
    """Total tokens from ``total`` split into prefill and decode at a fixed ratio
    ``prefill_to_decode`` (e.g. Vidur's synthetic workload: total ~ U[512, 2048], 3:1)."""

    total: LengthDist
    prefill_to_decode: float

    def __post_init__(self) -> None:
        _pos("TotalSplit.prefill_to_decode", self.prefill_to_decode)

    def sample_pairs(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(prompt_tokens, output_tokens)``, each int64 of shape ``(n,)``.

        A total ``T >= 2`` is drawn from ``total``; decode gets ``round(T / (1 +
        prefill_to_decode))`` tokens, clipped to ``[1, T - 1]``, and prefill the rest, so both
        parts are >= 1 and they sum to ``T``. Raises :class:`TraceError` on a total below 2.
        """
        tot = self.total.sample(n, rng)
        _check(bool(np.all(tot >= 2)), "TotalSplit needs totals >= 2 tokens")
        decode = np.maximum(1, np.rint(tot / (1.0 + self.prefill_to_decode))).astype(np.int64)
        decode = np.minimum(decode, tot - 1)
        return tot - decode, decode


# ============================================================================ synthetic
def synthetic(n_requests: int, *, arrivals: ArrivalProcess,
              prompt: LengthDist | None = None, output: LengthDist | None = None,
              lengths: EmpiricalJoint | TotalSplit | None = None, seed: int = 0,
              name: str = "synthetic") -> Trace:
    """``n_requests`` requests with the given arrival process and lengths.

    Give either ``prompt`` and ``output`` (independent) or ``lengths`` (joint).
    """
    _count(n_requests)
    _check((lengths is None) == (prompt is not None and output is not None),
           "synthetic: give prompt and output distributions, or a joint `lengths`, not both")
    rng = np.random.default_rng(seed)
    arrival = arrivals.sample(n_requests, rng)
    if lengths is not None:
        p, o = lengths.sample_pairs(n_requests, rng)
    else:
        p, o = prompt.sample(n_requests, rng), output.sample(n_requests, rng)
    rep = LoadReport(source=f"{name}(seed={seed})", format="generated", n_read=n_requests,
                     n_kept=n_requests)
    return Trace(arrival_s=arrival, prompt_tokens=p, output_tokens=o, name=name, report=rep)


def with_arrivals(trace: Trace, arrivals: ArrivalProcess, seed: int = 0) -> Trace:
    """The same requests (in order) with new arrival times from ``arrivals``."""
    rng = np.random.default_rng(seed)
    c = {k: getattr(trace, k) for k in ("prompt_tokens", "output_tokens", "block_flat",
                                         "block_offsets", "block_tokens", "session_id",
                                         "program_id", "parent", "tenant", "predicted_lo",
                                         "predicted_hi", "wait_kind", "name", "report")}
    return Trace(arrival_s=arrivals.sample(len(trace), rng), **c)


# ============================================================================ prefixes
@dataclass(frozen=True)
class PrefixLevel:
    """One level of nested shared prefixes (e.g. system prompt, then few-shot set, then RAG
    document): ``n_choices`` alternatives of ``tokens`` tokens each, picked with Zipf(``zipf_a``)
    popularity (``zipf_a = 0`` is uniform). Choices are nested: a level-2 choice under
    system prompt A is a different prefix from the same index under B."""

    n_choices: int
    tokens: int
    zipf_a: float = 1.0

    def __post_init__(self) -> None:
        _check(self.n_choices >= 1 and self.tokens >= 1,
               f"PrefixLevel needs n_choices >= 1 and tokens >= 1, got {self!r}")
        _check(self.zipf_a >= 0, f"PrefixLevel.zipf_a must be >= 0, got {self.zipf_a!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` choice indices in ``[0, n_choices)``, shape ``(n,)``, with popularity
        ``P(j) ∝ (j + 1)^-zipf_a`` (index 0 is the most popular)."""
        w = np.arange(1, self.n_choices + 1, dtype=np.float64) ** -float(self.zipf_a)
        return rng.choice(self.n_choices, size=n, p=w / w.sum())


class _BlockIds:
    """Assigns block ids: equal token content (a key) -> equal id, fresh ids otherwise."""

    def __init__(self) -> None:
        self._ids: dict[object, int] = {}

    def get(self, key: object) -> int:
        i = self._ids.get(key)
        if i is None:
            i = self._ids[key] = len(self._ids)
        return i

    def fresh(self) -> int:
        return self.get(("fresh", len(self._ids)))


def with_shared_prefixes(trace: Trace, levels: Sequence[PrefixLevel], *, share: float = 1.0,
                         block_tokens: int = 16, seed: int = 0) -> Trace:
    """Prepend nested shared prefixes to a share of the requests and give every request
    prefix-block ids.

    Request ``i`` chosen (with probability ``share``) gets one choice per level; its prompt
    becomes ``sum(level tokens) + prompt_tokens[i]`` tokens. Full blocks lying entirely in
    the shared prefix get ids shared with every request on the same path; all other blocks
    (including a block straddling the end of the prefix) get fresh ids, as a content hash
    would. ``tenant`` is set to the index of the first-level choice (-1 without prefix).
    """
    _check(0.0 <= share <= 1.0, f"share must be in [0, 1], got {share!r}")
    _check(block_tokens >= 1, f"block_tokens must be >= 1, got {block_tokens!r}")
    _check(len(levels) >= 1, "with_shared_prefixes needs at least one PrefixLevel")
    rng = np.random.default_rng(seed)
    n = len(trace)
    has = rng.random(n) < share
    picks = np.stack([lv.sample(n, rng) for lv in levels], axis=1)
    level_tokens = np.array([lv.tokens for lv in levels], np.int64)
    prefix = np.where(has, level_tokens.sum(), 0)
    prompt = trace.prompt_tokens + prefix
    ids = _BlockIds()
    bounds = np.cumsum(level_tokens)
    blocks: list[list[int]] = []
    for i in range(n):
        nb = -(-int(prompt[i]) // block_tokens)
        row: list[int] = []
        if has[i]:
            path = tuple(picks[i].tolist())
            full_shared = int(prefix[i]) // block_tokens
            for j in range(full_shared):
                # the block's content is determined by the levels it overlaps
                last_level = int(np.searchsorted(bounds, (j + 1) * block_tokens, "left"))
                row.append(ids.get((path[:last_level + 1], j)))
        row.extend(ids.fresh() for _ in range(nb - len(row)))
        blocks.append(row)
    flat, offs = pack_blocks(blocks, n)
    c = {k: getattr(trace, k) for k in ("arrival_s", "output_tokens", "session_id",
                                         "program_id", "parent", "predicted_lo",
                                         "predicted_hi", "wait_kind", "report")}
    return Trace(prompt_tokens=prompt, block_flat=flat, block_offsets=offs,
                 block_tokens=block_tokens, tenant=np.where(has, picks[:, 0], -1),
                 name=f"{trace.name}+prefixes", **c)


# ============================================================================ sessions
def sessions(n_sessions: int, *, session_arrivals: ArrivalProcess, turns: LengthDist,
             first_prompt: LengthDist, turn_prompt: LengthDist, output: LengthDist,
             think_time_s: float, block_tokens: int = 16, seed: int = 0,
             name: str = "sessions") -> Trace:
    """Multi-turn chat sessions whose later turns re-send the whole history.

    Session ``s`` starts at a time drawn from ``session_arrivals`` and has ``turns`` turns.
    Turn ``k`` arrives an exponential think time (mean ``think_time_s``) after turn ``k-1``
    and its prompt is the previous prompt + the previous output + ``turn_prompt`` new
    tokens. Block ids follow the token stream of the session: a full block of the stream
    has the same id in every turn that contains it; a partial last block gets a fresh id.
    """
    _count(n_sessions)
    _pos("think_time_s", think_time_s)
    _check(block_tokens >= 1, f"block_tokens must be >= 1, got {block_tokens!r}")
    rng = np.random.default_rng(seed)
    starts = session_arrivals.sample(n_sessions, rng)
    n_turns = turns.sample(n_sessions, rng)
    total = int(n_turns.sum())
    sess = np.repeat(np.arange(n_sessions), n_turns)
    first = np.r_[0, np.cumsum(n_turns)[:-1]]
    is_first = np.zeros(total, bool)
    is_first[first] = True
    new_tokens = np.where(is_first, first_prompt.sample(total, rng), turn_prompt.sample(total, rng))
    out = output.sample(total, rng)
    gaps = np.where(is_first, 0.0, rng.exponential(think_time_s, size=total))
    arrival = np.empty(total)
    prompt = np.empty(total, np.int64)
    ids = _BlockIds()
    blocks: list[list[int]] = []
    for i in range(total):
        if is_first[i]:
            arrival[i] = starts[sess[i]]
            prompt[i] = new_tokens[i]
        else:
            arrival[i] = arrival[i - 1] + gaps[i]
            prompt[i] = prompt[i - 1] + out[i - 1] + new_tokens[i]
        full = int(prompt[i]) // block_tokens
        row = [ids.get((int(sess[i]), j)) for j in range(full)]
        if prompt[i] % block_tokens:
            row.append(ids.fresh())
        blocks.append(row)
    rep = LoadReport(source=f"{name}(seed={seed})", format="generated", n_read=total,
                     n_kept=total)
    return Trace.from_columns(name=name, arrival_s=arrival, packed=pack_blocks(blocks, total),
                           sort=True, report=rep, prompt_tokens=prompt, output_tokens=out,
                           block_tokens=block_tokens, session_id=sess)


# ============================================================================ programs
def agentic_programs(n_programs: int, *, program_arrivals: ArrivalProcess, stages: LengthDist,
                     fanout: LengthDist, prompt: LengthDist, output: LengthDist,
                     seed: int = 0, name: str = "programs") -> Trace:
    """Agentic programs as DAGs of LLM calls with parent links.

    Program ``p`` starts at a time from ``program_arrivals`` with one root call; each of
    its ``stages - 1`` later stages has ``fanout`` calls, each depending on a call drawn
    uniformly from the previous stage (``parent``). A call's ``arrival_s`` is its program's
    start plus a tiny stage offset (1 µs per stage) that keeps parents first; an engine
    that honours dependencies releases a call only when its parent has finished.
    ``program_id`` is ``p``.
    """
    _count(n_programs)
    rng = np.random.default_rng(seed)
    starts = program_arrivals.sample(n_programs, rng)
    n_stages = stages.sample(n_programs, rng)
    arrival: list[float] = []
    prog: list[int] = []
    parent: list[int] = []
    for p in range(n_programs):
        prev = [len(arrival)]
        arrival.append(starts[p])
        prog.append(p)
        parent.append(-1)
        for k in range(1, int(n_stages[p])):
            width = int(fanout.sample(1, rng)[0])
            cur = []
            for par in rng.choice(prev, size=width):
                cur.append(len(arrival))
                arrival.append(starts[p] + 1e-6 * k)
                prog.append(p)
                parent.append(int(par))
            prev = cur
    total = len(arrival)
    rep = LoadReport(source=f"{name}(seed={seed})", format="generated", n_read=total,
                     n_kept=total)
    return Trace.from_columns(name=name, arrival_s=np.asarray(arrival), packed=None, sort=True,
                           report=rep, parent=np.asarray(parent, np.int64),
                           prompt_tokens=prompt.sample(total, rng),
                           output_tokens=output.sample(total, rng),
                           program_id=np.asarray(prog, np.int64))
