"""The serving front end's latency (``models/simulator.md`` (33)): TTFT, E2E and the
client's times move by exactly ``frontend_latency_s``; TPOT and queue times do not; a
dependant is released at its parent's finish as the client sees it."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.trace import generate as G

H100 = dict(gpu="h100-sxm", llm="llama-3.1-8b")


def _run(front_s: float, reference: bool) -> dict[str, np.ndarray]:
    tr = G.synthetic(60, arrivals=G.Poisson(4.0), prompt=G.Uniform(100, 2000),
                     output=G.Uniform(10, 200), seed=3)
    cost = lp.cost_model(**H100, engine="vllm", frontend_latency_s=front_s)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(**H100), cost=cost)
    return lp.simulate(inst, "vllm", reference=reference, check=reference).arrays


@pytest.mark.parametrize("reference", [False, True])
def test_latency_shifts_what_the_client_sees_and_nothing_else(reference):
    a, b = _run(0.0, reference), _run(0.05, reference)
    assert list(a["status"]) == list(b["status"]) and (a["status"] == "finished").all()
    for k in ("ttft_s", "e2e_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(b[k] - a[k], 0.05, rtol=0, atol=1e-9, err_msg=k)
    for k in ("tpot_s", "queue_s", "first_scheduled_s", "release_s"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    np.testing.assert_allclose(b["ttft_s"], b["first_token_s"] - b["arrival_s"], atol=1e-12)


def test_the_default_h100_profile_carries_the_fitted_latency_and_old_ones_none():
    assert lp.cost_model(**H100, engine="vllm").frontend_latency_s > 0
    assert lp.cost_model(**H100, calibration="splitwise-h100").frontend_latency_s == 0
    assert lp.cost_model(gpu="a100-80gb", llm="llama-2-7b").frontend_latency_s == 0


def test_dependant_is_released_at_the_parents_finish_as_the_client_sees_it():
    tr = lp.Trace.from_arrays(arrival_s=[0.0, 1e-6], prompt_tokens=[10, 10],
                              output_tokens=[5, 3], parent=np.array([-1, 0]),
                              program_id=np.zeros(2, np.int64))
    cost = lp.UnitRoundCost(memory_tokens=1000)
    cost.frontend_latency_s = 0.25
    inst = lp.Instance(trace=tr, cost=cost,
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=1))
    for reference in (False, True):
        a = lp.simulate(inst, "vllm", reference=reference, check=True).arrays
        assert a["finish_s"][0] == 5.25 and a["release_s"][1] == 5.25
        assert a["first_scheduled_s"][1] == 5.25 and a["e2e_s"][1] == 3.25


@pytest.mark.parametrize("bad", [-0.001, float("nan"), float("inf"), "10ms", True])
def test_bad_latency_is_refused_with_its_value(bad):
    with pytest.raises(ValueError, match="frontend_latency_s must be a finite number >= 0"):
        lp.cost_model(**H100, frontend_latency_s=bad)
