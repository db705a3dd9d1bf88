"""Speculative decoding decisions: the offline optimal number of draft tokens k per
acceptance rate, and the cumulative regret of the UCB1 bandit and of the optimistic
acceptance-rate rule against their proved bounds.

Llama-2-70B drafted by Llama-2-7B on A100-80GB, TP4, k in 0..8. Regret is measured in
normalized-reward units on four contexts (chat a = 0.8 at batch 1 and 32, code a = 0.6 at
batch 1, hard a = 0.3 at batch 32), mean over seeds 0-2; the bound is
``proofs/speculation-ucb-regret.md`` summed over contexts. The optimistic acceptance-rate
rule (``lpserve.policies.bandits.AcceptanceUCB``) runs on the same contexts and draws; its regret is printed
in the same normalized units beside ``proofs/speculation-acceptance-ucb.md`` (tokens/s
units, divided by each context's normalizer).

Usage: python benchmarks/speculation_bandit.py
"""
from __future__ import annotations

import numpy as np

from lpserve.cost.speculation import optimal_k, speculation_cost
from lpserve.policies.bandits import SpeculationBandit, simulate_acceptance_ucb, simulate_bandit

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
    print("optimistic acceptance rates (same contexts and seeds, normalized units):")
    acc_runs = [simulate_acceptance_ucb(c, ctxs, acc, 100_000, K_MAX, seed=s) for s in range(3)]
    for n in (1_000, 10_000, 100_000):
        norm = [np.cumsum(r.gaps[r.contexts, r.arms] / u.reward_bound[r.contexts])[n - 1]
                for r, u in zip(acc_runs, runs)]
        raw = float(np.mean([r.regret[n - 1] for r in acc_runs]))
        bound = acc_runs[0].bound_at(n)
        ok &= raw <= bound
        ucb = float(np.mean([r.regret[n - 1] for r in runs]))
        print(f"n={n:>7,}: regret {np.mean(norm):9.1f} (UCB1 / this: {ucb / np.mean(norm):5.1f}x); "
              f"in tokens/s {raw:,.0f}, bound {bound:,.0f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
