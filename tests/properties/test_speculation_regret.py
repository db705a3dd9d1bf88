"""UCB1 regret of the speculation bandit vs the proved bound (proofs/speculation-ucb-regret.md)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lpserve.cost.speculation import speculation_cost
from lpserve.policies.bandits import (
    SpeculationBandit,
    arm_means,
    simulate_acceptance_ucb,
    simulate_bandit,
    ucb1_regret_bound,
)

COST = speculation_cost("llama-2-70b", "llama-2-7b", gpu="a100-80gb", tp=4)
SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
RATES = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
BATCHES = (1, 8, 32)


def _min_gap(a: float, b: int, k: int) -> float:
    m = arm_means(COST, a, b, k)
    g = m.max() - m
    return float(g[g > 1e-15].min()) if (g > 1e-15).any() else 1.0


# (rate, batch, K) whose smallest positive gap makes n = 4000 plays past the exploration phase
WELL_SEPARATED = [c for c in itertools.product(RATES, BATCHES, (2, 3)) if _min_gap(*c) >= 0.08]


@SETTINGS
@given(rates=st.lists(st.sampled_from(RATES), min_size=1, max_size=3),
       batches=st.lists(st.sampled_from(BATCHES), min_size=1, max_size=3, unique=True),
       max_k=st.integers(1, 6), seed=st.integers(0, 2 ** 31 - 1))
def test_ucb_regret_below_bound(rates, batches, max_k, seed):
    """Theorem 1 of Auer et al. (2002), summed over contexts, at several horizons. On most
    of these draws the bound exceeds n x the largest gap (it cannot fail there); the test
    below restricts to the cases where it can."""
    acc = {f"c{i}": a for i, a in enumerate(rates)}
    ctxs = [(c, b) for c in acc for b in batches]
    n = 3000
    runs = [simulate_bandit(COST, SpeculationBandit(max_k + 1), ctxs, acc, n, max_k,
                            seed=seed + s) for s in range(3)]
    for m in (100, 1000, n):
        mean_regret = np.mean([r.regret[m - 1] for r in runs])
        assert mean_regret <= runs[0].bound_at(m) + 1e-9
        for r in runs:  # the bound is on the expectation, but it is loose enough per run too
            assert r.regret[m - 1] <= r.bound_at(m) + 1e-9


@SETTINGS
@given(case=st.sampled_from(WELL_SEPARATED), seed=st.integers(0, 2 ** 31 - 1))
def test_ucb_regret_is_sublinear(case, seed):
    """regret(n)/n decreases and regret(4n) < 2.5 regret(n) (a log n curve gives ~1.2-2)."""
    a, b, k = case
    n = 4000
    runs = [simulate_bandit(COST, SpeculationBandit(len(COST.arms(k))), [("x", b)], {"x": a},
                            4 * n, k, seed=seed + s) for s in range(3)]
    reg = np.mean([r.regret for r in runs], axis=0)
    at = {m: reg[m - 1] for m in (n // 4, n, 4 * n)}
    assert at[4 * n] < 2.5 * at[n]
    assert at[4 * n] / (4 * n) < at[n] / n < at[n // 4] / (n // 4)


def test_well_separated_cases_exist():
    assert len(WELL_SEPARATED) >= 5


N_INFORMATIVE = 3000


def _informative(a: float, b: int, k: int) -> bool:
    """The bound at N_INFORMATIVE plays is below 0.9 x the regret of playing every arm
    equally often (n x the mean gap): a learner that does not learn breaks it there. On most
    of the parameter space it is not (the bound then exceeds even n x the largest gap)."""
    g = arm_means(COST, a, b, k)
    g = g.max() - g
    return ucb1_regret_bound(g, N_INFORMATIVE) < 0.9 * N_INFORMATIVE * float(g.mean())


INFORMATIVE = [c for c in itertools.product(RATES, BATCHES, range(1, 7)) if _informative(*c)]


class _Cycle:
    """Plays the arms in turn: no learning (the regret of uniform play)."""

    name = "cycle"

    def __init__(self, n_arms: int) -> None:
        self.n_arms, self.t = n_arms, 0

    def select(self, context) -> int:
        self.t += 1
        return (self.t - 1) % self.n_arms

    def update(self, context, arm, reward) -> None:
        pass


def test_informative_cases_exist_and_a_non_learner_breaks_their_bound():
    """The check below can fail: on every informative case, cycling through the arms has
    a regret above the UCB1 bound (while, outside them, the bound exceeds any regret)."""
    assert len(INFORMATIVE) >= 10
    for a, b, k in INFORMATIVE[::3]:
        r = simulate_bandit(COST, _Cycle(len(COST.arms(k))), [("x", b)], {"x": a},
                            N_INFORMATIVE, k, seed=0)
        assert r.regret[-1] > r.bound_at(N_INFORMATIVE), (a, b, k)


@settings(SETTINGS, phases=(Phase.explicit, Phase.reuse, Phase.generate))  # no shrinking:
@given(case=st.sampled_from(INFORMATIVE), seed=st.integers(0, 2 ** 31 - 1))  # 3000 plays a run
def test_ucb_regret_below_bound_where_the_bound_can_fail(case, seed):
    """Theorem 1 of Auer et al. (2002) where it says something: the bound is below the
    regret of uniform play (and far below n x the largest gap), and UCB1 stays under it."""
    a, b, k = case
    r = simulate_bandit(COST, SpeculationBandit(len(COST.arms(k))), [("x", b)], {"x": a},
                        N_INFORMATIVE, k, seed=seed)
    for m in (300, 1000, N_INFORMATIVE):
        assert r.regret[m - 1] <= r.bound_at(m) + 1e-9
    assert r.bound_at(N_INFORMATIVE) < N_INFORMATIVE * float(r.gaps.max())


@SETTINGS
@given(rates=st.lists(st.sampled_from(RATES), min_size=1, max_size=3),
       batches=st.lists(st.sampled_from(BATCHES), min_size=1, max_size=3, unique=True),
       max_k=st.integers(1, 6), seed=st.integers(0, 2 ** 31 - 1))
def test_acceptance_ucb_regret_and_suboptimal_steps_below_bound(rates, batches, max_k, seed):
    """proofs/speculation-acceptance-ucb.md, at several horizons, on regret and on the
    number of suboptimal steps; and it learns faster than UCB1 on the same draws."""
    acc = {f"c{i}": a for i, a in enumerate(rates)}
    ctxs = [(c, b) for c in acc for b in batches]
    n = 3000
    runs = [simulate_acceptance_ucb(COST, ctxs, acc, n, max_k, seed=seed + s)
            for s in range(3)]
    for m in (100, 1000, n):
        assert np.mean([r.regret[m - 1] for r in runs]) <= runs[0].bound_at(m) + 1e-9
        for r in runs:
            assert r.regret[m - 1] <= r.bound_at(m) + 1e-9
            assert r.suboptimal_steps(m) <= r.bound_at(m, counts=True) + 1e-9


@pytest.mark.slow  # 16,000 plays x 3 runs per case (about 30 s)
@SETTINGS
@given(case=st.sampled_from(WELL_SEPARATED), seed=st.integers(0, 2 ** 31 - 1))
def test_acceptance_ucb_regret_is_sublinear(case, seed):
    a, b, k = case
    n = 4000
    runs = [simulate_acceptance_ucb(COST, [("x", b)], {"x": a}, 4 * n, k, seed=seed + s)
            for s in range(3)]
    reg = np.mean([r.regret for r in runs], axis=0)
    at = {m: reg[m - 1] for m in (n // 4, n, 4 * n)}
    assert at[4 * n] <= 2.5 * at[n] + 1e-9
    assert at[4 * n] / (4 * n) <= at[n] / n + 1e-12
