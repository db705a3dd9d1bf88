"""Loaders for real LLM-serving trace formats, with format auto-detection and gzip.

Formats (``format=`` argument, or detected from the header / first line):

``azure``
    Azure LLM inference trace CSV (Splitwise): ``TIMESTAMP,ContextTokens,GeneratedTokens``,
    wall-clock timestamps. Arrivals are seconds since the first row.
``burstgpt``
    BurstGPT CSV: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``;
    ``Timestamp`` in seconds. Rows with zero request or response tokens are failed requests:
    they are dropped and counted in the load report. ``Model`` becomes ``tenant`` (codes in
    ``report.labels``).
``mooncake``
    Mooncake JSON Lines: ``timestamp`` (ms), ``input_length``, ``output_length``,
    ``hash_ids`` (prefix-block ids, 512 tokens per block).
``lengths``
    Untimed request-length tables ``num_prefill_tokens,num_decode_tokens,...`` (Sarathi /
    Vidur processed traces) and ShareGPT per-turn tables (``conv_index,...,history_tokens,
    prompt_tokens,response_tokens``). A turn's prompt is its history plus its own tokens (the
    context a chat engine re-sends) and ``session_id`` is the conversation. These tables
    have no timestamps: with ``rate_per_s`` arrivals come from a seeded Poisson process,
    otherwise every request arrives at time 0 (the batch setting of the scheduling theory).
    Rows with a zero-token prompt or output cannot be served: they are dropped and counted.
``kv-cache-tester``
    Agentic coding sessions (kv-cache-tester, Claude Code through a proxy), one JSON object
    per line and session: ``block_size``, ``hash_id_scope`` (``"local"``) and ``requests``
    (``t`` seconds since the session's first request, ``type`` ``"n"``/``"s"``/
    ``"subagent"``, ``in``, ``out``, ``hash_ids`` one per full block, ``stop``,
    ``output_types``; a sub-agent holds its own ``requests``, timed from its own ``t``).
    :func:`read_sessions` gives the sessions on their own clocks
    (:class:`~lpserve.trace.sessions.Sessions`); ``load_trace`` composes them with
    :func:`~lpserve.trace.sessions.compose`: Poisson session starts at ``rate_per_s``, or
    every session at 0. Sub-agents are flattened onto their parent's clock, block ids are
    made unique per session, ``wait_kind`` comes from ``stop`` (``tool_use``: a tool call;
    ``end_turn``/``stop_sequence``: a user turn; no stop: a tool call if ``output_types``
    has ``tool_use``, else unknown). Requests with zero input or output tokens are dropped
    and counted.

Every error names the file, line, the file's own field name and value; values are
checked before they are cast (limits in :mod:`lpserve.trace.columns`). Nothing is dropped
without a count in ``trace.report``.

Accepted as written (documented, tested in ``tests/robustness``): a UTF-8 byte-order
mark; CRLF line ends; blank lines (skipped; line numbers stay those of the file);
spaces around CSV fields; extra columns or JSON keys (ignored); integral values written
as ``4808.0`` or ``1e3``; equal arrival times; Azure ``TIMESTAMP``s that all carry a
UTC offset (converted to UTC instants, so rows in different offsets keep their true
order). Refused with a clear error: non-regular files (FIFOs, devices: reading them could
block), truncated or corrupt gzip streams, invalid UTF-8, duplicated column names or JSON
keys, rows with missing fields, offsets on some ``TIMESTAMP``s only, and counts or times
beyond the ranges of :mod:`lpserve.trace.columns`.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from lpserve.trace import LoadReport, Trace, TraceError, pack_blocks
from lpserve.trace.columns import MAX_COUNT, MAX_ID, MAX_TIME_S, json_value, quote
from lpserve.trace.kv_cache_tester import read_sessions
from lpserve.trace.sessions import Sessions, compose
from lpserve.trace.textio import READ_ERRORS, check_regular_file, open_text, read_error

FORMATS = ("azure", "burstgpt", "mooncake", "lengths", "kv-cache-tester")
MOONCAKE_BLOCK_TOKENS = 512

#: traces bundled inside the package: name -> (file, format, description)
BUNDLED = {
    "azure-conv-10min": ("azure_conv_first10min.csv.gz", "azure",
                         "Azure LLM inference 2023, conversation, first 10 minutes (CC-BY 4.0)"),
    "mooncake-conv-5min": ("mooncake_conv_first5min.jsonl.gz", "mooncake",
                           "Mooncake FAST'25 conversation trace, first 5 minutes (Apache-2.0)"),
    "agentic-sessions-small": ("kv_cache_tester_sessions_small.jsonl.gz", "kv-cache-tester",
                               "kv-cache-tester Claude Code sessions, 43 small ones "
                               "(Apache-2.0); every session starts at 0"),
}
DEFAULT_TRACE = "azure-conv-10min"


def _first_line(path: Path) -> str:
    try:
        with open_text(path) as f:
            for line in f:
                if line.strip():
                    return line.strip()
    except READ_ERRORS as exc:
        raise read_error(path, exc) from None
    raise TraceError(f"{path}: file is empty")


def detect_format(path: str | os.PathLike) -> str:
    """The format name of ``path`` from its first non-empty line."""
    path = Path(path)
    line = _first_line(path)
    if line.startswith("{"):
        try:
            keys = set(json.loads(line))
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: line 1 is not valid JSON: {exc}") from None
        except RecursionError:
            raise TraceError(f"{path}: line 1: JSON nested too deeply") from None
        if {"timestamp", "input_length", "output_length"} <= keys:
            return "mooncake"
        if {"requests", "block_size"} <= keys:
            return "kv-cache-tester"
        raise TraceError(f"{path}: JSON lines with keys {sorted(keys)} match no known format "
                         f"(mooncake needs timestamp, input_length, output_length; "
                         f"kv-cache-tester needs requests, block_size)")
    cols = {c.strip() for c in line.split(",")}
    known = (("azure", ("TIMESTAMP", "ContextTokens", "GeneratedTokens")),
             ("burstgpt", ("Timestamp", "Request tokens", "Response tokens")),
             ("lengths", ("num_prefill_tokens", "num_decode_tokens")),
             ("lengths", ("history_tokens", "prompt_tokens", "response_tokens")))
    for fmt, need in known:
        if set(need) <= cols:
            return fmt
    for fmt, need in known:  # a near miss: most columns of one format
        have = [c for c in need if c in cols]
        if len(have) >= 2 or (len(need) == 2 and have):
            lack = [c for c in need if c not in cols]
            raise TraceError(f"{path}: line 1: header {line[:120]!r} looks like the {fmt} "
                             f"format but lacks column(s) {', '.join(map(repr, lack))}")
    raise TraceError(f"{path}: header {line[:120]!r} matches no known format {FORMATS}")


def load_trace(path: str | os.PathLike, format: str = "auto", *, sort: bool = False,
               rate_per_s: float | None = None, seed: int = 0,
               name: str | None = None) -> Trace:
    """Load a trace file (plain or gzipped).

    Args:
        path: file path, or the name of a bundled trace (see :data:`BUNDLED`).
        format: ``"auto"`` or one of :data:`FORMATS`.
        sort: sort out-of-order arrivals (the count is in ``trace.report.n_reordered``);
            without it out-of-order arrivals raise :class:`TraceError`.
        rate_per_s: for untimed ``lengths`` tables, the Poisson arrival rate; for
            ``kv-cache-tester`` sessions, the Poisson rate of session starts; ``None`` puts
            every request (every session start) at time 0. Refused for timed formats.
        seed: seed of the arrival generator (``lengths``; the session order and starts of
            ``kv-cache-tester``).
        name: label of the trace (default: the file name).
    """
    if isinstance(path, str) and path in BUNDLED:
        return bundled_trace(path)
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        hint = f"; bundled traces: {', '.join(BUNDLED)}" if os.sep not in str(path) else ""
        raise FileNotFoundError(f"{path}: no such file{hint}")
    check_regular_file(path)
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {format!r}; known: auto, {', '.join(FORMATS)}")
    if rate_per_s is not None and fmt not in ("lengths", "kv-cache-tester"):
        raise TraceError(f"{path}: rate_per_s applies to untimed 'lengths' tables and "
                         f"'kv-cache-tester' sessions only; use trace.with_rate() to rescale "
                         f"a {fmt} trace")
    label = name or path.name.split(".")[0]
    if fmt == "kv-cache-tester":
        return compose(read_sessions(path), rate_per_s=rate_per_s, seed=seed, name=label)
    loader = {"azure": _load_azure, "burstgpt": _load_burstgpt, "mooncake": _load_mooncake,
              "lengths": _load_lengths}[fmt]
    kwargs: dict[str, Any] = {"sort": sort, "name": label}
    if fmt == "lengths":
        kwargs.update(rate_per_s=rate_per_s, seed=seed)
    return loader(path, **kwargs)


def bundled_trace(name: str = DEFAULT_TRACE) -> Trace:
    """A trace shipped inside the package (see ``lpserve/data/TRACES.md`` for licenses)."""
    if name not in BUNDLED:
        raise TraceError(f"unknown bundled trace {name!r}; bundled: {', '.join(BUNDLED)}")
    fname, fmt, _ = BUNDLED[name]
    ref = resources.files("lpserve") / "data" / fname
    with resources.as_file(ref) as p:
        return load_trace(p, fmt, name=name)


def bundled_sessions(name: str = "agentic-sessions-small") -> Sessions:
    """The sessions of a bundled ``kv-cache-tester`` file on their own clocks (compose them
    with :func:`lpserve.trace.sessions.compose`)."""
    if name not in BUNDLED or BUNDLED[name][1] != "kv-cache-tester":
        raise TraceError(f"{name!r} is not a bundled sessions file; bundled: "
                         f"{[k for k, v in BUNDLED.items() if v[1] == 'kv-cache-tester']}")
    ref = resources.files("lpserve") / "data" / BUNDLED[name][0]
    with resources.as_file(ref) as p:
        return read_sessions(p)


# --------------------------------------------------------------------------- CSV helpers
class Table:
    """A CSV file's rows as strings: ``df`` (pandas, one column per header name) and
    ``lines``, the file's line number of each row (blank lines skipped), int64 (n,)."""

    def __init__(self, path: Path, df: Any, lines: np.ndarray) -> None:
        self.path, self.df, self.lines = path, df, lines

    def __len__(self) -> int:
        return len(self.df)

    def raw(self, col: str, i: int) -> str:
        """The file's own text of field ``col`` in row ``i``."""
        return str(self.df[col].iloc[i])

    def error(self, i: int, col: str, what: str) -> TraceError:
        """A TraceError naming the file, row ``i``'s line, field ``col`` and ``what``."""
        return TraceError(f"{self.path}: line {int(self.lines[i])}, field {col!r}: {what}")


