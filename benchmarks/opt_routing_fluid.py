"""Fluid routing LP with 200 classes x 32 heterogeneous replicas (target < 2 s), and the
convex (cvxpy) form beside it.

Classes: 5 prompt buckets x 5 predicted-output buckets x 8 tenant prefix groups from a
synthetic 40,000-request trace; replicas: 8 each of A100-80GB, H100-SXM, L40S and H200
(Llama-2-7B). The rate is scaled to 70 % of the largest feasible load so capacity rows
bind. Prints sizes, binding rows and the figure.

    python benchmarks/opt_routing_fluid.py
"""
from __future__ import annotations

import time

import numpy as np

import lpserve as lp
from lpserve.opt import Status
from lpserve.opt import routing_lp as RL


def instance(seed: int = 0, n: int = 40_000) -> lp.Instance:
    rng = np.random.default_rng(seed)
    o = np.clip(rng.lognormal(5.0, 1.0, n), 1, 4000).astype(np.int64)
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 3600, n)),
                              prompt_tokens=np.clip(rng.lognormal(6.5, 1.0, n), 1, 16000).astype(np.int64),
                              output_tokens=o, predicted_lo=np.maximum(o // 2, 1),
                              predicted_hi=2 * o, tenant=rng.integers(0, 8, n))
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=32))


def replica_costs() -> list:
    kinds = [lp.cost_model(gpu=g, llm="llama-2-7b", tp=1)
             for g in ("a100-80gb", "h100-sxm", "l40s", "h200")]
    return [kinds[j // 8] for j in range(32)]


def main() -> None:
    inst, costs = instance(), replica_costs()
    kw = dict(replica_costs=costs, n_prompt_buckets=5, n_output_buckets=5, max_groups=8)
    base = RL.build_fluid(inst, **kw)
    lo, hi = 1.0, 1e5
    for _ in range(25):
        mid = (lo * hi) ** 0.5
        ok = RL.solve_fluid(RL.build_fluid(inst, rate_scale=mid, **kw)).status == Status.OPTIMAL
        lo, hi = (mid, hi) if ok else (lo, mid)
    t0 = time.perf_counter()
    model = RL.build_fluid(inst, rate_scale=0.7 * lo, **kw)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    sol = RL.solve_fluid(model)
    t_lp = time.perf_counter() - t0
    t0 = time.perf_counter()
    cvx = RL.solve_fluid_convex(model)
    t_cvx = time.perf_counter() - t0
    C, R, G = model.shape
    binding = {k: int((sol.dual[k] > 1e-9).sum()) for k in ("prefill", "decode", "gpu", "kv")}
    print(f"classes={C} replicas={R} groups={G} rows={sol.info['n_rows']} "
          f"columns={sol.info['n_columns']} (base classes {base.shape[0]}); build {t_build:.2f} s")
    print(f"LP objective {sol.objective:.4f} request-s/s, rows with a positive price {binding}; "
          f"convex objective {cvx.objective:.4f} ({cvx.status.value}) in {t_cvx:.2f} s")
    print(f"FIGURE routing-fluid LP {C} classes x {R} replicas: {t_lp:.2f} s (target < 2 s)")


if __name__ == "__main__":
    main()
