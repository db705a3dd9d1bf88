"""The quantum-tick arithmetic shared by the time-sliced schedulers and the simulator.

Regression for ``RuntimeError: internal: empty decode run``: the next tick used to be
``(floor(now / q) + 1) * q``, which equals ``now`` where the division rounds down
(``8.1 / 0.05 = 161.99999999999997``), so a decode run stopped before its first iteration.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.opt import load_instance
from lpserve.policies.schedulers import TickCached
from lpserve.policy import next_tick_s, tick_index
from lpserve.registry import make_policy, policy_names
from tests.strategies import (
    fast_and_reference,
    needs_analytic_cost,
    quantum_boundaries,
    unit_round_instances,
)


def test_the_rounding_case_of_the_report():
    assert 8.1 / 0.05 < 162 and 162 * 0.05 == 8.1  # what the old formula missed
    assert tick_index(8.1, 0.05) == 162
    assert next_tick_s(8.1, 0.05) == 163 * 0.05 > 8.1
    assert (math.floor(8.1 / 0.05) + 1) * 0.05 == 8.1  # the old boundary: no progress


@settings(max_examples=300, deadline=None)
@given(quantum_boundaries())
def test_next_tick_is_strictly_later_and_starts_the_next_tick(case):
    now, q = case
    k = tick_index(now, q)
    assert k * q <= now < (k + 1) * q
    nxt = next_tick_s(now, q)
    assert nxt > now
    assert tick_index(nxt, q) == k + 1
    # every time in [now, nxt) shares now's tick: a run stopped at nxt sees a new tick
    assert tick_index(float(np.nextafter(nxt, -np.inf)), q) == k


def test_tick_cached_schedulers_use_the_shared_tick():
    scheds = {n: make_policy(n).scheduler for n in policy_names()}
    ticked = sorted(n for n, s in scheds.items() if s.quantum_s is not None)
    assert {"las", "mlfq", "fastserve", "plas", "mcsf", "slo-aware", "rr-sched"} <= set(ticked)
    # every time-sliced registered scheduler takes its tick from tick_index (TickCached)
    assert all(isinstance(scheds[n], TickCached) for n in ticked)


def _reproducer(analytic: bool = False) -> lp.Instance:
    tr = lp.Trace.from_arrays(arrival_s=np.array([0.1, 1.1]), prompt_tokens=[1, 1],
                              output_tokens=[1, 13])
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                       cost=None if analytic else lp.UnitRoundCost(memory_tokens=64),
                       slo=lp.SLO(ttft_s=4.0, tpot_s=2.0))  # for the SLO-mirroring policies


@pytest.mark.parametrize("name", policy_names())
def test_reproducers_pass_for_every_registered_policy(name):
    small, _ = load_instance("small")
    shifted = small.with_(trace=small.trace.shifted(0.1), slo=lp.SLO(ttft_s=2.0, tpot_s=0.1))
    if needs_analytic_cost(name):  # refuses the round model by design, with a clear error
        with pytest.raises(ValueError, match="needs an analytic cost model"):
            lp.simulate(_reproducer(), name)
        cases = [_reproducer(analytic=True)]
    else:
        cases = [_reproducer(), shifted]
    for inst in cases:
        fast, _ = fast_and_reference(inst, make_policy(name), label=name)
        a = fast.arrays  # every request finishes or is reported with a reason
        assert np.all((a["status"] == "finished") | (a["reason"] != "")), name


#: registered policies whose scheduler re-ranks every quantum (the ones the report found)
TICKED = [n for n in policy_names() if make_policy(n).scheduler.quantum_s is not None]


@settings(max_examples=25, deadline=None)
@given(unit_round_instances(disaggregated=None), st.sampled_from(TICKED))
def test_fractional_round_model_arrivals_fast_equals_reference(inst, name):
    fast, _ = fast_and_reference(inst, make_policy(name), label=name)
    a = fast.arrays
    assert np.all((a["status"] == "finished") | (a["reason"] != ""))


class _SwapPricedRound(lp.UnitRoundCost):
    """The round model with swaps priced at 1 ms per block (one way), so every swapped
    block shows in the request times."""

    def swap_time_s(self, n_blocks: int, block_tokens: int = 16) -> float:
        return 1e-3 * int(n_blocks)


@pytest.mark.parametrize("cost", [lp.UnitRoundCost(memory_tokens=13),
                                  _SwapPricedRound(memory_tokens=13)])
def test_swaps_piled_up_between_iterations_are_priced_alike(cost):
    # found by the fractional-arrivals test above: FastServe swaps 37 blocks of a 13-block
    # pool between two iterations (preempted, resumed and preempted again, priced together
    # in the next iteration); the compiled engine's swap-time table ended at 2 * 13 + 1
    # blocks and read past its end (a garbage finish time or an empty decode run)
    tr = lp.Trace.from_arrays(arrival_s=np.array([0.0, 3.05, 7.1, 11.05]),
                              prompt_tokens=[1, 6, 8, 7], output_tokens=[1, 6, 8, 7])
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1), cost=cost)
    for _ in range(3):  # a stale read depends on what the memory held before
        fast, ref = fast_and_reference(inst, make_policy("fastserve"), label="fastserve")
    assert ref.stats["swaps"] > 0 and np.isfinite(ref.arrays["finish_s"][[0, 1, 3]]).all()
