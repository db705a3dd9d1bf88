"""Drift-plus-penalty bounds of the prefill controller on the slotted model
(``proofs/lyapunov-dpp.md``): i.i.d. arrivals and decode counts, the cost model's times."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies import _lyapunov_kernels as K
from lpserve.policies.lyapunov import constants, slotted_optimum

COST = lp.cost_model(gpu="a100-80gb", llm="mistral-7b")
PARAMS = np.ascontiguousarray(COST.params, np.float64)
DECODES = np.array([16, 64, 128])
ARRIVAL_TOKENS = 1024          # a request's prompt arrives in a slot with probability P_ARR
P_ARR = 0.15
CTX, BUDGET, S_TBT, EPS, ETA = 1024, 2048, 0.08, 0.05, 512.0
SLOTS = 100_000


def run(V: float, seed: int = 0) -> dict[str, float]:
    """Time averages of the controller over SLOTS slots (common random numbers per seed)."""
    rng = np.random.default_rng(seed)
    a = (rng.random(SLOTS) < P_ARR) * float(ARRIVAL_TOKENS)
    n = DECODES[rng.integers(0, DECODES.size, SLOTS)].astype(np.int64)
    cp = np.zeros(K.N_CP)
    cp[[K.CP_V, K.CP_S_TBT, K.CP_EPS, K.CP_ETA, K.CP_THETA, K.CP_GRAIN, K.CP_BT]] = \
        [V, S_TBT, EPS, ETA, 1.0, 64, 16]
    st, _ = K.dpp_slotted(PARAMS, cp, a, n, CTX, BUDGET, 1e9)
    T = st[K.ST_SLOTS]
    return {"penalty_s": st[K.ST_PEN] / T, "backlog_eta": st[K.ST_Q] / T / ETA,
            "z_tbt": st[K.ST_ZT_SUM] / T,
            "violations": st[K.ST_SLOT_VIOL] / st[K.ST_SLOT_DEC]}


@pytest.fixture(scope="module")
def theory():
    c = constants(COST, budget_tokens=BUDGET, max_decodes=int(DECODES.max()),
                  context_tokens=CTX, max_arrival_tokens=ARRIVAL_TOKENS, eta_tokens=ETA,
                  eps=EPS, theta=1.0)
    o = slotted_optimum(COST, decodes=DECODES, decode_probs=np.full(3, 1 / 3),
                        mean_arrival_tokens=P_ARR * ARRIVAL_TOKENS, context_tokens=CTX,
                        budget_tokens=BUDGET, tbt_slo_s=S_TBT, eps=EPS, eta_tokens=ETA)
    assert o["status"] == "Optimal/Optimal" and o["slack"] > 0
    return {**c, **o}


@pytest.fixture(scope="module")
def sweep():
    return {V: run(V) for V in (1.0, 3.0, 10.0, 30.0, 100.0, 300.0)}


def test_penalty_and_backlog_within_bounds(theory, sweep):
    B = theory["B"] + theory["C"]
    print(f"\nproved constants: B = {theory['B']:.1f}, C = {theory['C']:.1f}, "
          f"p* = {theory['p_star']:.4f} s, p_max = {theory['p_max']:.3f} s, "
          f"Slater slack = {theory['slack']:.3f}")
    print(f"{'V':>6} {'penalty':>9} {'p*+B/V':>9} {'backlog':>9} {'bound':>10} {'viol':>7}")
    for V, m in sweep.items():
        pen_bound = theory["p_star"] + B / V
        q_bound = (B + V * (theory["p_max"] - theory["p_min"])) / theory["slack"]
        backlog = m["backlog_eta"] + m["z_tbt"]
        print(f"{V:6.0f} {m['penalty_s']:9.4f} {pen_bound:9.3f} {backlog:9.2f} "
              f"{q_bound:10.1f} {m['violations']:7.4f}")
        assert m["penalty_s"] <= pen_bound
        assert backlog <= q_bound
        assert m["violations"] <= EPS + 0.005  # the percentile constraint, eq. (5)


def _slope(x, y):
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def test_tradeoff_slopes(theory, sweep):
    Vs = sorted(sweep)
    pen = np.array([sweep[V]["penalty_s"] for V in Vs])
    back = np.array([sweep[V]["backlog_eta"] for V in Vs])
    # penalty falls and backlog grows with V (3% noise allowance)
    assert np.all(np.diff(pen) <= 0.03 * pen[:-1])
    assert np.all(np.diff(back) >= -0.03 * back[:-1])
    small = [V for V in Vs if V <= 30]
    gap = np.array([sweep[V]["penalty_s"] - theory["p_star"] for V in small])
    assert np.all(gap > 0)
    s_pen = _slope(small, gap)
    large = [V for V in Vs if V >= 10]
    s_back = _slope(large, [sweep[V]["backlog_eta"] for V in large])
    print(f"\nlog-log slopes: penalty gap {s_pen:.2f} (O(1/V): -1), backlog {s_back:.2f} "
          f"(O(V): +1)")
    assert -1.6 <= s_pen <= -0.6
    assert 0.75 <= s_back <= 1.25
