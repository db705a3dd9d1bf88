"""The malformed-input corpus through every loader and CLI entry point, and bad CLI
arguments: a clear error (exit code 2, the file, line, field and value named) or a
documented acceptance; never a traceback, a silent acceptance or a hang.

The loader runs every case in the default tier; the CLI commands (``trace stats``,
``simulate``, ``cache``) run every case in the slow tier, in this process and, for a
few cases, as real ``lpserve`` processes.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.robustness.corpus import cases, materialize
from tests.robustness.harness import run, watchdog

CASES = cases()


def test_the_corpus_covers_the_audit():
    assert len(CASES) >= 85
    assert len({c.name for c in CASES}) == len(CASES)
    assert len({c.filename for c in CASES}) == len(CASES)
    assert all(c.note for c in CASES if c.expect == "accept")  # every acceptance documented
    kinds = {c.kind for c in CASES}
    assert {"fifo", "dir", "missing", "dangling"} <= kinds


@pytest.mark.parametrize("case", CASES, ids=[c.filename for c in CASES])
def test_loader(case, tmp_path):
    out = run(case, "api", materialize(case, tmp_path))
    assert out.ok, f"{out.why}: {out.message}"


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["stats", "simulate", "cache"])
@pytest.mark.parametrize("case", CASES, ids=[c.filename for c in CASES])
def test_cli(case, entry, tmp_path):
    out = run(case, entry, materialize(case, tmp_path))
    assert out.ok, f"{out.why}: {out.message}"


@pytest.mark.slow
@pytest.mark.parametrize("filename", ["pipe.csv", "trunc.jsonl.gz", "az_int64.csv",
                                      "mc_ids_big.jsonl", "az_dupcol.csv", "bom_azure.csv"])
def test_cli_processes(filename, tmp_path):
    case = next(c for c in CASES if c.filename == filename)
    path = materialize(case, tmp_path)
    r = subprocess.run([sys.executable, "-m", "lpserve.cli", "trace", "stats", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr
    if case.expect == "error":
        assert r.returncode == 2 and path.name in r.stderr, r.stderr
        assert all(s in r.stderr for s in case.needles), r.stderr
    else:
        assert r.returncode == 0, r.stderr


#: (argv, what the message must name) for bad arguments of every command
BAD_ARGS = [
    (["simulate", "--seed", "-1"], "--seed"),
    (["simulate", "--seed", "x"], "--seed"),
    (["simulate", "--replicas", "3", "--prefill-replicas", "2", "--decode-replicas", "1"],
     "--replicas 3 conflicts"),
    (["simulate", "--prefill-replicas", "2"], "--decode-replicas 0"),
    (["simulate", "--replicas", "0"], "--replicas"),
    (["simulate", "--tp", "0"], "--tp"),
    (["simulate", "--rate-scale", "0"], "--rate-scale"),
    (["simulate", "--rate-scale", "nan"], "--rate-scale"),
    (["simulate", "--rate-scale", "inf"], "--rate-scale"),
    (["simulate", "--head", "0"], "--head"),
    (["simulate", "--horizon", "-1"], "--horizon"),
    (["simulate", "--slo-ttft", "nan"], "--slo-ttft"),
    (["simulate", "--slo-tpot", "-0.1"], "--slo-tpot"),
    (["simulate", "--policy", "nope"], "unknown policy 'nope'"),
    (["simulate", "--decode-replicas", "-1"], "--decode-replicas"),
    (["trace", "stats", "--seed", "-1"], "--seed"),
    (["trace", "stats", "--rate", "0"], "--rate"),
    (["trace", "stats", "--rate", "inf"], "--rate"),
    (["trace", "stats", "--format", "csv"], "--format"),
    (["cache", "--capacity-blocks", "0"], "--capacity-blocks"),
    (["cache", "--capacity-blocks", "x"], "--capacity-blocks"),
    (["cache", "--capacity-blocks", "10", "--policies", ","], "--policies"),
    (["cache", "--capacity-blocks", "10", "--policies", "lru,,belady"], "--policies"),
    (["cache", "--capacity-blocks", "10", "--policies", ""], "--policies"),
    (["cache", "--capacity-blocks", "10", "--policies", "nope"], "unknown policies"),
    (["cache", "--capacity-blocks", "10", "--block-tokens", "0"], "--block-tokens"),
    (["cache", "--capacity-blocks", "10", "--block-tokens", "16"], "--block-tokens 16"),
    (["cache"], "--capacity-blocks"),
    (["solve", "schedule-ip", "--instance", "small", "--time-limit", "0"], "--time-limit"),
    (["solve", "schedule-ip", "--instance", "small", "--time-limit", "nan"], "--time-limit"),
    (["bound", "schedule-lp", "--instance", "small", "--time-limit", "-inf"],
     "--time-limit"),
    (["solve", "schedule-ip", "--instance", "small", "--memory-tokens", "0"],
     "--memory-tokens"),
    (["solve", "schedule-ip", "--instance", "bundled", "--replicas", "0"], "--replicas"),
    (["solve", "nope", "--instance", "small"], "unknown formulation 'nope'"),
    (["solve", "schedule-ip", "--instance", "no-such-instance"], "no-such-instance"),
    (["gap", "--seeds", "-1"], "--seeds"),
    (["gap", "--seeds", ","], "--seeds"),
    (["gap", "--policies", ","], "--policies"),
    (["gap", "--windows", "0"], "--windows"),
    (["gap", "--duration", "nan"], "--duration"),
    (["gap", "--load", "0"], "--load"),
    (["gap", "--loads", "1,x"], "--loads"),
    (["gap", "--replicas", "0"], "--replicas"),
    (["gap", "--tp", "-2"], "--tp"),
    (["sweep", "default", "--workers", "0"], "--workers"),
    (["sweep", "default", "--batch-size", "0"], "--batch-size"),
    (["sweep", "default", "--backend", "mpi"], "--backend"),
    (["sweep", "no-such-grid"], "no-such-grid"),
    (["cost", "--tp", "0", "--prefill", "10"], "--tp"),
    (["cost", "--prefill", "0"], "--prefill"),
    (["cost", "--prefill", "10", "--cached", "-1"], "--cached"),
    (["cost", "--decode-batch", "4"], "--context"),
    (["cost"], "--prefill"),
    (["capacity", "--slo-ttft", "1", "--slo-tpot", "0.1", "--seed", "-1"], "--seed"),
    (["capacity", "--slo-ttft", "1", "--slo-tpot", "0.1", "--replicas", "0"], "--replicas"),
    (["capacity", "--slo-ttft", "nan", "--slo-tpot", "0.1"], "--slo-ttft"),
    (["nope"], "invalid choice"),
    (["simulate", "--head", "5", "--mix", "a100-80gb:1,,h100-sxm:1"], "group 2 is empty"),
    (["simulate", "--head", "5", "--mix", "a100-80gb:1,"], "group 2 is empty"),
    (["calibrate", "--serving", "x.csv", "--gpu", "h100-sxm", "--llm", "llama-2-7b",
      "--max-num-batched-tokens", "-1"], "--max-num-batched-tokens must be >= 1"),
]


def test_no_error_message_carries_a_huge_value(tmp_path):
    """Every corpus error message stays under lpserve.trace.columns.MAX_MESSAGE characters
    (a 2 MB field is quoted cut to 200)."""
    from lpserve.trace.columns import MAX_MESSAGE, TraceError
    from lpserve.trace.loaders import load_trace

    for case in CASES:
        if case.expect != "error" or case.kind != "file":
            continue
        try:
            load_trace(materialize(case, tmp_path))
        except (ValueError, OSError) as exc:
            assert len(str(exc)) <= MAX_MESSAGE, (case.filename, len(str(exc)))
    assert len(str(TraceError("x" * 10**6))) <= MAX_MESSAGE


def test_misspelt_calibration_field_is_named_with_its_nearest(tmp_path):
    from lpserve.cost import cost_model

    path = tmp_path / "mine.toml"
    path.write_text('[[calibration]]\nname = "mine"\ngpu = "h100"\nllm = "*"\n'
                    'engine = "vllm"\neff_compte = 0.5\n')
    with pytest.raises(ValueError, match=r"mine.toml', entry 0 \('mine'\): unknown field "
                                         r"'eff_compte'; did you mean 'eff_compute'\?"):
        cost_model(gpu="h100-sxm", llm="llama-3.1-8b", calibration=str(path))
    path.write_text(path.read_text().replace("eff_compte", "zzz"))
    with pytest.raises(ValueError, match="unknown field 'zzz'; known: .*eff_compute"):
        cost_model(gpu="h100-sxm", llm="llama-3.1-8b", calibration=str(path))


@pytest.mark.parametrize("argv, needle", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_cli_arguments(argv, needle, capsys):
    from lpserve.cli import main

    with watchdog(120):
        rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert needle in err and "Traceback" not in err, err
