"""Assignment LP with 10,000 requests x 16 replicas: highspy (target < 5 s) and the same
model through cvxpy (its modelling overhead reported separately).

Costs c_ij come from the analytic cost model of 16 replicas of four GPU types (A100-80GB,
H100-SXM, L40S, H200 with Llama-2-7B), prompts ~ lognormal, predicted output intervals
[o/2, 2o]. Prints the cost-table time, the solve times, integrality and the figure.

    python benchmarks/opt_routing_assignment.py [--n 10000] [--replicas 16]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.opt import routing_lp as RL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    n, R = args.n, args.replicas
    o = np.clip(rng.lognormal(5.0, 1.0, n), 1, 4000).astype(np.int64)
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 600, n)),
                              prompt_tokens=np.clip(rng.lognormal(6.5, 1.0, n), 1, 16000).astype(np.int64),
                              output_tokens=o, predicted_lo=np.maximum(o // 2, 1),
                              predicted_hi=2 * o)
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=R))
    kinds = [lp.cost_model(gpu=g, llm="llama-2-7b", tp=1)
             for g in ("a100-80gb", "h100-sxm", "l40s", "h200")]
    costs = [kinds[j % len(kinds)] for j in range(R)]
    t0 = time.perf_counter()
    model = RL.build_assignment(inst, replica_costs=costs)
    t_table = time.perf_counter() - t0
    t0 = time.perf_counter()
    sol = RL.solve_assignment(model)
    t_highs = time.perf_counter() - t0
    cert = RL.certify_assignment(model, sol)
    t0 = time.perf_counter()
    cv = RL.solve_assignment(model, solver="cvxpy")
    t_cvx = time.perf_counter() - t0
    print(f"n={n} replicas={R}: cost table {t_table:.2f} s; objective {sol.objective:.3f} s "
          f"(cvxpy {cv.objective:.3f}); integrality residual {cert['integrality']:.1e}; "
          f"rounding loss {cert['rounding_loss_s']:.1e} s")
    print(f"cvxpy: total {t_cvx:.2f} s = modelling/canonicalization "
          f"{t_cvx - cv.info['solver_s']:.2f} s + HiGHS {cv.info['solver_s']:.2f} s; "
          f"overhead vs highspy {t_cvx / t_highs:.1f}x")
    print(f"FIGURE routing-assignment {n}x{R} highspy solve: {t_highs:.2f} s (target < 5 s); "
          f"cvxpy {t_cvx:.2f} s")


if __name__ == "__main__":
    main()
