"""LP relaxation bound of the scheduling IP for n = 1,000 requests (target < 60 s).

Instance: Poisson arrivals at 0.05 per round, M = 50, s ~ U{1..5}, o ~ U{1..M - s}
(about 0.45 of memory-time). The LP keeps 200,000 start columns with a late column
per request (``models/lower-bounds.md`` (1)). Prints the bound, the best memory-safe greedy
(MC-SF and variants, the incumbent) beside it,
and the time.

    python benchmarks/opt_schedule_lp.py [--n 1000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from lpserve.opt import schedule_ip as S
from lpserve.opt.exact import KVProblem, total_latency
from lpserve.opt.lower_bounds import area_bound


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--max-columns", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    M, n = 50, args.n
    s = rng.integers(1, 6, n)
    o = np.array([rng.integers(1, M - x + 1) for x in s])
    a = np.floor(np.cumsum(rng.exponential(1.0 / args.rate, n))).astype(np.int64)
    p = KVProblem.from_arrays(a, s, o, M)
    t0 = time.perf_counter()
    model = S.build_problem(p, relax=True, max_columns=args.max_columns)
    t_build = time.perf_counter() - t0
    sol = S.solve(model)
    dt = time.perf_counter() - t0
    greedy = total_latency(p, model.incumbent)
    print(f"n={n} columns={sol.info['n_columns']} memory rows={sol.info['n_memory_rows']} "
          f"window={sol.info['window_rounds']} overflow={sol.info['overflow']}")
    print(f"LP bound {sol.bound:.1f}  area bound {area_bound(p):.1f}  best greedy {greedy}  "
          f"(greedy vs LP {100 * (greedy - sol.bound) / greedy:.2f} %)  build {t_build:.2f} s")
    print(f"FIGURE schedule-lp bound n={n}: {dt:.2f} s (target < 60 s), status {sol.status.value}")


if __name__ == "__main__":
    main()
