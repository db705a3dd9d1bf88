"""Request traces as read-only structures of arrays (layer 0: numpy only).

A :class:`Trace` holds ``n`` requests sorted by arrival. Every per-request field is a
1-D numpy array of length ``n`` (made read-only); optional fields are ``None`` when the
source has no such information. Prefix-block ids are ragged and stored as a flat array
plus offsets (CSR layout), as Mooncake's ``hash_ids``.

Records exist only at the edges: loaders (:mod:`lpserve.trace.loaders`) and generators
(:mod:`lpserve.trace.generate`) build traces from files and distributions; everything else
works on the arrays.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Sequence

import numpy as np

from lpserve.arrays import readonly
from lpserve.trace.columns import (
    MAX_COUNT,
    MAX_TIME_S,
    TraceError,
    float_column,
    int_column,
    pack_blocks,
)
from lpserve.trace.csr import infinite_prefix_hits, take_blocks

_NONE = -1  # "no value" marker in optional integer id columns (session, program, parent, tenant)
#: codes of ``Trace.wait_kind``: what the client does after the response (-1: not known)
WAIT_TOOL, WAIT_USER = 0, 1
WAIT_NAMES = ("tool", "user")


@dataclass(frozen=True)
class LoadReport:
    """What a loader read and what it had to do to it.

    Attributes:
        source: file path or generator description.
        format: detected or requested format name.
        n_read: data rows read from the source.
        n_kept: rows in the resulting trace.
        dropped: reason -> number of rows dropped (nothing is dropped silently).
        n_reordered: rows that were out of arrival order and got sorted (only with
            ``sort=True``; otherwise out-of-order input is an error).
    """

    source: str = ""
    format: str = ""
    n_read: int = 0
    n_kept: int = 0
    dropped: tuple[tuple[str, int], ...] = ()
    n_reordered: int = 0
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def n_dropped(self) -> int:
        """Rows dropped in total (the sum over the reasons in ``dropped``)."""
        return sum(c for _, c in self.dropped)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every field, ``dropped`` as ``{reason: rows}``, ``labels``
        as ``"key: value"`` strings, plus ``n_dropped``."""
        return {
            "source": self.source, "format": self.format, "n_read": self.n_read,
            "n_kept": self.n_kept, "dropped": dict(self.dropped),
            "n_dropped": self.n_dropped, "n_reordered": self.n_reordered,
            "labels": [f"{k}: {v}" for k, v in self.labels],
        }


