"""Loaders: format detection, gzip, real fixtures, and clear errors on bad input."""
from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

import lpserve as lp
from lpserve.trace import TraceError
from lpserve.trace.loaders import detect_format


def test_detects_every_fixture_format(fixtures):
    assert detect_format(fixtures / "azure_code_40.csv") == "azure"
    assert detect_format(fixtures / "burstgpt_12.csv") == "burstgpt"
    assert detect_format(fixtures / "mooncake_30.jsonl") == "mooncake"
    assert detect_format(fixtures / "mooncake_30.jsonl.gz") == "mooncake"
    assert detect_format(fixtures / "sharegpt8k_50.csv") == "lengths"
    assert detect_format(fixtures / "sharegpt_turns_40.csv") == "lengths"


def test_azure_fixture(fixtures):
    t = lp.load_trace(fixtures / "azure_code_40.csv")
    assert len(t) == 40 and t.arrival_s[0] == 0.0
    # first two rows: 18:17:03.9799600 (4808, 10) and 18:17:04.0319600 (3180, 8)
    assert t.arrival_s[1] == pytest.approx(0.052, abs=1e-6)
    assert t.prompt_tokens[:2].tolist() == [4808, 3180]
    assert t.output_tokens[:2].tolist() == [10, 8]
    assert t.report.format == "azure" and t.report.n_dropped == 0


def test_gzip_and_plain_give_the_same_trace(fixtures):
    a = lp.load_trace(fixtures / "mooncake_30.jsonl")
    b = lp.load_trace(fixtures / "mooncake_30.jsonl.gz")
    assert a.digest() == b.digest()
    assert a.block_tokens == 512 and a.blocks(0)[0] == 0
    assert all(len(a.blocks(i)) == -(-a.prompt_tokens[i] // 512) for i in range(len(a)))


def test_burstgpt_failed_rows_dropped_and_counted(fixtures):
    t = lp.load_trace(fixtures / "burstgpt_12.csv")
    assert len(t) == 9
    dropped = dict(t.report.dropped)
    assert dropped["failed request (zero response tokens)"] == 2
    assert dropped["zero request tokens"] == 1
    assert t.report.n_read == 12 and t.report.n_kept == 9
    assert set(t.tenant.tolist()) == {0, 1}  # ChatGPT, GPT-4


def test_lengths_tables(fixtures):
    t = lp.load_trace(fixtures / "sharegpt8k_50.csv")
    assert len(t) == 50 and np.all(t.arrival_s == 0)
    t2 = lp.load_trace(fixtures / "sharegpt8k_50.csv", rate_per_s=2.0, seed=3)
    assert t2.arrival_s[0] == 0 and np.all(np.diff(t2.arrival_s) >= 0)
    assert t2.digest() == lp.load_trace(fixtures / "sharegpt8k_50.csv", rate_per_s=2.0,
                                        seed=3).digest()
    turns = lp.load_trace(fixtures / "sharegpt_turns_40.csv")
    # prompt = history + own tokens: row 2 of the file is turn 1 of record 0: 278 + 36
    assert turns.prompt_tokens[1] == 278 + 36
    assert turns.session_id is not None


def test_rate_refused_for_timed_formats(fixtures):
    with pytest.raises(TraceError, match="rate_per_s applies to untimed"):
        lp.load_trace(fixtures / "azure_code_40.csv", rate_per_s=1.0)


def test_bundled_traces():
    t = lp.bundled_trace()
    assert len(t) == 2867 and t.name == "azure-conv-10min"
    m = lp.load_trace("mooncake-conv-5min")
    assert m.has_blocks and len(m) == 918


# ----------------------------------------------------------------------------- bad input
def _write(tmp_path, name, text, gz=False):
    p = tmp_path / name
    if gz:
        with gzip.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


@pytest.mark.parametrize("text, match", [
    ("", "file is empty"),
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n",
     r"looks like the azure format but lacks column\(s\) 'GeneratedTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no data rows"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,abc,5\n",
     r"line 2, field 'ContextTokens': not a finite number: 'abc'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,NaN,5\n",
     r"line 2, field 'ContextTokens'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,-3,5\n",
     "negative token count '-3'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0,5\n",
     "zero-length request"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,4.5,5\n",
     "not an integer"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,4,5\n",
     "field 'TIMESTAMP': not a timestamp: 'yesterday'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:47.0,4,5\n"
     "2023-11-16 18:15:46.0,4,5\n", "line 3, field .TIMESTAMP.: .2023-11-16 18:15:46.0. is earlier than line 2"),
])
def test_bad_azure(tmp_path, text, match):
    p = _write(tmp_path, "bad.csv", text)
    with pytest.raises(TraceError, match=match) as ei:
        lp.load_trace(p)
    assert "bad.csv" in str(ei.value)


def test_out_of_order_sorted_with_count(tmp_path):
    p = _write(tmp_path, "ooo.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
               "2023-11-16 18:15:47.0,4,5\n2023-11-16 18:15:46.0,7,5\n"
               "2023-11-16 18:15:48.0,9,5\n", gz=True)
    t = lp.load_trace(p, sort=True)
    assert t.prompt_tokens.tolist() == [7, 4, 9]
    assert t.report.n_reordered == 2


def test_missing_column_named(tmp_path):
    p = _write(tmp_path, "m.csv", "Timestamp,Model,Request tokens,Foo\n1,a,2,3\n")
    with pytest.raises(TraceError, match=r"looks like the burstgpt format but lacks column\(s\) .Response tokens."):
        lp.load_trace(p)
    with pytest.raises(TraceError, match=r"missing column\(s\) \['Response tokens'\]"):
        lp.load_trace(p, format="burstgpt")


@pytest.mark.parametrize("line, match", [
    ('{"timestamp": 0, "input_length": 10, "output_length": 5}\nnot json\n',
     "line 2: invalid JSON"),
    ('{"timestamp": 0, "input_length": 10}\n', "match no known format"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 5}\n',
     "field 'input_length': must be a positive integer, got 0"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]}\n',
     r"1 blocks for input_length 600 \(expected ceil\(600/512\) = 2\)"),
    ('{"timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": [-1]}\n',
     "hash_ids.: -1 is not an integer in"),
    ('{"timestamp": NaN, "input_length": 6, "output_length": 5}\n', "not a finite number"),
])
def test_bad_mooncake(tmp_path, line, match):
    p = _write(tmp_path, "bad.jsonl", line)
    with pytest.raises(TraceError, match=match):
        lp.load_trace(p)


def test_missing_file_and_unknown_format(tmp_path, fixtures):
    with pytest.raises(FileNotFoundError, match="no such file"):
        lp.load_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="unknown trace format 'parquet'"):
        lp.load_trace(fixtures / "azure_code_40.csv", format="parquet")
    with pytest.raises(TraceError, match="is a directory"):
        lp.load_trace(tmp_path)


def test_truncated_gzip_is_reported(tmp_path, fixtures):
    src = fixtures / "mooncake_30.jsonl.gz"
    data = src.read_bytes()
    p = tmp_path / "trunc.jsonl.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises((TraceError, EOFError, OSError)):
        lp.load_trace(p)
    shutil.copy(src, tmp_path / "ok.jsonl.gz")
    assert len(lp.load_trace(tmp_path / "ok.jsonl.gz")) == 30
