"""The real traces in ../shared/traces load with the counts and statistics that their
README states (skipped with a reason where that folder is absent; the bundled trace and
the fixtures cover the same loaders then)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lpserve as lp

# file -> (rows kept, rows read, prompt mean/p50/p90/p99/max, output mean/p50/p90/p99/max)
EXPECTED = {
    "azure_llm_2023_code_first30min.csv.gz":
        (5740, 5740, (2028, 1460, 5012, 7436, 7437), (27.4, 13, 53, 247, 1899)),
    "azure_llm_2023_conv_first30min.csv.gz":
        (10108, 10108, (1243, 1033, 4076, 4123, 14050), (217, 134, 427, 610, 1000)),
    "mooncake_fast25_conversation_first30min.jsonl.gz":
        (5719, 5719, (12870, 7640, 28638, 91207, 123192), (346, 356, 608, 1105, 2000)),
    "sharegpt_8k_llama2_lengths.csv.gz":
        (30731, 30731, (2340, 1730, 5696, 7434, 8141), (439, 415, 834, 998, 1024)),
    "arxiv_summarization_llama2_lengths.csv.gz":
        (28257, 28257, (2588, 2730, 3702, 3933, 4054), (291, 167, 372, 3271, 4056)),
    "bwb_llama2_lengths.csv.gz":
        (33768, 33768, (1067, 1037, 1453, 1800, 3504), (1613, 1601, 2149, 2533, 2858)),
}
KEYS = ("mean", "p50", "p90", "p99", "max")


def _close(got: float, want: float) -> bool:
    # the README rounds to integers (one decimal below 100)
    return abs(got - want) <= (0.051 if want < 100 else 0.51)


@pytest.mark.parametrize("fname", sorted(EXPECTED))
def test_counts_and_token_statistics(shared_traces, fname):
    rows, read, p, o = EXPECTED[fname]
    t = lp.load_trace(shared_traces / fname)
    s = t.stats()
    assert s["n_requests"] == rows and t.report.n_read == read
    for key, want in (("prompt_tokens", p), ("output_tokens", o)):
        for k, w in zip(KEYS, want):
            assert _close(s[key][k], w), (fname, key, k, s[key][k], w)


def test_timed_traces_rates_and_spans(shared_traces):
    code = lp.load_trace(shared_traces / "azure_llm_2023_code_first30min.csv.gz").stats()
    conv = lp.load_trace(shared_traces / "azure_llm_2023_conv_first30min.csv.gz").stats()
    moon = lp.load_trace(shared_traces /
                         "mooncake_fast25_conversation_first30min.jsonl.gz").stats()
    assert code["rate_per_s"] == pytest.approx(3.21, abs=0.005)
    assert conv["rate_per_s"] == pytest.approx(5.62, abs=0.005)
    assert moon["rate_per_s"] == pytest.approx(3.18, abs=0.005)
    assert moon["duration_s"] == 1797.0
    assert code["interarrival_cv"] == pytest.approx(13.5, abs=0.05)
    assert conv["interarrival_cv"] == pytest.approx(1.07, abs=0.005)
    assert moon["n_blocks"] == 146464 and moon["distinct_blocks"] == 96534
    assert moon["infinite_cache_hit_rate"] == pytest.approx(0.341, abs=0.0005)


def test_sharegpt_turns(shared_traces):
    """41,702 turns; 6 have no prompt at all (history + own tokens = 0) and 3 have an
    empty response: they cannot be served and are dropped with counts. Response-token
    statistics match the README (the 3 zero rows do not move them at this rounding)."""
    t = lp.load_trace(shared_traces / "sharegpt_v3_turn_lengths_part1.csv.gz")
    assert t.report.n_read == 41702 and len(t) == 41702 - 9
    assert dict(t.report.dropped) == {
        "zero-token prompt (history_tokens+prompt_tokens)": 6,
        "zero-token output (response_tokens)": 3}
    o = t.stats()["output_tokens"]
    for k, w in zip(KEYS, (281.8, 256, 552, 769, 22267)):
        assert _close(o[k], w)
    assert t.stats()["distinct_session_id"] == 11820 - 1  # one record has only dropped turns


def test_cli_trace_stats_json_on_shared_file(shared_traces):
    out = subprocess.run(
        [sys.executable, "-m", "lpserve.cli", "trace", "stats", "--json",
         str(shared_traces / "mooncake_fast25_conversation_first30min.jsonl.gz")],
        check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    assert d["n_requests"] == 5719
    assert round(100 * d["infinite_cache_hit_rate"], 1) == 34.1


def test_bundled_sharegpt_first_turns_are_the_shared_rows(shared_traces):
    """``lpserve/data/sharegpt_v3_first_turn_lengths.csv.gz`` holds exactly the first turns
    (with a prompt and a response) of the shared per-turn table, in its order: the seed
    benchmarks draw the same requests with or without the shared data."""
    from pathlib import Path

    import numpy as np
    import pandas as pd

    d = pd.read_csv(shared_traces / "sharegpt_v3_turn_lengths_part1.csv.gz")
    d = d[(d.turn == 0) & (d.prompt_tokens > 0) & (d.response_tokens > 0)]
    b = pd.read_csv(Path(lp.__file__).parent / "data" / "sharegpt_v3_first_turn_lengths.csv.gz")
    assert len(b) == len(d) == 11_776
    for col in ("conv_index", "prompt_tokens", "response_tokens"):
        assert np.array_equal(b[col].to_numpy(), d[col].to_numpy()), col
