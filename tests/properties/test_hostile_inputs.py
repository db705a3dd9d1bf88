"""Hostile inputs drawn at random: malformed numbers, wrapped files, damaged stores.

* a bad token count anywhere in an Azure file is refused with the file, its line, the
  field's own name and its own text in the message; nothing wraps around int64;
* the same file plain, gzipped, BOM-prefixed or with CRLF ends loads to the same trace;
  cut anywhere inside its gzip stream it is refused as truncated or corrupt;
* a sweep store with a damaged part keeps exactly the intact rows, so every cell it still
  reports as finished holds its original values.
"""
from __future__ import annotations

import gzip

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.sweep import ResultStore
from lpserve.trace import TraceError
from tests.strategies import STORE_DAMAGE, azure_texts, bad_count_texts, file_wrappings


@settings(max_examples=40, deadline=None)
@given(azure_texts(), st.data())
def test_a_bad_count_is_named_with_its_line_and_text(case, data):
    import tempfile
    from pathlib import Path

    text, n = case
    lines = text.splitlines()
    row = data.draw(st.integers(1, n))
    col = data.draw(st.sampled_from([1, 2]))
    bad = data.draw(bad_count_texts())
    fields = lines[row].split(",")
    fields[col] = bad
    lines[row] = ",".join(fields)
    name = ("ContextTokens", "GeneratedTokens")[col - 1]
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.csv"
        p.write_text("\n".join(lines) + "\n")
        try:
            lp.load_trace(p)
        except TraceError as exc:
            msg = str(exc)
        else:
            raise AssertionError(f"{bad!r} in {name} was accepted")
    assert str(p) in msg and f"line {row + 1}" in msg and repr(name) in msg, msg
    assert repr(bad) in msg or "zero-length" in msg, msg
    assert "-9223372036854775808" not in msg


@settings(max_examples=25, deadline=None)
@given(azure_texts(), st.data())
def test_wrapped_files_load_the_same_and_truncated_gzip_is_refused(case, data):
    import tempfile
    from pathlib import Path

    text, n = case
    raw = text.encode()
    wrapped, suffix = data.draw(file_wrappings(raw))
    with tempfile.TemporaryDirectory() as d:
        plain, other = Path(d) / "a.csv", Path(d) / f"b.csv{suffix}"
        plain.write_bytes(raw)
        other.write_bytes(wrapped)
        a, b = lp.load_trace(plain), lp.load_trace(other)
        assert len(a) == n and a.digest() == b.digest()
        z = gzip.compress(raw, mtime=0)
        cut = data.draw(st.integers(2, len(z) - 1))
        bad = Path(d) / "cut.csv.gz"
        bad.write_bytes(z[:cut])
        try:
            lp.load_trace(bad)
        except TraceError as exc:
            assert str(bad) in str(exc) and ("truncated" in str(exc)
                                             or "cannot read" in str(exc)), str(exc)
        else:
            raise AssertionError(f"a gzip stream cut at byte {cut} of {len(z)} was accepted")


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["parquet", "csv"]), st.lists(st.sampled_from(STORE_DAMAGE),
                                                     min_size=1, max_size=3), st.data())
def test_a_damaged_store_keeps_exactly_the_intact_rows(fmt, damage, data):
    import tempfile
    from pathlib import Path

    import pandas as pd

    from lpserve.sweep.store import have_pyarrow

    if fmt == "parquet" and not have_pyarrow():
        fmt = "csv"
    rows = [{"cell": f"c{i}", "status": "ok", "error": "", "result_digest": f"d{i}",
             "x": float(i) / 3, "k": i} for i in range(9)]
    with tempfile.TemporaryDirectory() as d:
        store = ResultStore(Path(d) / "s", format=fmt)
        parts = [store.write_part(rows[i:i + 3]) for i in range(0, 9, 3)]
        for what in damage:
            p = parts[data.draw(st.integers(0, 2))]
            b = p.read_bytes()
            if what == "truncate":  # a share, not a byte count: part sizes vary by run
                p.write_bytes(b[:int(data.draw(st.floats(0, 0.999)) * len(b))])
            elif what == "edit":
                try:
                    df = store._read_part(p)
                except Exception:  # already damaged beyond reading
                    df = pd.DataFrame()
                if len(df):
                    df.loc[df.index[0], "x"] = -1.0
                    df.to_parquet(p) if fmt == "parquet" else df.to_csv(p, index=False)
            elif what == "forge":
                forged = pd.DataFrame([{"cell": "c0", "status": "ok", "error": "",
                                        "result_digest": "", "x": np.nan}])
                q = p.with_name(p.name.replace("part-", "part-9"))
                forged.to_parquet(q) if fmt == "parquet" else forged.to_csv(q, index=False)
            elif what == "garbage":
                p.write_bytes(data.draw(st.binary(min_size=1, max_size=64)))
            else:
                p.write_bytes(b"")
        df = store.read()
        want = {r["cell"]: r for r in rows}
        for rec in df.to_dict("records"):
            w = want[rec["cell"]]
            assert rec["x"] == w["x"] and int(rec["k"]) == w["k"] and \
                rec["result_digest"] == w["result_digest"], rec
