"""The rebalancing MILP (models/rebalancing.md (9)-(15)) equals brute force."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.opt.rebalance import (
    RebalanceModel,
    brute_force_rebalance,
    rebalance_objective,
    solve_rebalance,
)


@st.composite
def models(draw):
    R = draw(st.integers(2, 3))
    n = draw(st.integers(0, 5))
    src = np.array(draw(st.lists(st.integers(0, R - 1), min_size=n, max_size=n)), np.int64)
    running = np.bincount(src, minlength=R) + np.array(
        draw(st.lists(st.integers(0, 2), min_size=R, max_size=R)), np.int64)
    N = int(running.sum())
    a, b = draw(st.floats(0.0, 2.0)), draw(st.floats(0.0, 0.5))
    k = np.arange(N + 1, dtype=float)
    phi = a * k + b * k * k                                      # convex, Phi(0) = 0
    deficits, waits = [], []
    for _ in range(R):
        K = draw(st.integers(0, 3))
        steps = draw(st.lists(st.integers(1, 15), min_size=K, max_size=K))
        deficits.append(np.cumsum(np.array(steps, np.int64)))
        waits.append(np.array(draw(st.lists(st.floats(0.0, 5.0), min_size=K, max_size=K)),
                              np.float64))
    return RebalanceModel(
        source=src,
        blocks=np.array(draw(st.lists(st.integers(1, 20), min_size=n, max_size=n)), np.int64),
        cost_s=np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))),
        running=running.astype(np.int64), phi_s=phi,
        capacity_blocks=np.array(draw(st.lists(st.integers(0, 40), min_size=R, max_size=R)),
                                 np.int64),
        seats=np.array(draw(st.lists(st.integers(0, 3), min_size=R, max_size=R)), np.int64),
        deficit_blocks=tuple(deficits), wait_s=tuple(waits))


@settings(max_examples=150, deadline=None)
@given(models())
def test_milp_equals_brute_force(model):
    best, _ = brute_force_rebalance(model)
    sol = solve_rebalance(model)
    assert sol.solved, sol.message
    assert abs(sol.objective - best) <= 1e-6 * max(1.0, abs(best))
    # the MILP's moves attain its objective under the independent evaluator
    got = rebalance_objective(model, sol.primal["destination"])
    assert abs(got - sol.objective) <= 1e-6 * max(1.0, abs(best))


def test_a_blocked_queue_is_relieved_by_moving_blocks_out():
    # replica 0: two decoding requests of 10 blocks, one waiting request short of 8 blocks;
    # replica 1 idle with room. Moving either request frees enough; the cheaper one moves.
    m = RebalanceModel(source=np.array([0, 0]), blocks=np.array([10, 10]),
                       cost_s=np.array([0.2, 0.1]), running=np.array([2, 0]),
                       phi_s=np.zeros(3), capacity_blocks=np.array([0, 50]),
                       seats=np.array([0, 4]), deficit_blocks=(np.array([8]), np.zeros(0, int)),
                       wait_s=(np.array([3.0]), np.zeros(0)))
    sol = solve_rebalance(m)
    assert list(sol.primal["destination"]) == [-1, 1]
    assert abs(sol.objective - 2.9) < 1e-9
    assert brute_force_rebalance(m)[0] == sol.objective
