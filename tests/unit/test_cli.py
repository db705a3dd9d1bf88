"""The ``lpserve`` CLI: help on every command, JSON output, one-line errors."""
from __future__ import annotations

import json

import pytest

from lpserve.cli import build_parser, main


def _subcommands(parser):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield name, sub
                for child, subsub in _subcommands(sub):
                    yield f"{name} {child}", subsub


def test_help_on_every_command(capsys):
    assert main(["--help"]) == 0
    names = [n for n, _ in _subcommands(build_parser())]
    assert "trace stats" in names
    for name in names:
        assert main(name.split() + ["--help"]) == 0
        assert "usage:" in capsys.readouterr().out


def test_every_leaf_command_has_json():
    for name, sub in _subcommands(build_parser()):
        if not any(a.__class__.__name__ == "_SubParsersAction" for a in sub._actions):
            assert any("--json" in a.option_strings for a in sub._actions), name


def test_trace_stats_bundled_text_and_json(capsys):
    assert main(["trace", "stats"]) == 0
    text = capsys.readouterr().out
    assert "requests   2,867" in text and "prompt" in text
    assert main(["trace", "stats", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["n_requests"] == 2867
    for key in ("duration_s", "rate_per_s", "prompt_tokens", "output_tokens"):
        assert key in d
    assert set(d["prompt_tokens"]) == {"mean", "p50", "p90", "p99", "max"}
    assert main(["trace", "stats", "mooncake-conv-5min", "--json"]) == 0
    assert 0 < json.loads(capsys.readouterr().out)["infinite_cache_hit_rate"] < 1


def test_errors_are_one_line_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.1,x,3\n")
    assert main(["trace", "stats", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv: line 2, field 'ContextTokens'" in err and "Traceback" not in err
    assert main(["trace", "stats", str(bad), "--json"]) == 2
    assert "error" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("argv, needle", [
    (["trace", "--json"], "SUBCOMMAND"),
    (["list", "--json"], "what"),
    (["simulate", "--json", "--no-such-flag"], "--no-such-flag"),
])
def test_bad_arguments_with_json_still_print_one_json_object(argv, needle, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    obj = json.loads(out)
    assert obj["error"].startswith("ArgumentError:") and needle in obj["error"]
    assert needle in err  # argparse's usage and message stay on stderr
