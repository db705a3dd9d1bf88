"""Speculative decoding decisions: the offline optimal number of draft tokens k per
acceptance rate, and the UCB1 bandit's cumulative regret against the proved bound.

Llama-2-70B drafted by Llama-2-7B on A100-80GB, TP4, k in 0..8. Regret is measured in
normalized-reward units on four contexts (chat a = 0.8 at batch 1 and 32, code a = 0.6 at
batch 1, hard a = 0.3 at batch 32), mean over seeds 0-2; the bound is
``proofs/speculation-ucb-regret.md`` summed over contexts.

Usage: python benchmarks/speculation_bandit.py
"""
from __future__ import annotations

import numpy as np

from lpserve.speculation import SpeculationBandit, optimal_k, simulate_bandit, speculation_cost

K_MAX = 8
RATES = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def main() -> int:
    c = speculation_cost("llama-2-70b", "llama-2-7b", gpu="a100-80gb", tp=4)
    for b in (1, 32):
        cells = []
        for a in RATES:
            best, tok_s = optimal_k(c, a, b, K_MAX)
            cells.append(f"a={a}: k={best.k} ({tok_s:.1f} tok/s)")
        print(f"batch {b}: " + ", ".join(cells))
    acc = {"chat": 0.8, "code": 0.6, "hard": 0.3}
    ctxs = [("chat", 1), ("code", 1), ("hard", 32), ("chat", 32)]
    runs = [simulate_bandit(c, SpeculationBandit(K_MAX + 1), ctxs, acc, 100_000, K_MAX, seed=s)
            for s in range(3)]
    ok = True
    for n in (1_000, 10_000, 100_000):
        regret = float(np.mean([r.regret[n - 1] for r in runs]))
        bound = runs[0].bound_at(n)
        ok &= regret <= bound
        print(f"n={n:>7,}: regret {regret:9.1f} (per play {regret / n:.4f}), bound {bound:,.0f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
