"""Scheduling IP: seconds to prove optimality on n = 12 requests (target < 10 s).

Instances: Poisson arrivals (1 per round), M ~ U{10..16}, s ~ U{1..2}, o ~ U{1..M - s}
(the round model of Jaillet et al. at reduced memory). Prints one line per seed and the
figure: the median and the largest solve time.

    python benchmarks/opt_schedule_ip.py [--n 12] [--seeds 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from lpserve.opt import schedule_ip as S
from lpserve.opt.exact import KVProblem


def instance(seed: int, n: int) -> KVProblem:
    rng = np.random.default_rng(seed)
    M = int(rng.integers(10, 17))
    s = rng.integers(1, 3, n)
    o = np.array([rng.integers(1, M - x + 1) for x in s])
    a = np.floor(np.cumsum(rng.exponential(1.0, n))).astype(np.int64)
    return KVProblem.from_arrays(a - a[0], s, o, M)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    times = []
    for seed in range(args.seeds):
        p = instance(seed, args.n)
        t0 = time.perf_counter()
        sol = S.solve(S.build_problem(p), time_limit_s=args.time_limit)
        dt = time.perf_counter() - t0
        times.append(dt)
        print(f"seed {seed}: M={p.memory_tokens} status={sol.status.value} "
              f"objective={sol.objective:.0f} bound={sol.bound:.0f} "
              f"columns={sol.info['n_columns']} time={dt:.2f} s")
    print(f"FIGURE schedule-ip exact n={args.n}: median {np.median(times):.2f} s, "
          f"max {max(times):.2f} s (target < 10 s)")


if __name__ == "__main__":
    main()
