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

Every error names the file, line and field. Nothing is dropped without a count in
``trace.report``.
"""
from __future__ import annotations

import gzip
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

FORMATS = ("azure", "burstgpt", "mooncake", "lengths")
MOONCAKE_BLOCK_TOKENS = 512

#: traces bundled inside the package: name -> (file, format, description)
BUNDLED = {
    "azure-conv-10min": ("azure_conv_first10min.csv.gz", "azure",
                         "Azure LLM inference 2023, conversation, first 10 minutes (CC-BY 4.0)"),
    "mooncake-conv-5min": ("mooncake_conv_first5min.jsonl.gz", "mooncake",
                           "Mooncake FAST'25 conversation trace, first 5 minutes (Apache-2.0)"),
}
DEFAULT_TRACE = "azure-conv-10min"


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as fb:
        magic = fb.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, "rt", encoding="utf-8", newline="")


def _first_line(path: Path) -> str:
    try:
        with _open_text(path) as f:
            for line in f:
                if line.strip():
                    return line.strip()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise TraceError(f"{path}: cannot read as (gzipped) text: {exc}") from None
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
        if {"timestamp", "input_length", "output_length"} <= keys:
            return "mooncake"
        raise TraceError(f"{path}: JSON lines with keys {sorted(keys)} match no known format "
                         f"(mooncake needs timestamp, input_length, output_length)")
    cols = {c.strip() for c in line.split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cols:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= cols:
        return "burstgpt"
    if {"num_prefill_tokens", "num_decode_tokens"} <= cols or \
            {"history_tokens", "prompt_tokens", "response_tokens"} <= cols:
        return "lengths"
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
        rate_per_s: for untimed ``lengths`` tables, the Poisson arrival rate; ``None``
            puts every request at time 0. Refused for timed formats.
        seed: seed of the arrival generator for ``lengths`` tables.
        name: label of the trace (default: the file name).
    """
    if isinstance(path, str) and path in BUNDLED:
        return bundled_trace(path)
    path = Path(path)
    if not path.exists():
        hint = f"; bundled traces: {', '.join(BUNDLED)}" if os.sep not in str(path) else ""
        raise FileNotFoundError(f"{path}: no such file{hint}")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, not a trace file")
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {format!r}; known: auto, {', '.join(FORMATS)}")
    if rate_per_s is not None and fmt != "lengths":
        raise TraceError(f"{path}: rate_per_s applies to untimed 'lengths' tables only; "
                         f"use trace.with_rate() to rescale a {fmt} trace")
    label = name or path.name.split(".")[0]
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


# --------------------------------------------------------------------------- CSV helpers
def _read_csv(path: Path, required: tuple[str, ...]):
    import pandas as pd

    try:
        with _open_text(path) as f:
            df = pd.read_csv(f, dtype=str, skipinitialspace=True, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, EOFError, OSError) as exc:
        raise TraceError(f"{path}: cannot parse as CSV: {exc}") from None
    df.columns = [c.strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise TraceError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")
    if len(df) == 0:
        raise TraceError(f"{path}: file has a header but no data rows")
    return df


def _numeric(path: Path, df, col: str, *, integer: bool) -> np.ndarray:
    import pandas as pd

    raw = df[col]
    vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(vals)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{path}: line {i + 2}, field {col!r}: not a finite number: "
                         f"{raw.iloc[i]!r}")
    if integer:
        frac = vals != np.round(vals)
        if frac.any():
            i = int(np.flatnonzero(frac)[0])
            raise TraceError(f"{path}: line {i + 2}, field {col!r}: not an integer: "
                             f"{raw.iloc[i]!r}")
        neg = vals < 0
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            raise TraceError(f"{path}: line {i + 2}, field {col!r}: negative token count "
                             f"{raw.iloc[i]!r}")
        return vals.astype(np.int64)
    return vals


def _reject_zero(path: Path, values: np.ndarray, col: str) -> None:
    zero = values == 0
    if zero.any():
        i = int(np.flatnonzero(zero)[0])
        raise TraceError(f"{path}: line {i + 2}, field {col!r}: zero-length request "
                         f"({int(zero.sum())} such rows)")


def _report(path: Path, fmt: str, n_read: int, dropped: dict[str, int]) -> LoadReport:
    return LoadReport(source=str(path), format=fmt, n_read=n_read,
                      dropped=tuple((k, v) for k, v in dropped.items() if v))


# --------------------------------------------------------------------------- formats
def _load_azure(path: Path, *, sort: bool, name: str) -> Trace:
    import pandas as pd

    df = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    ts = pd.to_datetime(df["TIMESTAMP"], format="%Y-%m-%d %H:%M:%S.%f", errors="coerce")
    if ts.isna().any():
        # also accept timestamps without a fractional part
        ts2 = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", errors="coerce")
        bad = ts2.isna().to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TraceError(f"{path}: line {i + 2}, field 'TIMESTAMP': not a timestamp: "
                             f"{df['TIMESTAMP'].iloc[i]!r}")
        ts = ts2
    arrival = (ts - ts.min()).dt.total_seconds().to_numpy(dtype=np.float64)
    prompt = _numeric(path, df, "ContextTokens", integer=True)
    output = _numeric(path, df, "GeneratedTokens", integer=True)
    _reject_zero(path, prompt, "ContextTokens")
    _reject_zero(path, output, "GeneratedTokens")
    return Trace.from_columns(name=name, arrival_s=arrival, packed=None, sort=sort,
                           report=_report(path, "azure", len(df), {}),
                           prompt_tokens=prompt, output_tokens=output)


