"""EngineConfig.schedule_ahead (vLLM's async scheduling, models/simulator.md (32)): an
arrival while an iteration runs joins the iteration after the next; an idle replica admits
at once; compiled and reference runs agree."""
from __future__ import annotations

import pytest

import lpserve as lp


def _run(arrival_s: float, ahead: bool, reference: bool = False) -> lp.Result:
    tr = lp.Trace.from_arrays(arrival_s=[0.0, arrival_s], prompt_tokens=[200, 100],
                              output_tokens=[60, 5])
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b"))
    pol = lp.make_policy("vllm", schedule_ahead=ahead)
    return lp.simulate(inst, pol, seed=0, reference=reference)


@pytest.mark.parametrize("reference", [False, True])
def test_arrival_during_an_iteration_waits_one_more_iteration(reference):
    t = 0.3  # request 0 is decoding then
    plain, ahead = _run(t, False, reference), _run(t, True, reference)
    a, b = plain.arrays, ahead.arrays
    cost = lp.cost_model(gpu="a100-80gb", llm="llama-2-7b")
    step_s = cost.batch_time_s([], [], [260])  # one decode of request 0 alone
    lag = b["first_scheduled_s"][1] - a["first_scheduled_s"][1]
    assert 0.9 * step_s < lag < 1.1 * step_s
    # the same prefill iteration one iteration later (request 0's context one token longer)
    assert b["ttft_s"][1] == pytest.approx(a["ttft_s"][1] + lag, abs=0.01 * step_s)
    assert a["first_scheduled_s"][0] == b["first_scheduled_s"][0] == 0.0


@pytest.mark.parametrize("reference", [False, True])
def test_an_idle_replica_admits_at_once(reference):
    t = 30.0  # request 0 finished long before
    plain, ahead = _run(t, False, reference), _run(t, True, reference)
    assert ahead.arrays["first_scheduled_s"][1] == plain.arrays["first_scheduled_s"][1] == t
    assert ahead.digest() == plain.digest()


def test_compiled_equals_reference():
    for t in (0.0, 0.05, 0.3, 0.61, 30.0):
        assert _run(t, True).digest() == _run(t, True, reference=True).digest(), t


def test_schedule_ahead_must_be_a_bool():
    with pytest.raises(ValueError, match="schedule_ahead must be a bool"):
        lp.make_policy("vllm", schedule_ahead="yes")
