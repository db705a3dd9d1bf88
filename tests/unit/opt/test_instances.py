"""Certified instances reproduce their recorded values; the CLI reports them."""
from __future__ import annotations

import json

import pytest

from lpserve.instance import instance_names, load_instance
from lpserve.opt import solve
from lpserve.opt.exact import KVProblem, kv_optimal

NAMES = instance_names()


def test_instances_exist():
    assert {"toy", "tiny", "small"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_certified_values_reproduce(name):
    inst, spec = load_instance(name)
    for formulation, value in spec["optimal"].items():
        sol = solve(formulation, inst, time_limit_s=60)
        assert sol.status.value == "optimal", (formulation, sol.message)
        assert sol.objective == pytest.approx(value, rel=1e-6, abs=1e-6), formulation
    assert spec["optimal"]["schedule-ip"] >= max(v for k, v in spec["optimal"].items()
                                                 if k != "schedule-ip")


@pytest.mark.parametrize("name", [n for n in NAMES if n in ("toy", "tiny")])
def test_small_instances_equal_dynamic_program(name):
    inst, spec = load_instance(name)
    assert kv_optimal(KVProblem.from_instance(inst))[0] == spec["optimal"]["schedule-ip"]


def test_cli_solve_and_bound(capsys):
    from lpserve.cli import main

    assert main(["solve", "schedule-ip", "--instance", "tiny", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "optimal" and out["matches_certified"] is True
    assert out["gap"] == 0 and out["objective"] == out["certified"]
    assert main(["bound", "cost-bound", "--instance", "toy"]) == 0
    text = capsys.readouterr().out
    assert "status     optimal" in text and "bound" in text
    assert main(["solve", "schedule-ip", "--instance", "tiny", "--memory-tokens", "3",
                 "--json"]) == 0
    bad = json.loads(capsys.readouterr().out)
    assert bad["status"] == "infeasible" and "request" in bad["message"]
    assert main(["solve", "nope", "--instance", "tiny"]) == 2
    assert main(["solve", "schedule-ip", "--instance", "no-such-instance"]) == 2
