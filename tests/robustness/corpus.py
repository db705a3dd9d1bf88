"""A generated corpus of malformed (and awkward but valid) trace files.

Every case is made by this script (no checked-in binaries): :func:`cases` lists them,
:func:`materialize` writes one into a folder (a file, a gzip stream, a FIFO, a folder, a
dangling link...). Each case says what must happen when any loader or CLI entry point
reads it:

* ``expect="error"``: a clear error: the API raises a ``ValueError`` / ``OSError`` kind
  (``TraceError``, ``FileNotFoundError``) and the CLI exits with code 2, and the message
  names the file and every string of ``needles`` (the line, the file's own field name,
  its own value); never a traceback, never a hang;
* ``expect="accept"``: a documented acceptance (``note`` says which rule of
  ``lpserve/trace/loaders.py`` accepts it); the trace loads with ``n`` requests.

``python -m tests.robustness.corpus`` prints the cases.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZ_ROWS = ("2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109",
           "2023-11-16 18:15:51.5000000,120,20")
BG_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
BG_ROWS = ("5,ChatGPT,472,18,490,Conversation log", "45,ChatGPT,1087,12,1099,Conversation log",
           "60,GPT-4,300,40,340,Conversation log")
SA_HEAD = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"
SA_ROWS = ("74,918,992,0.08", "290,905,1195,0.32", "12,40,52,0.3")
SG_HEAD = "conv_index,conv_id,turn,history_tokens,prompt_tokens,response_tokens"
SG_ROWS = ("0,a,0,0,34,244", "0,a,1,278,36,319", "1,b,0,0,20,30")


def mc(ts=0, il=600, ol=5, ids=(0, 1), **extra) -> str:
    """One Mooncake JSON line (``ids=None`` leaves ``hash_ids`` out)."""
    d = {"timestamp": ts, "input_length": il, "output_length": ol}
    if ids is not None:
        d["hash_ids"] = list(ids)
    d.update(extra)
    return json.dumps(d)


MC_ROWS = (mc(0, 600, 5, (0, 1)), mc(1000, 700, 9, (0, 2)), mc(2500, 300, 4, (3,)))


@dataclass(frozen=True)
class Case:
    """One corpus entry: ``filename`` holds ``data`` (``kind="file"``) or is a FIFO,
    a folder, a dangling symlink, or missing."""

    name: str
    filename: str
    data: bytes | None
    expect: str
    needles: tuple[str, ...] = ()
    note: str = ""
    kind: str = "file"
    n: int = 0
    blocks: bool = False


def text(head: str, rows, end: str = "\n") -> bytes:
    return (end.join([head, *rows]) + end).encode()


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _replace(rows, i: int, row: str) -> list[str]:
    out = list(rows)
    out[i] = row
    return out


def cases() -> list[Case]:
    """Every corpus case (more than 85)."""
    C: list[Case] = []

    def err(name, filename, data, *needles, kind="file"):
        C.append(Case(name, filename, data, "error", tuple(needles), kind=kind))

    def ok(name, filename, data, n, note, blocks=False):
        C.append(Case(name, filename, data, "accept", (), note, n=n, blocks=blocks))

    az = text(AZ_HEAD, AZ_ROWS)
    many = text(AZ_HEAD, [f"2023-11-16 18:{15 + i // 60:02d}:{i % 60:02d}.5,{100 + i},{1 + i % 50}"
                          for i in range(600)])
    # ------------------------------------------------------------------ any file
    err("empty file", "empty.csv", b"", "file is empty")
    err("only blank lines", "blank.csv", b"\n \n\n", "file is empty")
    err("binary garbage", "garbage.csv", bytes(range(128, 256)) * 4, "not UTF-8")
    err("unknown header", "unknown.csv", b"a,b,c\n1,2,3\n", "matches no known format")
    # a 2 MB value is quoted cut to 200 characters, with its length
    err("2 MB value in a CSV field", "az_huge_value.csv",
        text(AZ_HEAD, [AZ_ROWS[0], "2023-11-16 18:15:50.9951690," + "9" * 2_000_000 + ",5"]),
        "line 3", "'ContextTokens'", "... (2,000,002 characters)")
    err("2 MB value in a JSON field", "mc_huge_value.jsonl",
        ("\n".join([MC_ROWS[0], json.dumps({"timestamp": 1, "input_length": "x" * 2_000_000,
                                             "output_length": 3})]) + "\n").encode(),
        "line 2", "'input_length'", "... (2,000,002 characters)")
    err("a folder", "folder.csv", None, "is a directory", kind="dir")
    err("missing file", "missing.csv", None, "no such file", kind="missing")
    err("dangling symlink", "dangling.csv", None, "no such file", kind="dangling")
    err("FIFO with no writer", "pipe.csv", None, "FIFO", "not a regular file", kind="fifo")
    err("UTF-16 text", "utf16.csv", az.decode().encode("utf-16"), "not UTF-8",
        "UTF-16 byte-order mark")
    err("invalid UTF-8 in a row", "badbyte.csv", az.replace(b",396,", b",3\xff6,"),
        "not UTF-8")
    err("NUL bytes", "nul.csv", text(AZ_HEAD, _replace(AZ_ROWS, 1, "\0\0\0")), "line 3",
        "a NUL byte (binary data")
    # ------------------------------------------------------------------ gzip
    err("truncated gzip CSV", "trunc.csv.gz", gz(many)[:len(gz(many)) // 2], "truncated gzip")
    jl = ("\n".join(mc(i * 10, 600, 5, (0, 1)) for i in range(400)) + "\n").encode()
    err("truncated gzip JSONL", "trunc.jsonl.gz", gz(jl)[:len(gz(jl)) // 2], "truncated gzip")
    bad = bytearray(gz(many))
    bad[40:60] = b"\x00" * 20
    err("corrupt gzip CSV", "corrupt.csv.gz", bytes(bad), "cannot read")
    bad = bytearray(gz(jl))
    bad[30:50] = b"\xff" * 20
    err("corrupt gzip JSONL", "corrupt.jsonl.gz", bytes(bad), "cannot read")
    err("gzip magic only", "magic.csv.gz", b"\x1f\x8b", "cannot read")
    err("gzip of nothing", "nothing.csv.gz", gz(b""), "file is empty")
    ok("gzip CSV", "ok.csv.gz", gz(az), 3, "gzip detected from its magic bytes")
    # ------------------------------------------------------------------ encodings, layout
    ok("BOM Azure", "bom_azure.csv", b"\xef\xbb\xbf" + az, 3,
       "a UTF-8 byte-order mark is dropped")
    ok("BOM Azure gzip", "bom_azure.csv.gz", gz(b"\xef\xbb\xbf" + az), 3,
       "a UTF-8 byte-order mark is dropped")
    ok("BOM Mooncake", "bom_mooncake.jsonl", b"\xef\xbb\xbf" + ("\n".join(MC_ROWS) + "\n")
       .encode(), 3, "a UTF-8 byte-order mark is dropped", blocks=True)
    ok("BOM BurstGPT", "bom_burst.csv", b"\xef\xbb\xbf" + text(BG_HEAD, BG_ROWS), 3,
       "a UTF-8 byte-order mark is dropped")
    ok("CRLF line ends", "crlf.csv", text(AZ_HEAD, AZ_ROWS, "\r\n"), 3, "CRLF line ends")
    ok("blank lines between rows", "blanks.csv",
       (AZ_HEAD + "\n" + AZ_ROWS[0] + "\n\n" + AZ_ROWS[1] + "\n\n\n" + AZ_ROWS[2] + "\n")
       .encode(), 3, "blank lines are skipped")
    err("blank line then a bad value (line numbers stay the file's)", "blank_bad.csv",
        (AZ_HEAD + "\n" + AZ_ROWS[0] + "\n\n\n" + "2023-11-16 18:15:52.0,abc,3\n").encode(),
        "line 5", "'ContextTokens'", "'abc'")
    ok("spaces around fields", "spaces.csv",
       text(AZ_HEAD, ["2023-11-16 18:15:46.68, 374 , 44", "2023-11-16 18:15:50.99,  396,109"]),
       2, "spaces around CSV fields are ignored")
    ok("no final newline", "nonl.csv", az.rstrip(b"\n"), 3, "the last row needs no newline")
    # ------------------------------------------------------------------ Azure
    def az_row(i, row, *needles, name, fn):
        err(name, fn, text(AZ_HEAD, _replace(AZ_ROWS, i, row)), *needles)

    az_row(1, "2023-11-16 18:15:50.99,abc,109", "line 3", "'ContextTokens'", "'abc'",
           name="Azure non-numeric ContextTokens", fn="az_text.csv")
    az_row(2, "2023-11-16 18:15:51.5,120,-4", "line 4", "'GeneratedTokens'", "'-4'",
           name="Azure negative GeneratedTokens", fn="az_neg.csv")
    az_row(0, "2023-11-16 18:15:46.68,12.5,44", "line 2", "'ContextTokens'", "'12.5'",
           name="Azure fractional ContextTokens", fn="az_frac.csv")
    az_row(1, "2023-11-16 18:15:50.99,1e20,109", "line 3", "'ContextTokens'", "'1e20'",
           "too large", name="Azure ContextTokens 1e20", fn="az_1e20.csv")
    az_row(1, "2023-11-16 18:15:50.99,99999999999999999999,109", "line 3", "'ContextTokens'",
           "'99999999999999999999'", "too large", name="Azure ContextTokens beyond int64",
           fn="az_int64.csv")
    az_row(1, "2023-11-16 18:15:50.99,9007199254740993,109", "line 3", "too large",
           name="Azure ContextTokens 2^53 + 1 (inexact in float64)", fn="az_2p53.csv")
    az_row(1, "2023-11-16 18:15:50.99,nan,109", "line 3", "'ContextTokens'", "'nan'",
           name="Azure ContextTokens nan", fn="az_nan.csv")
    az_row(1, "2023-11-16 18:15:50.99,inf,109", "line 3", "'ContextTokens'", "'inf'",
           name="Azure ContextTokens inf", fn="az_inf.csv")
    az_row(1, "2023-11-16 18:15:50.99,-inf,109", "line 3", "'ContextTokens'", "'-inf'",
           name="Azure ContextTokens -inf", fn="az_ninf.csv")
    az_row(1, "2023-11-16 18:15:50.99,,109", "line 3", "'ContextTokens'", "empty, not a number",
           name="Azure empty ContextTokens", fn="az_empty_field.csv")
    az_row(1, "2023-11-16 18:15:50.99,0x10,109", "line 3", "'ContextTokens'", "'0x10'",
           name="Azure hexadecimal ContextTokens", fn="az_hex.csv")
    az_row(0, "2023-11-16 18:15:46.68,0,44", "line 2", "'ContextTokens'", "zero-length",
           name="Azure zero ContextTokens", fn="az_zero_in.csv")
    az_row(2, "2023-11-16 18:15:51.5,120,0", "line 4", "'GeneratedTokens'", "zero-length",
           name="Azure zero GeneratedTokens", fn="az_zero_out.csv")
    az_row(1, "yesterday,396,109", "line 3", "'TIMESTAMP'", "'yesterday'",
           name="Azure TIMESTAMP not a time", fn="az_badts.csv")
    az_row(1, "2023-13-45 99:99:99.0,396,109", "line 3", "'TIMESTAMP'",
           name="Azure TIMESTAMP out of range", fn="az_ts_range.csv")
    az_row(1, "2023-11-16 18:15:40.0,396,109", "line 3", "'TIMESTAMP'", "earlier than line 2",
           name="Azure out-of-order TIMESTAMP", fn="az_order.csv")
    az_row(1, "2023-11-16 18:15:50.99,396", "line 3", "2 fields", "'GeneratedTokens' is missing",
           name="Azure short row", fn="az_short.csv")
    az_row(1, "2023-11-16 18:15:50.99,396,109,7", "line 3", "4 fields",
           name="Azure long row", fn="az_long.csv")
    az_row(1, '"2023-11-16 18:15:50.99,396,109', "line 3", "unbalanced quote",
           name="Azure unbalanced quote", fn="az_quote.csv")
    err("Azure mixed UTC offsets and none", "az_tz_mixed.csv",
        text(AZ_HEAD, ["2023-11-16 18:15:46.68+00:00,374,44", "2023-11-16 18:15:50.99,396,109"]),
        "line 3", "'TIMESTAMP'", "UTC offset")
    ok("Azure different UTC offsets", "az_tz_offsets.csv",
       text(AZ_HEAD, ["2023-11-16 18:15:46.68+00:00,374,44",
                      "2023-11-16 19:15:50.99+01:00,396,109"]), 2,
       "TIMESTAMPs that all carry an offset are compared as UTC instants")
    err("Azure offsets out of order as instants", "az_tz_order.csv",
        text(AZ_HEAD, ["2023-11-16 18:15:46.68+00:00,374,44",
                       "2023-11-16 18:15:50.99+01:00,396,109"]), "line 3", "earlier than")
    err("Azure duplicated ContextTokens column", "az_dupcol.csv",
        text(AZ_HEAD + ",ContextTokens", [r + ",5" for r in AZ_ROWS]), "line 1",
        "'ContextTokens' appears twice")
    err("Azure missing GeneratedTokens column", "az_nocol.csv",
        text("TIMESTAMP,ContextTokens", [r.rsplit(",", 1)[0] for r in AZ_ROWS]),
        "looks like the azure format", "'GeneratedTokens'")
    err("Azure header only", "az_header.csv", text(AZ_HEAD, []), "no data rows")
    ok("Azure extra column", "az_extra.csv", text(AZ_HEAD + ",Note", [r + ",x" for r in AZ_ROWS]),
       3, "extra columns are ignored")
    ok("Azure integral float token count", "az_float_int.csv",
       text(AZ_HEAD, _replace(AZ_ROWS, 0, "2023-11-16 18:15:46.68,374.0,44")), 3,
       "an integral value written 374.0 is 374")
    ok("Azure equal timestamps", "az_ties.csv",
       text(AZ_HEAD, ["2023-11-16 18:15:46.0,374,44", "2023-11-16 18:15:46.0,396,109"]), 2,
       "equal arrival times are kept in file order")
    ok("Azure timestamps without fraction", "az_nofrac.csv",
       text(AZ_HEAD, ["2023-11-16 18:15:46,374,44", "2023-11-16 18:15:50,396,109"]), 2,
       "ISO 8601 times without a fractional part")
    # ------------------------------------------------------------------ BurstGPT
    def bg_row(i, row, *needles, name, fn):
        err(name, fn, text(BG_HEAD, _replace(BG_ROWS, i, row)), *needles)

    bg_row(1, "abc,ChatGPT,1087,12,1099,Conversation log", "line 3", "'Timestamp'", "'abc'",
           name="BurstGPT non-numeric Timestamp", fn="bg_ts.csv")
    bg_row(1, "inf,ChatGPT,1087,12,1099,Conversation log", "line 3", "'Timestamp'", "'inf'",
           name="BurstGPT infinite Timestamp", fn="bg_inf.csv")
    bg_row(1, "1e300,ChatGPT,1087,12,1099,Conversation log", "line 3", "'Timestamp'",
           "beyond 2^33 s", name="BurstGPT Timestamp 1e300", fn="bg_far.csv")
    bg_row(1, "45,ChatGPT,1e20,12,1099,Conversation log", "line 3", "'Request tokens'",
           "too large", name="BurstGPT Request tokens 1e20", fn="bg_big.csv")
    bg_row(2, "60,GPT-4,300,-1,340,Conversation log", "line 4", "'Response tokens'", "'-1'",
           name="BurstGPT negative Response tokens", fn="bg_neg.csv")
    bg_row(2, "1,GPT-4,300,40,340,Conversation log", "line 4", "'Timestamp'", "earlier than",
           name="BurstGPT out-of-order Timestamp", fn="bg_order.csv")
    err("BurstGPT every request failed", "bg_allfail.csv",
        text(BG_HEAD, [r.replace(",18,", ",0,").replace(",12,", ",0,").replace(",40,", ",0,")
                       for r in BG_ROWS]), "every one of the 3 rows is a failed request")
    err("BurstGPT duplicated Request tokens column", "bg_dup.csv",
        text(BG_HEAD + ",Request tokens", [r + ",1" for r in BG_ROWS]),
        "'Request tokens' appears twice")
    ok("BurstGPT failed rows", "bg_failed.csv",
       text(BG_HEAD, _replace(BG_ROWS, 1, "45,ChatGPT,1087,0,1087,Conversation log")), 2,
       "failed requests (zero response tokens) are dropped and counted in the report")
    ok("BurstGPT without Model", "bg_nomodel.csv",
       text("Timestamp,Request tokens,Response tokens", ["5,472,18", "45,1087,12"]), 2,
       "Model is optional (no tenants)")
    # ------------------------------------------------------------------ Mooncake
    def mc_err(rows, *needles, name, fn):
        err(name, fn, ("\n".join(rows) + "\n").encode(), *needles)

    mc_err([MC_ROWS[0], MC_ROWS[1], '{"timestamp": 3000, "input_length": 5'], "line 3",
           "invalid JSON", name="Mooncake truncated last line", fn="mc_trunc.jsonl")
    mc_err([MC_ROWS[0], "[1, 2, 3]"], "line 2", "expected a JSON object",
           name="Mooncake array line", fn="mc_array.jsonl")
    mc_err([MC_ROWS[0], json.dumps({"timestamp": 5, "output_length": 3})], "line 2",
           "missing field 'input_length'", name="Mooncake missing input_length",
           fn="mc_missing.jsonl")
    mc_err([MC_ROWS[0], mc(5, "600", 3, (0, 1))], "line 2", "'input_length'",
           "not a number: a JSON string '600'",
           name="Mooncake string input_length", fn="mc_str.jsonl")
    mc_err([MC_ROWS[0], mc(5, 1e20, 3, None)], "line 2", "'input_length'", "too large",
           name="Mooncake input_length 1e20", fn="mc_1e20.jsonl")
    mc_err([MC_ROWS[0], mc(5, 10 ** 20, 3, None)], "line 2", "'input_length'",
           "100000000000000000000", "too large", name="Mooncake input_length 10^20",
           fn="mc_int20.jsonl")
    mc_err([MC_ROWS[0], mc(5, 0, 3, ())], "line 2", "'input_length'", "positive integer",
           name="Mooncake zero input_length", fn="mc_zero.jsonl")
    mc_err([MC_ROWS[0], mc(5, 600, -2, (0, 1))], "line 2", "'output_length'", "-2",
           name="Mooncake negative output_length", fn="mc_neg.jsonl")
    mc_err([MC_ROWS[0], mc(5, 600.5, 3, (0, 1))], "line 2", "'input_length'", "600.5",
           name="Mooncake fractional input_length", fn="mc_frac.jsonl")
    mc_err([MC_ROWS[0], mc(5, True, 3, None)], "line 2", "'input_length'",
           "not a number: JSON true",
           name="Mooncake boolean input_length", fn="mc_bool.jsonl")
    mc_err([MC_ROWS[0], '{"timestamp": NaN, "input_length": 6, "output_length": 5}'],
           "line 2", "'timestamp'", "nan", name="Mooncake NaN timestamp", fn="mc_nan.jsonl")
    mc_err([MC_ROWS[0], '{"timestamp": Infinity, "input_length": 6, "output_length": 5}'],
           "line 2", "'timestamp'", "inf", name="Mooncake infinite timestamp",
           fn="mc_inf.jsonl")
    mc_err([MC_ROWS[0], mc(1e300, 600, 3, (0, 1))], "line 2", "'timestamp'", "beyond 2^33",
           name="Mooncake timestamp 1e300 ms", fn="mc_far.jsonl")
    mc_err([MC_ROWS[1], MC_ROWS[0]], "line 2", "'timestamp'", "earlier than line 1",
           name="Mooncake out-of-order timestamp", fn="mc_order.jsonl")
    mc_err([MC_ROWS[0], '{"timestamp": 5, "input_length": 600, "output_length": 3, '
            '"hash_ids": "0,1"}'], "line 2", "'hash_ids'", "must be a list",
           name="Mooncake hash_ids not a list", fn="mc_ids_str.jsonl")
    mc_err([MC_ROWS[0], mc(5, 600, 3, (0, -1))], "line 2", "'hash_ids'", "-1",
           name="Mooncake negative hash id", fn="mc_ids_neg.jsonl")
    mc_err([MC_ROWS[0], mc(5, 600, 3, (0, 2 ** 70))], "line 2", "'hash_ids'",
           str(2 ** 70), name="Mooncake hash id 2^70", fn="mc_ids_big.jsonl")
    mc_err([MC_ROWS[0], mc(5, 600, 3, (0, 1.5))], "line 2", "'hash_ids'", "1.5",
           name="Mooncake fractional hash id", fn="mc_ids_frac.jsonl")
    mc_err([MC_ROWS[0], mc(5, 600, 3, (0, 1, 2))], "line 2", "'hash_ids'",
           "3 blocks for input_length 600", name="Mooncake hash_ids of the wrong length",
           fn="mc_ids_len.jsonl")
    mc_err([MC_ROWS[0], mc(5, 600, 3, None)], "'hash_ids' is present on some lines only",
           name="Mooncake hash_ids on some lines only", fn="mc_ids_some.jsonl")
    mc_err([MC_ROWS[0], '{"timestamp": 5, "input_length": 600, "input_length": 7, '
            '"output_length": 3}'], "line 2", "'input_length' appears twice",
           name="Mooncake duplicated key", fn="mc_dupkey.jsonl")
    mc_err([MC_ROWS[0], '{"timestamp": 5, "input_length": 6, "output_length": 3, }'],
           "line 2", "invalid JSON", name="Mooncake trailing comma", fn="mc_comma.jsonl")
    err("Mooncake JSON of another format", "mc_other.jsonl",
        b'{"time": 0, "prompt": 5, "completion": 3}\n', "match no known format")
    ok("Mooncake blank lines", "mc_blank.jsonl",
       ("\n" + MC_ROWS[0] + "\n\n" + MC_ROWS[1] + "\n  \n" + MC_ROWS[2] + "\n").encode(), 3,
       "blank lines are skipped", blocks=True)
    ok("Mooncake extra keys", "mc_extra.jsonl",
       ("\n".join(mc(i * 10, 600, 3, (0, 1), extra_key="x") for i in range(3)) + "\n")
       .encode(), 3, "extra JSON keys are ignored", blocks=True)
    ok("Mooncake without hash_ids", "mc_noids.jsonl",
       ("\n".join(mc(i * 10, 600, 3, None) for i in range(3)) + "\n").encode(), 3,
       "hash_ids is optional (no prefix blocks)")
    ok("Mooncake gzip with BOM", "mc_bom.jsonl.gz",
       gz(b"\xef\xbb\xbf" + ("\n".join(MC_ROWS) + "\n").encode()), 3,
       "a UTF-8 byte-order mark is dropped", blocks=True)
    ok("Mooncake epoch-millisecond timestamps", "mc_epoch.jsonl",
       ("\n".join(mc(1.7e12 + i * 1000, 600, 3, (0, 1)) for i in range(3)) + "\n").encode(),
       3, "epoch milliseconds are within 2^33 s", blocks=True)
    # ------------------------------------------------------------------ kv-cache-tester
    def kv(**change) -> dict:
        reqs = [{"t": 0, "type": "n", "in": 32, "out": 5, "hash_ids": [0, 1]},
                {"t": 1.5, "type": "n", "in": 48, "out": 7, "hash_ids": [0, 1, 2]}]
        reqs[1].update(change)
        return {"id": "s1", "block_size": 16, "hash_id_scope": "local", "requests": reqs}

    ok("kv-cache-tester without stop or output_types", "kv_nostop.jsonl",
       (json.dumps(kv()) + "\n").encode(), 2, "both fields are optional: wait kind unknown",
       blocks=True)
    err("kv-cache-tester in as a string", "kv_in_str.jsonl",
        (json.dumps(kv(**{"in": "48"})) + "\n").encode(), "line 1", "field 'in'",
        "got a JSON string '48'")
    err("kv-cache-tester out null", "kv_out_null.jsonl",
        (json.dumps(kv(out=None)) + "\n").encode(), "line 1", "field 'out'", "got JSON null")
    err("kv-cache-tester in beyond 2^53", "kv_in_big.jsonl",
        (json.dumps(kv(**{"in": 10**30})) + "\n").encode(), "line 1", "field 'in'",
        "too large")
    err("kv-cache-tester out beyond 2^53", "kv_out_big.jsonl",
        (json.dumps(kv(out=2**53)) + "\n").encode(), "line 1", "field 'out'", "too large")
    deep = "[" * 100_000 + "]" * 100_000
    err("kv-cache-tester line nested too deeply", "kv_deep.jsonl",
        (json.dumps(kv()) + "\n" + '{"requests": [], "block_size": 16, "x": ' + deep
         + "}\n").encode(), "line 2", "nested too deeply")
    err("first line nested too deeply", "deep_first.jsonl",
        ('{"x": ' + deep + "}\n").encode(), "line 1", "nested too deeply")
    err("Mooncake line nested too deeply", "mc_deep.jsonl",
        (MC_ROWS[0] + "\n" + '{"timestamp": 1, "x": ' + deep + "}\n").encode(), "line 2",
        "nested too deeply")
    # ------------------------------------------------------------------ length tables
    def sa_row(i, row, *needles, name, fn):
        err(name, fn, text(SA_HEAD, _replace(SA_ROWS, i, row)), *needles)

    sa_row(1, "x,905,1195,0.32", "line 3", "'num_prefill_tokens'", "'x'",
           name="Sarathi non-numeric num_prefill_tokens", fn="sa_text.csv")
    sa_row(1, "290,1e20,1195,0.32", "line 3", "'num_decode_tokens'", "too large",
           name="Sarathi num_decode_tokens 1e20", fn="sa_big.csv")
    sa_row(1, "290,-905,1195,0.32", "line 3", "'num_decode_tokens'", "'-905'",
           name="Sarathi negative num_decode_tokens", fn="sa_neg.csv")
    err("Sarathi every row zero", "sa_zero.csv", text(SA_HEAD, ["0,5,5,0", "7,0,7,1"]),
        "every row has a zero-token prompt or output")
    err("Sarathi duplicated num_prefill_tokens", "sa_dup.csv",
        text(SA_HEAD + ",num_prefill_tokens", [r + ",1" for r in SA_ROWS]), "appears twice")
    ok("Sarathi some zero rows", "sa_somezero.csv",
       text(SA_HEAD, _replace(SA_ROWS, 1, "0,905,905,0")), 2,
       "zero-token rows are dropped and counted in the report")

    def sg_row(i, row, *needles, name, fn):
        err(name, fn, text(SG_HEAD, _replace(SG_ROWS, i, row)), *needles)

    sg_row(1, "0,a,1,-278,36,319", "line 3", "'history_tokens'", "'-278'",
           name="ShareGPT negative history_tokens", fn="sg_neg.csv")
    sg_row(2, "b,b,0,0,20,30", "line 4", "'conv_index'", "'b'",
           name="ShareGPT non-numeric conv_index", fn="sg_conv.csv")
    sg_row(1, "0,a,1,4503599627370496,4503599627370496,319", "line 3",
           "history_tokens + prompt_tokens", "too large",
           name="ShareGPT history + prompt beyond 2^53", fn="sg_sum.csv")
    sg_row(1, "0,a,1,278,36", "line 3", "5 fields", "'response_tokens' is missing",
           name="ShareGPT short row", fn="sg_short.csv")
    ok("ShareGPT turns", "sg_ok.csv", text(SG_HEAD, SG_ROWS), 3,
       "a turn's prompt is its history plus its own tokens")
    return C


def materialize(case: Case, folder: Path) -> Path:
    """Create ``case`` under ``folder``; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / case.filename
    if case.kind == "file":
        p.write_bytes(case.data or b"")
    elif case.kind == "dir":
        p.mkdir(exist_ok=True)
    elif case.kind == "fifo":
        if not p.exists():
            os.mkfifo(p)
    elif case.kind == "dangling":
        if not p.is_symlink():
            p.symlink_to(folder / "no-such-target.csv")
    elif case.kind != "missing":
        raise ValueError(f"unknown case kind {case.kind!r}")
    return p


if __name__ == "__main__":  # pragma: no cover
    for c in cases():
        print(f"{c.expect:<7} {c.filename:<26} {c.name}")
    print(f"{len(cases())} cases")