def _load_burstgpt(path: Path, *, sort: bool, name: str) -> Trace:
    df = _read_csv(path, ("Timestamp", "Request tokens", "Response tokens"))
    arrival = _numeric(path, df, "Timestamp", integer=False)
    prompt = _numeric(path, df, "Request tokens", integer=True)
    output = _numeric(path, df, "Response tokens", integer=True)
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
    return Trace.from_columns(name=name, arrival_s=arrival[keep], packed=None, sort=sort,
                           report=rep, prompt_tokens=prompt[keep], output_tokens=output[keep],
                           tenant=tenant)


def _load_mooncake(path: Path, *, sort: bool, name: str) -> Trace:
    ts: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    blocks: list[list[int]] = []
    n_lines = 0
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            n_lines += 1
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}: line {lineno}: invalid JSON ({exc})") from None
            if not isinstance(d, dict):
                raise TraceError(f"{path}: line {lineno}: expected a JSON object")
            for key in ("timestamp", "input_length", "output_length"):
                v = d.get(key)
                if v is None:
                    raise TraceError(f"{path}: line {lineno}: missing field {key!r}")
                if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                        not math.isfinite(v):
                    raise TraceError(f"{path}: line {lineno}, field {key!r}: not a finite "
                                     f"number: {v!r}")
            il, ol = d["input_length"], d["output_length"]
            for key, v in (("input_length", il), ("output_length", ol)):
                if v != int(v) or v <= 0:
                    raise TraceError(f"{path}: line {lineno}, field {key!r}: must be a "
                                     f"positive integer, got {v!r}")
            hid = d.get("hash_ids")
            if hid is not None:
                if not isinstance(hid, list) or not all(
                        isinstance(h, int) and not isinstance(h, bool) and h >= 0
                        for h in hid):
                    raise TraceError(f"{path}: line {lineno}, field 'hash_ids': must be a "
                                     "list of non-negative integers")
                want = -(-int(il) // MOONCAKE_BLOCK_TOKENS)
                if len(hid) != want:
                    raise TraceError(
                        f"{path}: line {lineno}, field 'hash_ids': {len(hid)} blocks for "
                        f"input_length {il} (expected ceil({il}/{MOONCAKE_BLOCK_TOKENS}) = "
                        f"{want})")
                blocks.append(hid)
            ts.append(d["timestamp"] / 1000.0)
            inp.append(int(il))
            out.append(int(ol))
    if n_lines == 0:
        raise TraceError(f"{path}: file is empty")
    if blocks and len(blocks) != n_lines:
        raise TraceError(f"{path}: 'hash_ids' is present on some lines only "
                         f"({len(blocks)} of {n_lines})")
    arrival = np.asarray(ts, dtype=np.float64)
    packed = pack_blocks(blocks, n_lines, source=str(path)) if blocks else None
    return Trace.from_columns(name=name, arrival_s=arrival, packed=packed, sort=sort,
                           report=_report(path, "mooncake", n_lines, {}),
                           prompt_tokens=np.asarray(inp, np.int64),
                           output_tokens=np.asarray(out, np.int64),
                           block_tokens=MOONCAKE_BLOCK_TOKENS if blocks else 0)


def _load_lengths(path: Path, *, sort: bool, name: str, rate_per_s: float | None,
                  seed: int) -> Trace:
    first = _first_line(path)
    cols = {c.strip() for c in first.split(",")}
    session = None
    if {"history_tokens", "prompt_tokens", "response_tokens"} <= cols:
        df = _read_csv(path, ("conv_index", "history_tokens", "prompt_tokens",
                              "response_tokens"))
        hist = _numeric(path, df, "history_tokens", integer=True)
        prompt = hist + _numeric(path, df, "prompt_tokens", integer=True)
        output = _numeric(path, df, "response_tokens", integer=True)
        session = _numeric(path, df, "conv_index", integer=True)
        pcol, ocol = "history_tokens+prompt_tokens", "response_tokens"
    else:
        df = _read_csv(path, ("num_prefill_tokens", "num_decode_tokens"))
        prompt = _numeric(path, df, "num_prefill_tokens", integer=True)
        output = _numeric(path, df, "num_decode_tokens", integer=True)
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
    rep = _report(path, "lengths", len(df), {f"zero-token prompt ({pcol})": int(zp.sum()),
                                             f"zero-token output ({ocol})": int(zo.sum())})
    return Trace.from_columns(name=name, arrival_s=arrival, packed=None, sort=sort, report=rep,
                           prompt_tokens=prompt[keep], output_tokens=output[keep],
                           session_id=None if session is None else session[keep])
