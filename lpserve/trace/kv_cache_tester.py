"""Reader of the ``kv-cache-tester`` sessions format (agentic coding sessions; schema in
:mod:`lpserve.trace.loaders`): :func:`read_sessions` gives the sessions on their own clocks
as :class:`~lpserve.trace.sessions.Sessions`."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from lpserve.trace import WAIT_TOOL, WAIT_USER, LoadReport, TraceError
from lpserve.trace.columns import MAX_COUNT, json_value
from lpserve.trace.sessions import Sessions
from lpserve.trace.textio import READ_ERRORS, check_regular_file, open_text, read_error

__all__ = ["read_sessions"]

_STOP_USER = ("end_turn", "stop_sequence")
_STOP_KNOWN = ("tool_use", "", "max_tokens", "pause_turn", "refusal") + _STOP_USER
_REQ_TYPES = ("n", "s", "subagent")


def _wait_kind(stop: str, output_types: list) -> int:
    if stop == "tool_use":
        return WAIT_TOOL
    if stop in _STOP_USER:
        return WAIT_USER
    if stop == "" and "tool_use" in output_types:
        return WAIT_TOOL
    return -1


def read_sessions(path: str | os.PathLike, *, indices: Any = None) -> Sessions:
    """Read a ``kv-cache-tester`` sessions file (plain or gzipped) into
    :class:`~lpserve.trace.sessions.Sessions` (see the module docstring for the schema).

    ``indices``: read only the sessions on these lines (0-based, counting non-empty lines;
    the others are not parsed). Errors name the file, line, request and field.
    """
    path = Path(path)
    check_regular_file(path)
    want = None if indices is None else {int(i) for i in indices}
    cols: dict[str, list] = {k: [] for k in ("t", "in", "out", "wait", "agent", "side",
                                             "prev", "blocks")}
    offsets, names = [0], []
    dropped = {"zero output tokens": 0, "zero input tokens": 0}
    block_tokens = None
    base = 0
    n_read = 0
    line_no = -1
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        line_no += 1
        if want is not None and line_no not in want:
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: line {lineno}: invalid JSON ({exc})") from None
        except RecursionError:
            raise TraceError(f"{path}: line {lineno}: JSON nested too deeply") from None
        where = f"{path}: line {lineno}"
        if not isinstance(d, dict) or not isinstance(d.get("requests"), list):
            raise TraceError(f"{where}: expected a JSON object with a 'requests' list")
        bs = d.get("block_size")
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise TraceError(f"{where}, field 'block_size': must be a positive integer, "
                             f"got {bs!r}")
        if block_tokens is not None and bs != block_tokens:
            raise TraceError(f"{where}, field 'block_size': {bs} differs from the "
                             f"{block_tokens} of earlier sessions")
        block_tokens = bs
        scope = d.get("hash_id_scope", "local")
        if scope != "local":
            raise TraceError(f"{where}, field 'hash_id_scope': only 'local' (ids unique "
                             f"within a session) is supported, got {scope!r}")
        rows: list[tuple] = []  # (t, order, agent, parent agent, request dict)
        parent_of = [-1]
        _flatten(d["requests"], 0.0, 0, parent_of, rows, where)
        rows.sort(key=lambda r: (r[0], r[1]))
        n_read += len(rows)
        last_of: dict[int, int] = {}
        top = 0
        lo = len(cols["t"])
        for t, _, agent, r, arr in rows:
            tin, tout = r["in"], r["out"]
            if tin == 0 or tout == 0:
                dropped["zero input tokens" if tin == 0 else "zero output tokens"] += 1
                continue
            if arr.size != tin // bs:
                raise TraceError(f"{where}: a request at t={t} has {arr.size} hash_ids for "
                                 f"in={tin} (expected in // block_size = {tin // bs})")
            if arr.size:
                top = max(top, int(arr.max()) + 1)
            cols["blocks"].append(arr + base)
            i = len(cols["t"])
            p = last_of.get(agent)
            if p is None and parent_of[agent] >= 0:
                p = last_of.get(parent_of[agent])
            cols["prev"].append(-1 if p is None else p)
            last_of[agent] = i
            cols["t"].append(t)
            cols["in"].append(tin)
            cols["out"].append(tout)
            cols["wait"].append(_wait_kind(r.get("stop", ""), r.get("output_types", [])))
            cols["agent"].append(agent)
            cols["side"].append(r["type"] == "s")
        if len(cols["t"]) == lo:
            raise TraceError(f"{where}: the session has no request with input and output "
                             "tokens")
        t0 = cols["t"][lo]
        cols["t"][lo:] = [x - t0 for x in cols["t"][lo:]]
        base += top
        offsets.append(len(cols["t"]))
        names.append(str(d.get("id", f"line {lineno}")))
    if not names:
        raise TraceError(f"{path}: no session read" + ("" if want is None else
                                                       f" at lines {sorted(want)[:5]}..."))
    lengths = np.fromiter((b.size for b in cols["blocks"]), np.int64, len(cols["blocks"]))
    boffs = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=boffs[1:])
    rep = LoadReport(source=str(path), format="kv-cache-tester", n_read=n_read,
                     n_kept=len(cols["t"]),
                     dropped=tuple((k, v) for k, v in dropped.items() if v))
    return Sessions(offsets=np.asarray(offsets, np.int64), t_s=np.asarray(cols["t"], float),
                    prompt_tokens=np.asarray(cols["in"], np.int64),
                    output_tokens=np.asarray(cols["out"], np.int64),
                    block_flat=np.concatenate(cols["blocks"]), block_offsets=boffs,
                    block_tokens=int(block_tokens), wait_kind=np.asarray(cols["wait"], np.int64),
                    agent=np.asarray(cols["agent"], np.int64),
                    side=np.asarray(cols["side"], bool), prev=np.asarray(cols["prev"], np.int64),
                    names=tuple(names), report=rep)


def _lines(path: Path):
    """``(line number, line)`` of the text of ``path``; a damaged file raises a
    :class:`TraceError` naming it and the line."""
    lineno = 0
    try:
        with open_text(path) as f:
            for lineno, line in enumerate(f, start=1):
                yield lineno, line
    except READ_ERRORS as exc:
        raise read_error(path, exc, f"line {lineno + 1}") from None


def _flatten(requests: list, clock_s: float, agent: int, parent_of: list[int],
             rows: list, where: str) -> None:
    """Append ``(t, order, agent, request, block ids)`` for every request of ``requests`` (an agent's
    list) and, recursively, of its sub-agents, with times on the session's clock."""
    for j, r in enumerate(requests):
        at = f"{where}, agent {agent} request {j}"
        if not isinstance(r, dict):
            raise TraceError(f"{at}: expected a JSON object")
        kind = r.get("type")
        if kind not in _REQ_TYPES:
            raise TraceError(f"{at}, field 'type': expected one of {_REQ_TYPES}, got {kind!r}")
        t = r.get("t")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                or t < 0:
            raise TraceError(f"{at}, field 't': must be a finite number >= 0, got "
                             f"{json_value(t)}")
        if kind == "subagent":
            if not isinstance(r.get("requests"), list):
                raise TraceError(f"{at}: a subagent needs a 'requests' list")
            parent_of.append(agent)
            _flatten(r["requests"], clock_s + t, len(parent_of) - 1, parent_of, rows, where)
            continue
        for key in ("in", "out"):
            v = r.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise TraceError(f"{at}, field {key!r}: must be an integer >= 0, "
                                 f"got {json_value(v)}")
            if v >= MAX_COUNT:
                raise TraceError(f"{at}, field {key!r}: {str(v)[:200]} is too large "
                                 f"(limit {MAX_COUNT - 1})")
        hid = r.get("hash_ids")
        arr = np.asarray(hid if isinstance(hid, list) else None)
        if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0)):
            raise TraceError(f"{at}, field 'hash_ids': must be a list of integers >= 0")
        stop, ot = r.get("stop", ""), r.get("output_types", [])
        if stop not in _STOP_KNOWN:
            raise TraceError(f"{at}, field 'stop': unknown value {stop!r} (known: "
                             f"{_STOP_KNOWN})")
        if not isinstance(ot, list):
            raise TraceError(f"{at}, field 'output_types': must be a list")
        rows.append((clock_s + t, len(rows), agent, r, arr.astype(np.int64)))
