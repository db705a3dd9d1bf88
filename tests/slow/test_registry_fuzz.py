"""Random (never derandomized) examples over every registered policy: no exception.

Each example is a registered policy on a round-model instance with fractional arrivals
(``UnitRoundCost``, one token per block, tight memory) or on a small analytic-cost
instance (bursts, tight KV pools, host swap space, disaggregation, horizons), simulated
in the fast and the reference mode with the invariant checker; the two must agree per
request. ``LPSERVE_FUZZ_EXAMPLES`` sets the number of examples (default 2,000).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from lpserve.registry import make_policy
from tests.strategies import fast_and_reference, registry_cases

EXAMPLES = int(os.environ.get("LPSERVE_FUZZ_EXAMPLES", "2000"))


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, derandomize=False, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
          print_blob=True)
@given(registry_cases())
def test_random_registry_examples_raise_nothing(case):
    inst, name = case
    fast, _ = fast_and_reference(inst, make_policy(name), seed=1, label=name)
    a = fast.arrays
    assert np.all((a["status"] == "finished") | (a["reason"] != "")), name
