"""Unit tests of lpserve.cost.speculation: cost of a speculative step, expected tokens, optimum."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from lpserve.cost import cost_model
from lpserve.cost.speculation import (
    Arm,
    SpeculationCost,
    batch_bucket,
    expected_tokens,
    optimal_k,
    sample_tokens,
    speculation_cost,
)
from lpserve.policies.bandits import (
    FixedArm,
    SpeculationBandit,
    arm_means,
    simulate_bandit,
    ucb1_regret_bound,
)

COST = speculation_cost("llama-2-70b", "llama-2-7b", gpu="a100-80gb", tp=4)


@pytest.mark.parametrize("a", [0.0, 0.3, 0.6, 0.8, 0.95])
@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_expected_tokens_matches_monte_carlo(a, k):
    rng = np.random.default_rng(1234)
    n = 40_000
    mc = sample_tokens(rng, a, k, n) / n
    exact = expected_tokens(a, k)
    # the per-sequence tokens are bounded by k+1, so the sd of the mean is <= (k+1)/sqrt(n)
    assert abs(mc - exact) < 5 * (k + 1) / np.sqrt(n) + 1e-12
    assert exact == pytest.approx(sum(a ** i for i in range(k + 1)))


def test_expected_tokens_vectorized_and_limits():
    a = np.array([0.0, 0.5, 0.9])
    np.testing.assert_allclose(expected_tokens(a, 0), 1.0)
    np.testing.assert_allclose(expected_tokens(a, 2), 1 + a + a ** 2)
    assert expected_tokens(0.0, 7) == 1.0


def test_k0_equals_plain_decode():
    target = cost_model(gpu="a100-80gb", llm="llama-2-70b", tp=4)
    for b in (1, 8, 32):
        ctx = np.full(b, 512)
        plain = target.batch_time_s(decode_context=ctx)
        assert COST.step_time_s(0, ctx) == plain
        assert COST.tokens_per_s(0.7, 0, ctx) == pytest.approx(b / plain)
        assert COST.time_per_output_token_s(0.7, 0, ctx) == pytest.approx(plain)


def test_step_time_is_drafts_plus_verification():
    target = cost_model(gpu="a100-80gb", llm="llama-2-70b", tp=4)
    draft = cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=4)
    ctx = np.array([100, 300, 900])
    k = 4
    want = sum(draft.batch_time_s(decode_context=ctx + i) for i in range(k))
    want += target.batch_time_s(prefill_tokens=[k + 1] * 3, prefill_cached=ctx)
    assert COST.step_time_s(k, ctx) == pytest.approx(want)
    # more drafts cost more time
    times = [COST.step_time_s(j, ctx) for j in range(1, 8)]
    assert all(x < y for x, y in zip(times, times[1:]))


@pytest.mark.parametrize("b", [1, 8, 32])
@pytest.mark.parametrize("a", [0.0, 0.4, 0.7, 0.85, 0.95])
def test_optimal_k_equals_brute_force(a, b):
    arm, v = optimal_k(COST, a, b, 8)
    ctx = np.full(b, 512)
    brute = {k: b * sum(a ** i for i in range(k + 1)) / COST.step_time_s(k, ctx)
             for k in range(9)}
    k_best = max(brute, key=lambda k: (brute[k], -k))
    assert arm.k == k_best
    assert v == pytest.approx(brute[k_best])
    means = arm_means(COST, a, b, 8)
    assert int(np.argmax(means)) == k_best


def test_optimal_k_with_two_drafts():
    cost = speculation_cost("llama-2-70b", ["llama-2-7b", "llama-2-13b"], gpu="a100-80gb", tp=4)
    rates = [0.6, 0.8]
    arm, v = optimal_k(cost, rates, 4, 5)
    ctx = np.full(4, 512)
    vals = {(0, -1): 4 / cost.step_time_s(0, ctx)}
    for d, k in itertools.product(range(2), range(1, 6)):
        vals[(k, d)] = cost.tokens_per_s(rates[d], k, ctx, d)
    best = max(vals.values())
    assert v == pytest.approx(best)
    assert vals[(arm.k, arm.draft)] == pytest.approx(best)
    assert len(cost.arms(5)) == 11


def test_no_speculation_at_zero_acceptance_and_more_at_high():
    assert optimal_k(COST, 0.0, 1, 8)[0] == Arm(0)
    assert optimal_k(COST, 0.9, 1, 8)[0].k >= optimal_k(COST, 0.5, 1, 8)[0].k >= 1


def test_bandit_prefers_best_arm_and_baselines():
    acc = {"chat": 0.9}
    ctxs = [("chat", 1)]
    best = int(np.argmax(arm_means(COST, 0.9, 1, 3)))
    bandit = SpeculationBandit(4)
    run = simulate_bandit(COST, bandit, ctxs, acc, 3000, 3, seed=7)
    counts = bandit.counts(("chat", batch_bucket(1)))
    assert counts.sum() == 3000 and int(np.argmax(counts)) == best
    never = simulate_bandit(COST, FixedArm(0), ctxs, acc, 3000, 3, seed=7)
    always = simulate_bandit(COST, FixedArm(best), ctxs, acc, 3000, 3, seed=7)
    assert (never.arms == 0).all() and always.regret[-1] == 0.0
    assert run.regret[-1] < never.regret[-1]
    # same seed, same result
    again = simulate_bandit(COST, SpeculationBandit(4), ctxs, acc, 3000, 3, seed=7)
    np.testing.assert_array_equal(run.arms, again.arms)


def test_rewards_are_normalized():
    run = simulate_bandit(COST, SpeculationBandit(9), [("a", 1), ("b", 32)],
                          {"a": 0.95, "b": 0.95}, 500, 8, seed=3)
    r = run.tokens / run.time_s / run.reward_bound[run.contexts]
    assert (r >= 0).all() and (r <= 1 + 1e-12).all()
    assert (run.means <= 1).all()


def test_batch_bucket():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 32, 33, 10_000)] == [0, 1, 2, 2, 3, 5, 6, 10]


def test_ucb1_bound_formula():
    g = [0.0, 0.1, 0.5]
    want = 8 * np.log(100) * (1 / 0.1 + 1 / 0.5) + (1 + np.pi ** 2 / 3) * 0.6
    assert ucb1_regret_bound(g, 100) == pytest.approx(want)
    assert ucb1_regret_bound(g, 0) == 0.0


@pytest.mark.parametrize("a", [-0.1, 1.0, 1.5, float("nan")])
def test_bad_acceptance_raises(a):
    with pytest.raises(ValueError, match=r"acceptance rate must be in \[0, 1\), got"):
        expected_tokens(a, 2)
    with pytest.raises(ValueError, match="acceptance rate must be in"):
        optimal_k(COST, a, 1, 4)


@pytest.mark.parametrize("k", [-1, -5, 1.5, True])
def test_bad_k_raises(k):
    with pytest.raises(ValueError, match=rf"k must be .*got {k!r}".replace("(", r"\(")):
        COST.step_time_s(k, [512])


def test_negative_k_in_expected_tokens():
    with pytest.raises(ValueError, match="k must be >= 0, got -2"):
        expected_tokens(0.5, -2)


def test_unknown_model_raises():
    with pytest.raises(KeyError, match="no-such-llm"):
        speculation_cost("llama-2-70b", "no-such-llm", gpu="a100-80gb", tp=4)
    with pytest.raises(KeyError, match="no-such-llm"):
        speculation_cost("no-such-llm", "llama-2-7b", gpu="a100-80gb", tp=4)


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        optimal_k(COST, 0.5, 0, 3)
    with pytest.raises(ValueError, match="reward must be in"):
        SpeculationBandit(3).update("x", 0, 1.5)
    with pytest.raises(ValueError, match="no acceptance rate for request class 'b'"):
        simulate_bandit(COST, SpeculationBandit(3), [("b", 1)], {"a": 0.5}, 10, 2, seed=0)
    with pytest.raises(ValueError, match="draft must be an index"):
        COST.step_time_s(2, [512], draft=3)
    d = cost_model(gpu="a100-80gb", llm="llama-2-7b", tp=1)
    t = cost_model(gpu="a100-80gb", llm="llama-2-70b", tp=4)
    with pytest.raises(ValueError, match="tp=1 but the target has 4"):
        SpeculationCost(t, [d])


def test_acceptance_ucb_counts_trials():
    from lpserve.policies.bandits import A_MAX, AcceptanceUCB

    u = AcceptanceUCB()
    assert u.rate(("x", 0)) == A_MAX  # optimistic before any trial
    # k = 3: accepted 3 (3 trials, no rejection seen), 1 (1 + the rejected one), 0 (1 trial)
    u.observe([("x", 0), ("x", 0), ("y", 0)], 3, [3, 1, 0])
    assert u.trials(("x", 0)) == 3 + 2 and u.trials(("y", 0)) == 1
    # rate = s / m + sqrt(2 ln t / m) at step t = 2
    assert u.rate(("x", 0)) == pytest.approx(min(A_MAX, 4 / 5 + np.sqrt(2 * np.log(2) / 5)))
    u.observe([("x", 0)], 0, [0])  # a plain step counts as a step, teaches nothing
    assert u.trials(("x", 0)) == 5 and u.steps == 2
    for _ in range(2000):
        u.observe([("x", 0)], 4, [1])  # 2 trials, 1 accepted each step
    m = 5 + 2 * 2000
    assert u.rate(("x", 0)) == pytest.approx((4 + 2000) / m + np.sqrt(2 * np.log(2003) / m))
    assert 0.5 < u.rate(("x", 0)) < 0.57  # the radius shrinks as trials accumulate
    with pytest.raises(ValueError, match="accepted must be 1 integers in \\[0, 2\\]"):
        u.observe([("x", 0)], 2, [3])


def test_acceptance_ucb_bound_formula():
    from lpserve.policies.bandits import acceptance_ucb_bound

    g = np.array([[0.0, 2.0, 1.0]])
    e = np.array([[np.inf, 0.1, np.inf]])
    n, B, K = 100, 4, 3
    want = 2.0 * (8 * np.log(n) / 0.01 + 1) + (1 + 2 * B * K) * 2.0
    assert acceptance_ucb_bound(g, e, n, B, K) == pytest.approx(want)
    with pytest.raises(ValueError, match="same shape"):
        acceptance_ucb_bound(g, e[:, :2], n, B, K)
