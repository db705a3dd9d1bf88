"""Simulator invariants on hypothesis instances: fast == reference, blocks, time, fates."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings

import lpserve as lp
from tests.strategies import sim_instances

FIELDS = ("first_scheduled_s", "first_token_s", "finish_s", "preemptions",
          "cached_prompt_tokens", "replica", "decode_replica", "status", "reason",
          "generated_tokens")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == object:
        return list(a) == list(b)
    return np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@settings(max_examples=200, deadline=None)
@given(sim_instances())
def test_fast_equals_reference_and_invariants_hold(case):
    inst, policy = case
    fast = lp.simulate(inst, policy, seed=3, check=True)
    ref = lp.simulate(inst, policy, seed=3, reference=True, check=True)
    for f in FIELDS:
        assert _same(fast.arrays[f], ref.arrays[f]), f
    assert fast.digest() == ref.digest()
    a = fast.arrays
    st = a["status"]
    # every request finishes or is reported with a reason
    assert np.all((st == "finished") | (a["reason"] != ""))
    if inst.horizon_s is None:
        assert np.all((st == "finished") | (st == "rejected")), set(a["reason"])
    # nobody runs before arrival; time never goes backwards within a request
    ran = np.isfinite(a["first_scheduled_s"])
    assert np.all(a["first_scheduled_s"][ran] >= a["arrival_s"][ran])
    tok = np.isfinite(a["first_token_s"])
    assert np.all(a["first_token_s"][tok] > a["first_scheduled_s"][tok] - 1e-12)
    fin = st == "finished"
    assert np.all(a["finish_s"][fin] >= a["first_token_s"][fin])
    assert np.all(a["generated_tokens"][fin] == a["output_tokens"][fin])
    assert np.all(a["generated_tokens"] <= a["output_tokens"])
    s = fast.summary()
    assert s["n_finished"] + s["n_rejected"] + s["n_unfinished"] == s["n_requests"]
    util = fast.stats["kv_utilization"]
    assert math.isnan(util) or 0.0 <= util <= 1.0 + 1e-9
