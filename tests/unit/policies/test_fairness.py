"""VTC's counter rules on hand-made views (lpserve/policies/fairness.py): the admission
order interleaves tenants by virtual counter, prompt and output charges and weights,
the lift of a tenant that (re)joins the backlog, and the tiered admission caps and
deadlines."""
from __future__ import annotations

import math

import numpy as np
import pytest

import lpserve as lp
from lpserve.arrays import readonly
from lpserve.policies.fairness import VTC, TieredShedding, vtc_bound
from lpserve.policy import SchedulerView


def view(now, req, tenant, running, prompt=None, gen=None, arrival=None, replica=0):
    n = len(req)
    f = lambda x, d: readonly(np.asarray(d if x is None else x))
    return SchedulerView(
        now_s=now, replica=replica, request=f(req, None).astype(np.int64),
        arrival_s=f(arrival, np.arange(n, dtype=float)).astype(float),
        prompt_tokens=f(prompt, np.full(n, 10)).astype(np.int64),
        generated_tokens=f(gen, np.zeros(n)).astype(np.int64),
        computed_tokens=readonly(np.zeros(n, np.int64)),
        cached_tokens=readonly(np.zeros(n, np.int64)),
        running=f(running, None).astype(bool), swapped=readonly(np.zeros(n, bool)),
        preemptions=readonly(np.zeros(n, np.int64)),
        first_scheduled_s=readonly(np.full(n, np.nan)),
        tenant=f(tenant, None).astype(np.int64), session_id=readonly(np.full(n, -1)),
        predicted_lo=None, predicted_hi=None, output_tokens=None, free_blocks=1000,
        total_blocks=1000, block_tokens=16)


def fresh(cls=VTC, **kw):
    s = cls(**kw)
    s.reset(None, np.random.default_rng(0))
    return s


def test_equal_counters_interleave_tenants_by_virtual_charge():
    s = fresh()
    r = s.rank(view(0.0, [0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 1, 1], [False] * 6))
    # each pick charges its prompt (10 tokens) to its tenant: 0, 1, 0, 1, 0, 1
    assert np.argsort(r, kind="stable").tolist() == [0, 3, 1, 4, 2, 5]


def test_running_requests_charge_prompt_and_output_and_keep_running():
    s = fresh(input_price=1.0, output_price=2.0)
    s.rank(view(0.0, [0, 1], [0, 1], [False, False], prompt=[100, 5]))
    r = s.rank(view(1.0, [0, 1, 2], [0, 1, 1], [True, False, False], prompt=[100, 5, 5],
                    gen=[3, 0, 0]))
    assert s.counter(0, 0) == 100 + 2 * 3
    assert r[0] < min(r[1], r[2])                 # a running request keeps its place
    assert s.service(0) == {0: (100, 3)}


def test_weights_divide_the_charges():
    s = fresh(weights={0: 4.0})
    s.rank(view(0.0, [0, 1], [0, 1], [True, True], prompt=[40, 40], gen=[2, 2]))
    assert s.counter(0, 0) == pytest.approx((40 + 2 * 2) / 4.0)
    assert s.counter(0, 1) == pytest.approx(40 + 2 * 2)


def test_a_rejoining_tenant_is_lifted_to_the_backlog_minimum():
    s = fresh()
    # tenant 0 is served (counter 10 + 2 * 50), tenant 1 idles
    s.rank(view(0.0, [0], [0], [False]))
    s.rank(view(1.0, [0, 1], [0, 0], [True, False], gen=[50, 0]))
    # tenant 1 arrives while tenant 0 still waits: lifted to tenant 0's counter
    s.rank(view(2.0, [0, 1, 2], [0, 0, 1], [True, False, False], gen=[60, 0, 0]))
    assert s.counter(0, 1) == pytest.approx(s.counter(0, 0))
    # an empty queue: a newcomer is lifted to the last leaver's counter
    s2 = fresh()
    s2.rank(view(0.0, [0], [0], [False]))
    s2.rank(view(1.0, [0], [0], [True], gen=[5]))
    left = s2.counter(0, 0)
    s2.rank(view(2.0, [1], [3], [False], arrival=[1.5]))
    assert s2.counter(0, 3) == pytest.approx(left)


def test_tiers_serve_strict_priority_and_shed_by_cap_and_deadline():
    s = fresh(TieredShedding, tiers={1: 1}, max_waiting={1: 2}, shed_after_s={1: 5.0})
    r = s.rank(view(0.0, [0, 1, 2, 3], [1, 1, 1, 0], [False] * 4))
    assert math.isinf(r[2])                  # the third tier-1 arrival exceeds the cap
    assert r[3] < r[0] < r[1]                # tier 0 first
    r = s.rank(view(6.0, [0, 1, 2, 3, 4], [1, 1, 1, 0, 1], [False, False, False, True, False],
                    arrival=[0.0, 0.0, 0.0, 0.0, 5.5]))
    assert math.isinf(r[0]) and math.isinf(r[1])   # waited 6 s > 5 s
    assert math.isfinite(r[4])
    assert s.shed == {0, 1, 2}


def test_bad_parameters_name_the_field():
    with pytest.raises(ValueError, match=r"weights\[0\]"):
        VTC(weights={0: 0.0})
    with pytest.raises(ValueError, match="input_price"):
        VTC(input_price=-1)
    with pytest.raises(ValueError, match="max_running"):
        vtc_bound(10, 10, 0)
    with pytest.raises(ValueError, match="budget_controller"):
        lp.make_policy("vtc", budget_controller=None)


def test_policy_wires_the_scheduler_as_its_meter():
    pol = lp.make_policy("vtc", weights={0: 2.0}, max_num_seqs=8)
    assert pol.engine.budget_controller is pol.scheduler
    assert pol.engine.max_num_seqs == 8 and pol.scheduler.weights == {0: 2.0}
