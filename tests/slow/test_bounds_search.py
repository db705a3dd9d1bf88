"""A longer hypothesis search for the cost-model bound (proofs/cost-bound.md): 2,000
round-model and 200 analytic-model instances of many concurrent requests on long shared
prefixes in a tight KV pool, every non-speculative registered policy, with preemption,
chunked prefill and parents drawn (tests/strategies.py, "bounds"). No bound may be above
a simulated value of the same metric."""
from __future__ import annotations

from hypothesis import given, settings

from tests.properties.test_bounds_vs_sim import NON_SPECULATIVE, assert_below
from tests.strategies import tight_shared_prefix_instances


@settings(max_examples=2000)
@given(tight_shared_prefix_instances(NON_SPECULATIVE, max_size=24))
def test_cost_bound_search_round_model(case):
    inst, name, policy = case
    assert_below(inst, policy, name, check=True)


@settings(max_examples=200)
@given(tight_shared_prefix_instances(NON_SPECULATIVE, max_size=12, analytic=True))
def test_cost_bound_search_analytic_model(case):
    inst, name, policy = case
    assert_below(inst, policy, name, check=True)