def _header(path: Path) -> list[str]:
    names = [c.strip() for c in next(csv.reader([_first_line(path)]))]
    seen: dict[str, int] = {}
    for k, c in enumerate(names):
        if c in seen:
            raise TraceError(f"{path}: line 1: column {c!r} appears twice (columns "
                             f"{seen[c] + 1} and {k + 1}); which one holds the data is "
                             "ambiguous")
        seen[c] = k
    return names


def _data_lines(path: Path, body: str, n_fields: int) -> np.ndarray:
    """File line numbers of the data rows of ``body`` (blank lines skipped), checking that
    each has ``n_fields`` fields (quoted fields spanning lines are not supported)."""
    lines = []
    for k, line in enumerate(body.splitlines(), start=1):
        if not line.strip():
            continue
        lines.append(k)
        q = line.count('"')
        if q % 2:
            raise _FieldCount(k, -1)
        n = line.count(",") + 1 if not q else len(next(csv.reader([line])))
        if n != n_fields and len(lines) > 1:
            raise _FieldCount(k, n)
    return np.asarray(lines[1:], np.int64)


class _FieldCount(Exception):
    def __init__(self, line: int, n: int) -> None:
        self.line, self.n = line, n


def _read_csv(path: Path, required: tuple[str, ...]) -> Table:
    import pandas as pd

    names = _header(path)
    missing = [c for c in required if c not in names]
    if missing:
        raise TraceError(f"{path}: missing column(s) {missing}; found {names}")
    try:
        with open_text(path) as f:
            body = f.read()
    except READ_ERRORS as exc:
        raise read_error(path, exc) from None
    nul = body.find("\0")
    if nul >= 0:  # binary data in a text file: say so, not which field it broke
        raise TraceError(f"{path}: line {body.count(chr(10), 0, nul) + 1}: a NUL byte "
                         "(binary data in a text file)")
    try:
        lines = _data_lines(path, body, len(names))
    except _FieldCount as exc:
        if exc.n < 0:
            raise TraceError(f"{path}: line {exc.line}: unbalanced quote (\") in the row; "
                             "fields spanning lines are not supported") from None
        lack = names[exc.n:] if exc.n < len(names) else []
        what = (f"; field {lack[0]!r} is missing" if lack else "")
        raise TraceError(f"{path}: line {exc.line}: {exc.n} fields, the header has "
                         f"{len(names)}{what}") from None
    try:
        df = pd.read_csv(io.StringIO(body), dtype=str, skipinitialspace=True,
                         keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: file is empty") from None
    except pd.errors.ParserError as exc:
        raise TraceError(f"{path}: cannot parse as CSV: {exc}") from None
    df.columns = [c.strip() for c in df.columns]
    if len(df) != len(lines):  # quoted fields spanning lines: no exact line numbers
        lines = np.arange(len(df), dtype=np.int64) + 2
    if len(df) == 0:
        raise TraceError(f"{path}: file has a header but no data rows")
    return Table(path, df, lines)


def _numeric(t: Table, col: str, *, integer: bool, what: str = "token count") -> np.ndarray:
    """Column ``col`` as float64 (or int64 counts), checked before any cast: finite,
    integral, >= 0 and < 2^53 for integers."""
    import pandas as pd

    vals = pd.to_numeric(t.df[col], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(vals)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raw = t.raw(col, i)
        raise t.error(i, col, "empty, not a number" if not str(raw).strip()
                      else f"not a finite number: {quote(raw)}")
    if integer:
        frac = vals != np.round(vals)
        if frac.any():
            i = int(np.flatnonzero(frac)[0])
            raise t.error(i, col, f"not an integer: {t.raw(col, i)!r}")
        neg = vals < 0
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            raise t.error(i, col, f"negative {what} {t.raw(col, i)!r}")
        big = vals >= MAX_COUNT
        if big.any():
            i = int(np.flatnonzero(big)[0])
            raise t.error(i, col, f"{what} {t.raw(col, i)!r} is too large (must be below "
                          f"2^53 = {MAX_COUNT})")
        return vals.astype(np.int64)
    return vals


def _reject_zero(t: Table, values: np.ndarray, col: str) -> None:
    zero = values == 0
    if zero.any():
        i = int(np.flatnonzero(zero)[0])
        raise t.error(i, col, f"zero-length request ({int(zero.sum())} such rows)")


def check_times(path: Path, arrival_s: np.ndarray, lines: np.ndarray, field: str,
                raw: Any, *, sort: bool) -> None:
    """Arrival times (s) of the rows at file ``lines`` (shape (n,)): within 2^33 s and,
    unless ``sort``, in order; the error names the line, the source ``field`` and the
    file's own values ``raw[i]``."""
    far = np.abs(arrival_s) > MAX_TIME_S
    if far.any():
        i = int(np.flatnonzero(far)[0])
        raise TraceError(f"{path}: line {int(lines[i])}, field {field!r}: {raw[i]!r} is "
                         f"{arrival_s[i]:.4g} s, beyond 2^33 s (float64 times lose "
                         "microseconds there)")
    back = np.diff(arrival_s) < 0
    if back.any() and not sort:
        i = int(np.flatnonzero(back)[0]) + 1
        raise TraceError(f"{path}: line {int(lines[i])}, field {field!r}: {raw[i]!r} is "
                         f"earlier than line {int(lines[i - 1])}'s {raw[i - 1]!r}; pass "
                         "sort=True (CLI: --sort) to sort the rows (the moved rows are "
                         "counted)")


def _report(path: Path, fmt: str, n_read: int, dropped: dict[str, int]) -> LoadReport:
    return LoadReport(source=str(path), format=fmt, n_read=n_read,
                      dropped=tuple((k, v) for k, v in dropped.items() if v))


# --------------------------------------------------------------------------- formats
_TZ = r"(?:Z|[+-]\d\d:?\d\d)$"


def _azure_times(t: Table) -> np.ndarray:
    """Seconds since the earliest ``TIMESTAMP`` (naive wall clock, or all with a UTC
    offset, then compared as UTC instants)."""
    import pandas as pd

    raw = t.df["TIMESTAMP"].str.strip()
    aware = raw.str.contains(_TZ, regex=True).to_numpy()
    if aware.any() and not aware.all():
        i = int(np.flatnonzero(aware != aware[0])[0])
        kinds = ("with", "without") if aware[i] else ("without", "with")
        raise t.error(i, "TIMESTAMP", f"{t.raw('TIMESTAMP', i)!r} is {kinds[0]} a UTC offset, "
                      f"line {int(t.lines[0])}'s {t.raw('TIMESTAMP', 0)!r} is {kinds[1]} one: "
                      "the times cannot be ordered")
    try:
        if aware.all():
            ts = pd.to_datetime(raw, format="ISO8601", utc=True, errors="coerce")
        else:
            ts = pd.to_datetime(raw, format="%Y-%m-%d %H:%M:%S.%f", errors="coerce")
            if ts.isna().any():  # also accept timestamps without a fractional part
                ts = pd.to_datetime(raw, format="ISO8601", errors="coerce")
    except (ValueError, OverflowError) as exc:
        raise TraceError(f"{t.path}: field 'TIMESTAMP': cannot parse the times: {exc}") from None
    bad = ts.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise t.error(i, "TIMESTAMP", f"not a timestamp: {t.raw('TIMESTAMP', i)!r}")
    return (ts - ts.min()).dt.total_seconds().to_numpy(dtype=np.float64)


def _load_azure(path: Path, *, sort: bool, name: str) -> Trace:
    t = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    arrival = _azure_times(t)
    check_times(path, arrival, t.lines, "TIMESTAMP", t.df["TIMESTAMP"].tolist(), sort=sort)
    prompt = _numeric(t, "ContextTokens", integer=True)
    output = _numeric(t, "GeneratedTokens", integer=True)
    _reject_zero(t, prompt, "ContextTokens")
    _reject_zero(t, output, "GeneratedTokens")
    return Trace.from_columns(name=name, arrival_s=arrival, packed=None, sort=sort,
                              report=_report(path, "azure", len(t), {}),
                              prompt_tokens=prompt, output_tokens=output)


def _load_burstgpt(path: Path, *, sort: bool, name: str) -> Trace:
    t = _read_csv(path, ("Timestamp", "Request tokens", "Response tokens"))
    df = t.df
    arrival = _numeric(t, "Timestamp", integer=False)
    prompt = _numeric(t, "Request tokens", integer=True)
    output = _numeric(t, "Response tokens", integer=True)
    fail_resp = output == 0
    fail_req = (prompt == 0) & ~fail_resp
    keep = ~(fail_resp | fail_req)
    tenant = None
    labels: tuple[tuple[str, str], ...] = ()
    if "Model" in df.columns:
        models = df["Model"].to_numpy()
        names, codes = np.unique(models, return_inverse=True)
        tenant = codes.astype(np.int64)[keep]
        labels = tuple(("tenant", f"{i}={m}") for i, m in enumerate(names.tolist()))
    rep = _report(path, "burstgpt", len(df), {
        "failed request (zero response tokens)": int(fail_resp.sum()),
        "zero request tokens": int(fail_req.sum()),
    })
    rep = replace(rep, labels=labels)
    if not keep.any():
        raise TraceError(f"{path}: every one of the {len(df)} rows is a failed request")
    check_times(path, arrival[keep], t.lines[keep], "Timestamp",
                df["Timestamp"].to_numpy()[keep].tolist(), sort=sort)
    return Trace.from_columns(name=name, arrival_s=arrival[keep], packed=None, sort=sort,
                              report=rep, prompt_tokens=prompt[keep],
                              output_tokens=output[keep], tenant=tenant)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise TraceError(f"field {k!r} appears twice ({d[k]!r} and {v!r})")
        d[k] = v
    return d


def _mooncake_record(path: Path, lineno: int, line: str) -> dict[str, Any]:
    """One JSON line, checked: the three numbers finite and in range, ``hash_ids`` ids."""
    where = f"{path}: line {lineno}"
    try:
        d = json.loads(line, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: invalid JSON ({exc})") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply") from None
    except TraceError as exc:
        raise TraceError(f"{where}: {exc}") from None
    if not isinstance(d, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(d).__name__}")
    for key in ("timestamp", "input_length", "output_length"):
        v = d.get(key)
        if v is None:
            raise TraceError(f"{where}: missing field {key!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TraceError(f"{where}, field {key!r}: not a number: {json_value(v)}")
        if not math.isfinite(v):
            raise TraceError(f"{where}, field {key!r}: not a finite number: {quote(v)}")
    if abs(d["timestamp"]) / 1000.0 > MAX_TIME_S:
        raise TraceError(f"{where}, field 'timestamp': {d['timestamp']!r} ms is beyond 2^33 s "
                         "(float64 times lose microseconds there)")
    for key in ("input_length", "output_length"):
        v = d[key]
        if v != int(v) or v <= 0:
            raise TraceError(f"{where}, field {key!r}: must be a positive integer, got {v!r}")
        if v >= MAX_COUNT:
            raise TraceError(f"{where}, field {key!r}: token count {v!r} is too large (must "
                             f"be below 2^53 = {MAX_COUNT})")
    hid = d.get("hash_ids")
    if hid is not None:
        if not isinstance(hid, list):
            raise TraceError(f"{where}, field 'hash_ids': must be a list of non-negative "
                             f"integers, got {type(hid).__name__}")
        for h in hid:
            if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_ID:
                raise TraceError(f"{where}, field 'hash_ids': {h!r} is not an integer in "
                                 "[0, 2^63)")
        il = int(d["input_length"])
        want = -(-il // MOONCAKE_BLOCK_TOKENS)
        if len(hid) != want:
            raise TraceError(f"{where}, field 'hash_ids': {len(hid)} blocks for input_length "
                             f"{il} (expected ceil({il}/{MOONCAKE_BLOCK_TOKENS}) = {want})")
    return d


def _load_mooncake(path: Path, *, sort: bool, name: str) -> Trace:
    ts: list[float] = []
    raw_ts: list[Any] = []
    lines: list[int] = []
    inp: list[int] = []
    out: list[int] = []
    blocks: list[list[int]] = []
    lineno = 0
    try:
        with open_text(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                d = _mooncake_record(path, lineno, line)
                if d.get("hash_ids") is not None:
                    blocks.append(d["hash_ids"])
                lines.append(lineno)
                raw_ts.append(d["timestamp"])
                ts.append(d["timestamp"] / 1000.0)
                inp.append(int(d["input_length"]))
                out.append(int(d["output_length"]))
    except READ_ERRORS as exc:
        raise read_error(path, exc, f"after line {lineno}") from None
    n_lines = len(lines)
    if n_lines == 0:
        raise TraceError(f"{path}: file is empty")
    if blocks and len(blocks) != n_lines:
        raise TraceError(f"{path}: 'hash_ids' is present on some lines only "
                         f"({len(blocks)} of {n_lines})")
    arrival = np.asarray(ts, dtype=np.float64)
    check_times(path, arrival, np.asarray(lines), "timestamp", raw_ts, sort=sort)
    packed = pack_blocks(blocks, n_lines, source=str(path)) if blocks else None
    return Trace.from_columns(name=name, arrival_s=arrival, packed=packed, sort=sort,
                              report=_report(path, "mooncake", n_lines, {}),
                              prompt_tokens=np.asarray(inp, np.int64),
                              output_tokens=np.asarray(out, np.int64),
                              block_tokens=MOONCAKE_BLOCK_TOKENS if blocks else 0)


def _load_lengths(path: Path, *, sort: bool, name: str, rate_per_s: float | None,
                  seed: int) -> Trace:
    cols = set(_header(path))
    session = None
    if {"history_tokens", "prompt_tokens", "response_tokens"} <= cols:
        t = _read_csv(path, ("conv_index", "history_tokens", "prompt_tokens",
                             "response_tokens"))
        hist = _numeric(t, "history_tokens", integer=True)
        prompt = hist + _numeric(t, "prompt_tokens", integer=True)
        big = prompt >= MAX_COUNT
        if big.any():
            i = int(np.flatnonzero(big)[0])
            raise t.error(i, "history_tokens", f"history_tokens + prompt_tokens = "
                          f"{t.raw('history_tokens', i)} + {t.raw('prompt_tokens', i)} is too "
                          f"large (must be below 2^53 = {MAX_COUNT})")
        output = _numeric(t, "response_tokens", integer=True)
        session = _numeric(t, "conv_index", integer=True, what="conversation index")
        pcol, ocol = "history_tokens+prompt_tokens", "response_tokens"
    else:
        t = _read_csv(path, ("num_prefill_tokens", "num_decode_tokens"))
        prompt = _numeric(t, "num_prefill_tokens", integer=True)
        output = _numeric(t, "num_decode_tokens", integer=True)
        pcol, ocol = "num_prefill_tokens", "num_decode_tokens"
    zp, zo = prompt == 0, (output == 0) & (prompt != 0)
    keep = ~(zp | zo)
    if not keep.any():
        raise TraceError(f"{path}: every row has a zero-token prompt or output")
    n = int(keep.sum())
    if rate_per_s is None:
        arrival = np.zeros(n)
    else:
        if not (isinstance(rate_per_s, (int, float)) and math.isfinite(rate_per_s)
                and rate_per_s > 0):
            raise TraceError(f"rate_per_s must be a finite number > 0, got {rate_per_s!r}")
        rng = np.random.default_rng(seed)
        arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))
        arrival -= arrival[0]
    rep = _report(path, "lengths", len(t), {f"zero-token prompt ({pcol})": int(zp.sum()),
                                            f"zero-token output ({ocol})": int(zo.sum())})
    return Trace.from_columns(name=name, arrival_s=arrival, packed=None, sort=sort, report=rep,
                              prompt_tokens=prompt[keep], output_tokens=output[keep],
                              session_id=None if session is None else session[keep])
