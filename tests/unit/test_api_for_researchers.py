"""The Python API a researcher reaches for: ``lp.compare`` at a load or utilisation,
``lp.interval``, flat summaries, and a user's own policy on the command line."""
from __future__ import annotations

import json

import numpy as np
import pytest

import lpserve as lp
from lpserve.cli import main
from lpserve.evaluate.utilization import fluid_capacity


def _inst() -> lp.Instance:
    return lp.Instance(trace=lp.bundled_trace().head(60),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))


def test_compare_at_a_load_or_a_utilization():
    inst = _inst()
    base = lp.compare(inst, ["vllm"], bounds=[])
    twice = lp.compare(inst, ["vllm"], bounds=[], load=2.0)
    assert base.attrs["load"] == 1.0 and twice.attrs["load"] == 2.0
    direct = lp.compare(inst.with_(trace=inst.trace.scale_rate(2.0)), ["vllm"], bounds=[])
    assert twice["e2e_s_mean"].iloc[0] == direct["e2e_s_mean"].iloc[0]
    u = lp.compare(inst, ["vllm"], bounds=[], utilization=0.5)
    cap = fluid_capacity(inst)
    assert u.attrs["load"] == pytest.approx(cap.load_for(0.5))
    assert u.attrs["utilization"] == pytest.approx(0.5)
    assert twice.attrs["utilization"] == pytest.approx(2 * base.attrs["utilization"])
    for bad in (dict(load=0), dict(utilization=float("nan")), dict(load=2, utilization=0.5)):
        with pytest.raises(ValueError, match="compare: "):
            lp.compare(inst, ["vllm"], bounds=[], **bad)


def test_flat_summary_has_compares_column_names():
    inst = _inst()
    res = lp.simulate(inst, "vllm")
    nested, flat = res.summary(), res.summary(flat=True)
    assert flat["e2e_s_mean"] == nested["e2e_s"]["mean"]
    assert flat["ttft_s_p99"] == nested["ttft_s"]["p99"]
    assert flat["goodput_rps"] == nested["goodput_rps"]
    table = lp.compare(inst, ["vllm"], bounds=[], over="served")
    for k in ("e2e_s_mean", "ttft_s_p90", "tpot_s_p50", "throughput_rps"):
        assert table[k].iloc[0] == pytest.approx(flat[k]), k
    assert all(isinstance(v, (int, float)) for v in flat.values())


def test_interval_is_the_optimality_interval():
    small = lp.Instance(trace=lp.bundled_trace().head(12),
                        cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    iv = lp.interval(small, lp_time_limit_s=20, search_evaluations=30, search_time_limit_s=None)
    assert iv["lower_s"] <= iv["upper_s"] and iv["ratio"] == pytest.approx(
        iv["upper_s"] / iv["lower_s"])
    assert iv["n_requests"] == 12 and np.isfinite(iv["lower_s"])


def test_tail_intervals_hold_every_schedule_above_their_lower_end():
    """The p99 TTFT and p99 E2E intervals: the per-request cost bound's p99 is below the
    p99 of every simulated schedule (each request is above its own bound), and the best
    policy given is the upper end."""
    from lpserve.evaluate.bounds import QUANTILE_KEYS, quantile_intervals

    inst = lp.Instance(trace=lp.bundled_trace().head(80).scale_rate(4.0),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    tails = {}
    for name in ("vllm", "sarathi", "srpt-oracle", "las", "vllm-v0", "orca"):
        flat = lp.simulate(inst, name).summary(flat=True)
        if flat["n_finished"] == 80:
            tails[name] = {k: flat[k] for k in QUANTILE_KEYS}
    assert len(tails) >= 4
    iv = quantile_intervals(inst, tails)
    for key in QUANTILE_KEYS:
        q = iv[key]
        assert all(q["lower_s"] <= v[key] + 1e-12 for v in tails.values()), key
        assert q["upper_s"] == min(v[key] for v in tails.values())
        assert tails[q["upper_name"]][key] == q["upper_s"] and q["ratio"] >= 1.0
    none = quantile_intervals(inst)
    assert all(not np.isfinite(none[k]["upper_s"]) and none[k]["upper_name"] == ""
               for k in QUANTILE_KEYS)


def test_simulate_runs_a_users_policy_module_attr(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_policies.py").write_text(
        "import lpserve as lp\n"
        "SARATHI = lp.make_policy('sarathi')\n"
        "def chunked():\n    return lp.make_policy('vllm-chunked')\n"
        "NOT_A_POLICY = 3\n")
    monkeypatch.chdir(tmp_path)
    for spec, name in (("my_policies:SARATHI", "sarathi"), ("my_policies:chunked",
                                                           "vllm-chunked")):
        assert main(["simulate", "--head", "20", "--policy", spec, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["policy"] == spec and out["n_finished"] == 20, out
        ref = lp.simulate(lp.Instance(trace=lp.bundled_trace().head(20), cluster=lp.Cluster(
            gpu="a100-80gb", llm="llama-2-7b")), name).summary()
        assert out["e2e_s"]["mean"] == pytest.approx(ref["e2e_s"]["mean"])
    for spec, msg in (("my_policies:NOT_A_POLICY", "is a int, not a Policy"),
                      ("my_policies:nope", "has no 'nope'"),
                      ("no_such_module:X", "cannot import 'no_such_module'"),
                      ("nope", "unknown policy 'nope'")):
        assert main(["simulate", "--head", "5", "--policy", spec]) == 2
        assert msg in capsys.readouterr().err, spec
