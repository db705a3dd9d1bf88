"""Checked per-request columns of a trace (layer 0): :class:`TraceError`, the integer and
float column checks, the CSR packing of block ids, and the ranges every value must lie in.

Values are checked before they are cast, so a value beyond int64 is reported as itself,
never as the number it would wrap to:

* counts (token counts, ids) must be below :data:`MAX_COUNT` = 2^53, the largest range in
  which float64 (the type a CSV or JSON number is parsed into) holds every integer exactly;
* times must lie within :data:`MAX_TIME_S` = 2^33 s (about 272 years) of 0, where float64
  still resolves 2 microseconds (the simulator adds iteration times of milliseconds);
* block ids must fit int64.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

MAX_COUNT = 2 ** 53
MAX_TIME_S = 2.0 ** 33
MAX_ID = 2 ** 63 - 1


#: the most characters of a value an error message quotes
MAX_QUOTE = 200
#: the longest error message kept whole (longer ones keep their head and tail)
MAX_MESSAGE = 1000


def quote(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_QUOTE` characters (saying how long it was)."""
    r = repr(value)
    return r if len(r) <= MAX_QUOTE else f"{r[:MAX_QUOTE]}... ({len(r):,} characters)"


def json_value(value: Any) -> str:
    """A decoded JSON ``value`` as an error message shows it: a number as itself, other
    values with their JSON type (``a JSON string '48'``, ``JSON true``, ``JSON null``), cut
    to :data:`MAX_QUOTE` characters."""
    if isinstance(value, bool) or value is None:
        return f"JSON {json.dumps(value)}"
    for kind, types in (("string", str), ("array", list), ("object", dict)):
        if isinstance(value, types):
            return f"a JSON {kind} {quote(value)}"
    return quote(value)


class TraceError(ValueError):
    """Invalid trace data; the message names the source, field, row and value (a message
    over :data:`MAX_MESSAGE` characters keeps its head and tail)."""

    def __init__(self, message: Any = "", *args: Any) -> None:
        text = str(message)
        if len(text) > MAX_MESSAGE:
            cut = len(text) - MAX_MESSAGE + 200
            text = f"{text[:MAX_MESSAGE - 300]} ... [{cut:,} characters cut] ... {text[-100:]}"
        super().__init__(text, *args)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def int_column(name: str, values: Any, n: int | None, *, source: str,
               minimum: int | None = None, maximum: int = MAX_ID) -> np.ndarray:
    """``values`` as an int64 array (shape ``(n,)`` when ``n`` is given), checked before
    the cast: integral, finite, within ``[minimum, maximum]`` (token counts pass
    ``maximum=MAX_COUNT - 1``); :class:`TraceError` names
    ``source``, the field ``name``, the row and the value otherwise."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise TraceError(f"{source}: field {name!r} must be 1-D, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise TraceError(f"{source}: field {name!r} has {arr.shape[0]} values, expected {n}")
    if arr.dtype == object and arr.size:  # Python ints beyond int64, or mixed objects
        ok = [isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in arr]
        if not all(ok):
            i = ok.index(False)
            raise TraceError(f"{source}: field {name!r} row {i} is not an integer: "
                             f"{arr[i]!r}")
        big = [abs(int(x)) > maximum for x in arr]
        if any(big):
            i = big.index(True)
            raise TraceError(f"{source}: field {name!r} row {i} is too large: {int(arr[i])} "
                             f"(must be <= {maximum})")
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            i = _first(bad)
            raise TraceError(f"{source}: field {name!r} row {i} is not finite: {arr[i].item()!r}")
        frac = arr != np.round(arr)
        if frac.any():
            i = _first(frac)
            raise TraceError(f"{source}: field {name!r} row {i} is not an integer: "
                             f"{arr[i].item()!r}")
    elif arr.dtype.kind not in "iub" and arr.size:
        raise TraceError(f"{source}: field {name!r} must be integers, got dtype {arr.dtype}")
    if arr.size and arr.dtype.kind in "fu":  # range check before the cast to int64
        big = np.abs(arr) > maximum if arr.dtype.kind == "f" else arr > maximum
        if big.any():
            i = _first(big)
            raise TraceError(f"{source}: field {name!r} row {i} is too large: "
                             f"{arr[i].item()!r} (must be <= {maximum})")
    out = arr.astype(np.int64)
    if out.size and out.dtype.kind == "i" and arr.dtype.kind == "i":
        big = np.abs(out) > maximum
        if big.any():
            i = _first(big)
            raise TraceError(f"{source}: field {name!r} row {i} is too large: {out[i]} "
                             f"(must be <= {maximum})")
    if minimum is not None and out.size:
        bad = out < minimum
        if bad.any():
            i = _first(bad)
            raise TraceError(
                f"{source}: field {name!r} row {i} must be >= {minimum}, got {out[i]}"
            )
    return out


def float_column(name: str, values: Any, n: int | None, *, source: str,
                 limit: float | None = None) -> np.ndarray:
    """``values`` as a finite float64 array (shape ``(n,)`` when ``n`` is given), each
    within ``[-limit, limit]`` when ``limit`` is given; :class:`TraceError` otherwise."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise TraceError(f"{source}: field {name!r} must be 1-D, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise TraceError(f"{source}: field {name!r} has {arr.shape[0]} values, expected {n}")
    try:
        with np.errstate(over="raise", invalid="raise"):
            out = arr.astype(np.float64)
    except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:
        raise TraceError(f"{source}: field {name!r} is not numeric ({exc})") from None
    bad = ~np.isfinite(out)
    if bad.any():
        i = _first(bad)
        raise TraceError(f"{source}: field {name!r} row {i} is not finite: {out[i].item()!r}")
    if limit is not None and out.size:
        far = np.abs(out) > limit
        if far.any():
            i = _first(far)
            raise TraceError(f"{source}: field {name!r} row {i} = {out[i].item()!r} is beyond "
                             f"{limit:.4g} (float64 times lose microseconds past 2^33 s)")
    return out


def pack_blocks(block_lists: Sequence[Sequence[int]] | None, n: int, *,
                source: str = "trace") -> tuple[np.ndarray, np.ndarray] | None:
    """Pack per-request block-id lists into CSR arrays ``(flat, offsets)``.

    ``offsets`` has length ``n + 1``; request ``i`` owns ``flat[offsets[i]:offsets[i+1]]``.
    Ids must be integers in ``[0, 2^63)``.
    """
    if block_lists is None:
        return None
    if len(block_lists) != n:
        raise TraceError(f"{source}: block_ids has {len(block_lists)} lists, expected {n}")
    lengths = np.fromiter((len(b) for b in block_lists), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    try:
        flat = np.fromiter((x for b in block_lists for x in b), dtype=np.int64,
                           count=int(offsets[-1])) if n else np.zeros(0, np.int64)
    except (OverflowError, TypeError, ValueError):
        for i, b in enumerate(block_lists):
            for x in b:
                if isinstance(x, bool) or not isinstance(x, (int, np.integer)) \
                        or not 0 <= int(x) <= MAX_ID:
                    raise TraceError(f"{source}: block_ids of request {i} contain {x!r} "
                                     f"(ids must be integers in [0, 2^63))") from None
        raise
    if flat.size and flat.min() < 0:
        i = int(np.searchsorted(offsets, _first(flat < 0), side="right") - 1)
        raise TraceError(f"{source}: block_ids of request {i} contain a negative id")
    return flat, offsets