@dataclass(frozen=True, eq=False)
class Trace:
    """``n`` LLM requests sorted by arrival, as read-only numpy arrays.

    Required fields (shape ``(n,)``):
        arrival_s: arrival time in seconds (float64, non-decreasing).
        prompt_tokens: prompt length in tokens (int64, >= 1).
        output_tokens: output length in tokens (int64, >= 1).

    Optional fields (``None`` when the source has none; ``-1`` marks a missing value
    inside an id column):
        block_flat, block_offsets: prefix-block ids in CSR layout (see :func:`pack_blocks`);
            request ``i``'s blocks cover its prompt in chunks of ``block_tokens`` tokens and
            two requests share KV exactly for their common leading run of ids.
        session_id: multi-turn conversation id (int64).
        program_id: agentic program id (int64).
        parent: index (into this trace) of the call this request depends on, or -1.
        tenant: tenant / class id (int64).
        wait_kind: why the client waits after this response before its next request (int64
            codes: ``WAIT_TOOL`` = 0, the response is a tool call the client runs;
            ``WAIT_USER`` = 1, the turn ended and the user writes the next one; -1 unknown).
        predicted_lo, predicted_hi: predicted output-length interval ``[lo, hi]`` in tokens.

    Other attributes:
        block_tokens: tokens per prefix block (e.g. 512 for Mooncake), 0 without blocks.
        name: a short label for reports.
        report: the :class:`LoadReport` of the loader or generator that made it.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    block_flat: np.ndarray | None = None
    block_offsets: np.ndarray | None = None
    block_tokens: int = 0
    session_id: np.ndarray | None = None
    program_id: np.ndarray | None = None
    parent: np.ndarray | None = None
    tenant: np.ndarray | None = None
    predicted_lo: np.ndarray | None = None
    predicted_hi: np.ndarray | None = None
    wait_kind: np.ndarray | None = None
    name: str = "trace"
    report: LoadReport = field(default_factory=LoadReport)

    # ------------------------------------------------------------------ construction
    def __post_init__(self) -> None:
        src = self.report.source or self.name
        arr = float_column("arrival_s", self.arrival_s, None, source=src, limit=MAX_TIME_S)
        n = arr.shape[0]
        if n and np.any(np.diff(arr) < 0):
            i = int(np.flatnonzero(np.diff(arr) < 0)[0]) + 1
            raise TraceError(
                f"{src}: field 'arrival_s' is out of order at row {i} "
                f"({arr[i].item()!r} < {arr[i - 1]!r}); sort it first"
            )
        cols: dict[str, Any] = {
            "arrival_s": arr,
            "prompt_tokens": int_column("prompt_tokens", self.prompt_tokens, n, source=src,
                                         minimum=1, maximum=MAX_COUNT - 1),
            "output_tokens": int_column("output_tokens", self.output_tokens, n, source=src,
                                         minimum=1, maximum=MAX_COUNT - 1),
        }
        for name in ("session_id", "program_id", "tenant"):
            v = getattr(self, name)
            if v is not None:
                cols[name] = int_column(name, v, n, source=src, minimum=_NONE)
        if self.wait_kind is not None:
            w = int_column("wait_kind", self.wait_kind, n, source=src, minimum=_NONE)
            if np.any(w >= len(WAIT_NAMES)):
                i = int(np.flatnonzero(w >= len(WAIT_NAMES))[0])
                raise TraceError(f"{src}: field 'wait_kind' row {i} is {w[i]}, not a code of "
                                 f"{dict(enumerate(WAIT_NAMES))} or -1")
            cols["wait_kind"] = w
        if self.parent is not None:
            par = int_column("parent", self.parent, n, source=src, minimum=_NONE)
            bad = par >= np.arange(n)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise TraceError(
                    f"{src}: field 'parent' row {i} must point to an earlier request, "
                    f"got {par[i]}"
                )
            cols["parent"] = par
        if (self.predicted_lo is None) != (self.predicted_hi is None):
            raise TraceError(f"{src}: give both predicted_lo and predicted_hi, or neither")
        if self.predicted_lo is not None:
            lo = int_column("predicted_lo", self.predicted_lo, n, source=src, minimum=1,
                            maximum=MAX_COUNT - 1)
            hi = int_column("predicted_hi", self.predicted_hi, n, source=src, minimum=1,
                            maximum=MAX_COUNT - 1)
            bad = lo > hi
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise TraceError(
                    f"{src}: predicted interval row {i} has lo {lo[i]} > hi {hi[i]}"
                )
            cols["predicted_lo"], cols["predicted_hi"] = lo, hi
        if (self.block_flat is None) != (self.block_offsets is None):
            raise TraceError(f"{src}: give both block_flat and block_offsets, or neither")
        if self.block_flat is not None:
            flat = int_column("block_flat", self.block_flat, None, source=src, minimum=0)
            offs = int_column("block_offsets", self.block_offsets, n + 1, source=src,
                               minimum=0)
            if offs[0] != 0 or offs[-1] != flat.shape[0] or np.any(np.diff(offs) < 0):
                raise TraceError(f"{src}: block_offsets is not a valid CSR offset array")
            if not isinstance(self.block_tokens, (int, np.integer)) or self.block_tokens < 1:
                raise TraceError(
                    f"{src}: block_tokens must be a positive integer when block ids are "
                    f"given, got {self.block_tokens!r}"
                )
            cols["block_flat"], cols["block_offsets"] = flat, offs
        for k, v in cols.items():
            object.__setattr__(self, k, readonly(v))
        object.__setattr__(self, "block_tokens", int(self.block_tokens))

    @classmethod
    def from_arrays(
        cls,
        *,
        arrival_s: Any,
        prompt_tokens: Any,
        output_tokens: Any,
        block_ids: Sequence[Sequence[int]] | None = None,
        block_tokens: int = 0,
        session_id: Any = None,
        program_id: Any = None,
        parent: Any = None,
        tenant: Any = None,
        predicted_lo: Any = None,
        predicted_hi: Any = None,
        wait_kind: Any = None,
        name: str = "trace",
        sort: bool = False,
    ) -> "Trace":
        """Build a trace from per-request sequences (block ids as a list of lists).

        With ``sort=True`` requests are stably sorted by arrival (the count of moved rows is
        kept in ``report.n_reordered``); otherwise out-of-order arrivals raise
        :class:`TraceError`. ``parent`` indices refer to the input order and are remapped.
        """
        arr = float_column("arrival_s", arrival_s, None, source=name)
        n = arr.shape[0]
        packed = pack_blocks(block_ids, n, source=name)
        if block_ids is not None and block_tokens == 0:
            raise TraceError(f"{name}: block_ids given without block_tokens (tokens per block)")
        return cls.from_columns(
            name=name, arrival_s=arr, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            packed=packed, block_tokens=block_tokens, session_id=session_id,
            program_id=program_id, parent=parent, tenant=tenant, predicted_lo=predicted_lo,
            predicted_hi=predicted_hi, wait_kind=wait_kind, sort=sort,
            report=LoadReport(source=name, format="arrays", n_read=n),
        )

    @classmethod
    def from_columns(cls, *, name: str, arrival_s: np.ndarray, packed: tuple | None,
                     sort: bool, report: LoadReport, parent: Any = None,
                     block_tokens: int = 0, **cols: Any) -> "Trace":
        """Build from per-request columns that may be out of arrival order (loaders and
        generators): ``sort=True`` sorts them stably (parents remapped, the moved rows
        counted in ``report.n_reordered``), else out-of-order input is an error.
        ``packed`` is ``(block_flat, block_offsets)`` or None."""
        n = arrival_s.shape[0]
        order = None
        if n and np.any(np.diff(arrival_s) < 0):
            if not sort:
                i = int(np.flatnonzero(np.diff(arrival_s) < 0)[0]) + 1
                raise TraceError(
                    f"{report.source or name}: arrival times out of order at row {i} "
                    f"({arrival_s[i]!r} after {arrival_s[i - 1]!r}); pass sort=True to sort "
                    "them (the number of moved rows is reported)"
                )
            order = np.argsort(arrival_s, kind="stable")
        n_moved = 0 if order is None else int(np.count_nonzero(order != np.arange(n)))
        report = replace(report, n_kept=n, n_reordered=n_moved)
        flat = offs = None
        if packed is not None:
            flat, offs = packed
        if order is not None:
            arrival_s = arrival_s[order]
            cols = {k: (None if v is None else np.asarray(v)[order]) for k, v in cols.items()}
            if parent is not None:
                par = np.asarray(parent, dtype=np.int64)[order]
                inv = np.empty(n, np.int64)
                inv[order] = np.arange(n)
                parent = np.where(par >= 0, inv[np.clip(par, 0, None)], _NONE)
            if packed is not None:
                flat, offs = take_blocks(flat, offs, order)
        return cls(arrival_s=arrival_s, block_flat=flat, block_offsets=offs, parent=parent,
                   block_tokens=block_tokens, name=name, report=report, **cols)

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def n(self) -> int:
        """Number of requests (``len(trace)``)."""
        return len(self)

    @property
    def has_blocks(self) -> bool:
        """True when the trace carries prefix-block ids (``block_flat`` is set)."""
        return self.block_flat is not None

    @property
    def duration_s(self) -> float:
        """Span from first to last arrival (0 for fewer than two requests)."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def rate_per_s(self) -> float:
        """Mean arrival rate, ``(n - 1) / duration_s`` (NaN when undefined)."""
        d = self.duration_s
        return (len(self) - 1) / d if d > 0 else float("nan")

    def blocks(self, i: int) -> np.ndarray:
        """Prefix-block ids of request ``i`` (read-only view)."""
        if self.block_flat is None:
            raise TraceError(f"{self.name}: trace has no prefix block ids")
        return self.block_flat[self.block_offsets[i]:self.block_offsets[i + 1]]

    def block_lists(self) -> list[list[int]]:
        """Every request's prefix-block ids as a list of Python lists (``n`` lists, one per
        request in arrival order); raises :class:`TraceError` on a non-empty trace without
        blocks."""
        return [self.blocks(i).tolist() for i in range(len(self))]

    def _columns(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # ------------------------------------------------------------------ slicing
    def take(self, idx: Any) -> "Trace":
        """Requests at sorted integer indices ``idx`` (a boolean mask also works).

        Parent links to requests outside the selection become -1.
        """
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64)
        if idx.size and np.any(np.diff(idx) < 0):
            raise TraceError(f"{self.name}: take() needs sorted indices")
        c = self._columns()
        for k in ("arrival_s", "prompt_tokens", "output_tokens", "session_id", "program_id",
                  "tenant", "predicted_lo", "predicted_hi", "wait_kind"):
            if c[k] is not None:
                c[k] = c[k][idx]
        if self.parent is not None:
            newpos = np.full(len(self), _NONE, np.int64)
            newpos[idx] = np.arange(idx.size)
            par = self.parent[idx]
            c["parent"] = np.where(par >= 0, newpos[np.clip(par, 0, None)], _NONE)
        if self.block_flat is not None:
            c["block_flat"], c["block_offsets"] = take_blocks(self.block_flat,
                                                              self.block_offsets, idx)
        c["report"] = replace(self.report, n_kept=int(idx.size))
        return Trace(**c)

    def head(self, n_requests: int) -> "Trace":
        """The first ``n_requests`` requests."""
        if n_requests < 0:
            raise TraceError(f"head: n_requests must be >= 0, got {n_requests}")
        return self.take(np.arange(min(n_requests, len(self))))

    def slice(self, start: int, stop: int | None = None) -> "Trace":
        """Requests ``start:stop`` by position."""
        return self.take(np.arange(len(self))[start:stop])

    def window(self, start_s: float, end_s: float) -> "Trace":
        """Requests arriving in ``[start_s, end_s)`` (absolute trace time)."""
        if end_s < start_s:
            raise TraceError(f"window: end_s {end_s} < start_s {start_s}")
        lo = np.searchsorted(self.arrival_s, start_s, side="left")
        hi = np.searchsorted(self.arrival_s, end_s, side="left")
        return self.take(np.arange(lo, hi))

    # ------------------------------------------------------------------ time changes
    def shifted(self, offset_s: float) -> "Trace":
        """The same trace with every arrival moved by ``offset_s``."""
        c = self._columns()
        c["arrival_s"] = self.arrival_s + float(offset_s)
        return Trace(**c)

    def rebased(self) -> "Trace":
        """Arrivals shifted so that the first request arrives at 0."""
        return self.shifted(-float(self.arrival_s[0])) if len(self) else self

    def scale_rate(self, factor: float) -> "Trace":
        """Multiply the arrival rate by ``factor`` (> 0) around the first arrival.

        Arrival ``t`` becomes ``t0 + (t - t0) / factor``: order is preserved and every
        inter-arrival time (hence the mean) is divided by ``factor`` exactly.
        """
        if not (isinstance(factor, (int, float, np.floating)) and np.isfinite(factor)
                and factor > 0):
            raise TraceError(f"scale_rate: factor must be a finite number > 0, got {factor!r}")
        if len(self) == 0:
            return self
        t0 = self.arrival_s[0]
        c = self._columns()
        c["arrival_s"] = t0 + (self.arrival_s - t0) / float(factor)
        return Trace(**c)

    def with_rate(self, rate_per_s: float) -> "Trace":
        """Rescale arrivals so that the mean rate ``(n-1)/duration`` equals ``rate_per_s``."""
        cur = self.rate_per_s
        if not np.isfinite(cur):
            raise TraceError(f"{self.name}: with_rate needs >= 2 requests with distinct times")
        if not (np.isfinite(rate_per_s) and rate_per_s > 0):
            raise TraceError(f"with_rate: rate_per_s must be > 0, got {rate_per_s!r}")
        return self.scale_rate(rate_per_s / cur)

    # ------------------------------------------------------------------ combining
    @staticmethod
    def concat(traces: Iterable["Trace"], *, gap_s: float | None = None,
               name: str | None = None) -> "Trace":
        """Concatenate traces in time.

        With ``gap_s=None`` the traces must already be in time order (each starting no
        earlier than the previous ends); otherwise each trace is shifted to start ``gap_s``
        after the previous one's last arrival. Ids (session, program, tenant) are kept;
        parent indices are offset. Optional fields must be present in all or none.
        """
        ts = list(traces)
        if not ts:
            raise TraceError("concat: no traces given")
        parts: list[Trace] = []
        end = None
        for t in ts:
            if gap_s is not None and end is not None and len(t):
                t = t.shifted(end + gap_s - float(t.arrival_s[0]))
            if len(t):
                end = float(t.arrival_s[-1])
            parts.append(t)
        bt = {t.block_tokens for t in parts if t.has_blocks}
        if len(bt) > 1:
            raise TraceError(f"concat: traces use different block_tokens {sorted(bt)}")
        out: dict[str, Any] = {"name": name or "+".join(t.name for t in parts)}
        for k in ("arrival_s", "prompt_tokens", "output_tokens"):
            out[k] = np.concatenate([getattr(t, k) for t in parts])
        for k in ("session_id", "program_id", "tenant", "predicted_lo", "predicted_hi",
                  "wait_kind"):
            present = [getattr(t, k) is not None for t in parts]
            if any(present) and not all(present):
                raise TraceError(f"concat: field {k!r} is present in some traces only")
            if all(present):
                out[k] = np.concatenate([getattr(t, k) for t in parts])
        present = [t.parent is not None for t in parts]
        if any(present) and not all(present):
            raise TraceError("concat: field 'parent' is present in some traces only")
        if all(present):
            base = np.cumsum([0] + [len(t) for t in parts[:-1]])
            out["parent"] = np.concatenate(
                [np.where(t.parent >= 0, t.parent + b, _NONE) for t, b in zip(parts, base)])
        present = [t.has_blocks for t in parts]
        if any(present) and not all(present):
            raise TraceError("concat: block ids are present in some traces only")
        if all(present):
            out["block_flat"] = np.concatenate([t.block_flat for t in parts])
            offs = [parts[0].block_offsets]
            for t in parts[1:]:
                offs.append(t.block_offsets[1:] + offs[-1][-1])
            out["block_offsets"] = np.concatenate(offs)
            out["block_tokens"] = bt.pop()
        out["report"] = LoadReport(source=out["name"], format="concat",
                                   n_read=sum(len(t) for t in parts),
                                   n_kept=sum(len(t) for t in parts))
        return Trace(**out)

    # ------------------------------------------------------------------ summaries
    def stats(self) -> dict[str, Any]:
        """Summary statistics with the keys of ``lpserve trace stats --json``.

        Percentiles use linear interpolation. ``infinite_cache_hit_rate`` (traces with
        block ids) is the share of all blocks that lie in the longest already-seen prefix
        of their request, for an infinite cache that starts empty.
        """
        def dist(x: np.ndarray) -> dict[str, float]:
            if x.size == 0:
                return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "max")}
            p50, p90, p99 = np.percentile(x, [50, 90, 99])
            return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90),
                    "p99": float(p99), "max": float(x.max())}

        out: dict[str, Any] = {
            "name": self.name,
            "n_requests": len(self),
            "duration_s": self.duration_s,
            "rate_per_s": self.rate_per_s,
            "prompt_tokens": dist(self.prompt_tokens),
            "output_tokens": dist(self.output_tokens),
        }
        if len(self) > 2:
            ia = np.diff(self.arrival_s)
            out["interarrival_cv"] = float(ia.std() / ia.mean()) if ia.mean() > 0 else None
        if self.has_blocks:
            out["block_tokens"] = self.block_tokens
            out["n_blocks"] = int(self.block_flat.size)
            out["distinct_blocks"] = int(np.unique(self.block_flat).size)
            out["infinite_cache_hit_rate"] = infinite_cache_hit_rate(self)
        for k in ("session_id", "program_id", "tenant"):
            v = getattr(self, k)
            if v is not None:
                out[f"distinct_{k}"] = int(np.unique(v[v >= 0]).size)
        if self.wait_kind is not None:
            out["wait_kind"] = {nm: int(np.count_nonzero(self.wait_kind == c))
                                for c, nm in enumerate(("unknown",) + WAIT_NAMES, start=-1)}
        if self.report.n_dropped or self.report.n_reordered:
            out["load_report"] = self.report.as_dict()
        return out

    def to_pandas(self):  # -> pandas.DataFrame
        """One row per request (block ids as Python lists)."""
        import pandas as pd

        d: dict[str, Any] = {"arrival_s": self.arrival_s, "prompt_tokens": self.prompt_tokens,
                             "output_tokens": self.output_tokens}
        for k in ("session_id", "program_id", "parent", "tenant", "predicted_lo",
                  "predicted_hi", "wait_kind"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.has_blocks:
            d["block_ids"] = self.block_lists()
        return pd.DataFrame(d)

    def digest(self) -> str:
        """A stable SHA-256 hex digest of the trace's contents (not its name)."""
        h = hashlib.sha256()
        for f in fields(self):
            if f.name in ("name", "report"):
                continue
            v = getattr(self, f.name)
            if v is None and f.name == "wait_kind":
                continue  # a later field: digests of traces without it stay as they were
            h.update(f.name.encode())
            if v is None:
                h.update(b"\x00none")
            elif isinstance(v, np.ndarray):
                h.update(str(v.dtype).encode())
                h.update(np.ascontiguousarray(v).tobytes())
            else:
                h.update(repr(v).encode())
        return h.hexdigest()

    def __repr__(self) -> str:
        extra = [k for k in ("session_id", "program_id", "parent", "tenant", "predicted_lo",
                             "wait_kind") if getattr(self, k) is not None]
        if self.has_blocks:
            extra.insert(0, f"blocks[{self.block_tokens} tok]")
        return (f"Trace({self.name!r}, n={len(self)}, duration_s={self.duration_s:.1f}"
                + (", " + ", ".join(extra) if extra else "") + ")")


def infinite_cache_hit_rate(trace: Trace) -> float:
    """Share of prefix blocks that hit an infinite cache starting empty.

    A request hits on the longest leading run of its block ids that some earlier request
    has already sent as a prefix (hash chains: block ``k`` is reusable only if blocks
    ``0..k-1`` are too). Returns NaN for a trace with no blocks.
    """
    if trace.block_flat is None:
        raise TraceError(f"{trace.name}: trace has no prefix block ids")
    total = int(trace.block_flat.size)
    if total == 0:
        return float("nan")
    return infinite_prefix_hits(trace.block_flat, trace.block_offsets) / total
