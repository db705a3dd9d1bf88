"""Predicted stability capacity (Nie, Si, Zhou: ``M / (t_bar E[g])``, with the sequence and
token-budget terms of ``models/stability.md``) beside the capacity that ``lpserve
capacity``'s search measures, and where the prediction's assumptions fail.

Workloads: Poisson arrivals, uniform lengths. Configurations:

* ``round``: the abstract round model (every iteration one time unit, 4,096 KV tokens,
  prompts 16-63, outputs 16-127 tokens) -- the paper's assumptions hold exactly;
* ``a100-kv25`` / ``a100-kv90``: Llama-2-7B on one A100-80GB with 25 % / 90 % of the GPU
  memory for weights and KV, prompts and outputs 100-599 tokens -- the iteration time
  now depends on the batch, which the prediction fixes at its equilibrium value;
* ``a100-short``: the same GPU with 90 % memory and short requests (prompts 16-127,
  outputs 8-63): memory stops binding, the token budget or the sequence cap takes over.

Measured capacity: ``lpserve.evaluate.capacity`` with ``--replications`` Poisson
replications, TTFT objective 5 % of the arrival window (a load ``rho`` whose queue grows
misses it once ``(1 - 1/rho) * window`` exceeds it, so above ``rho = 1.053``), TPOT
unbounded; mean with a 95 % Student-t interval. Exit code 0 always (a comparison, not a
target); the rows with ``|ratio - 1| > 0.10`` are flagged. For the diagnosis, the first
replication is rerun at the measured capacity: the mean iteration time there (busy span
over iterations, beside the prediction's ``t_bar``) and the preemptions per request.

Run: ``python benchmarks/stability_capacity.py [--requests 1500] [--replications 3]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.evaluate.capacity import capacity
from lpserve.evaluate.stability import predict_capacity

CONFIGS = {
    "round": dict(cost=lambda: lp.UnitRoundCost(memory_tokens=4096), block_tokens=1,
                  prompt=(16, 64), output=(16, 128), frac=0.9),
    "a100-kv25": dict(cost=lambda: None, block_tokens=16, prompt=(100, 600),
                      output=(100, 600), frac=0.25),
    "a100-kv90": dict(cost=lambda: None, block_tokens=16, prompt=(100, 600),
                      output=(100, 600), frac=0.9),
    "a100-short": dict(cost=lambda: None, block_tokens=16, prompt=(16, 128),
                       output=(8, 64), frac=0.9),
}
ENGINES = ("vllm-chunked", "sarathi", "vllm-v0")


def instance(cfg: dict, seed: int, n: int, rate: float, ttft_s: float) -> lp.Instance:
    rng = np.random.default_rng(seed)
    tr = lp.Trace.from_arrays(arrival_s=np.cumsum(rng.exponential(1.0 / rate, n)),
                              prompt_tokens=rng.integers(*cfg["prompt"], n),
                              output_tokens=rng.integers(*cfg["output"], n))
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=cfg["block_tokens"],
                    gpu_memory_fraction=cfg["frac"])
    return lp.Instance(trace=tr, cluster=cl, cost=cfg["cost"](),
                       slo=lp.SLO(ttft_s=ttft_s, tpot_s=1e9))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1500, help="requests per replication")
    ap.add_argument("--replications", type=int, default=3)
    ap.add_argument("--rel-tol", type=float, default=0.02)
    args = ap.parse_args(argv)
    print(f"{'config':<11} {'engine':<13} {'binding':<9} {'t_bar ms':>8} {'NSZ rps':>9} "
          f"{'pred rps':>9} {'measured rps':>13} {'95% CI':>17} {'ratio':>6} "
          f"{'t meas ms':>9} {'preempt/req':>11} {'wall s':>7}")
    for cname, cfg in CONFIGS.items():
        for eng in ENGINES:
            pol = lp.make_policy(eng, prefix_caching=False)
            pred = predict_capacity(instance(cfg, 99, 4000, 1.0, 1.0), pol)
            window = args.requests / pred["rate_rps"]
            insts = [instance(cfg, s, args.requests, pred["rate_rps"], 0.05 * window)
                     for s in range(args.replications)]
            t0 = time.perf_counter()
            res = capacity(insts, pol, rel_tol=args.rel_tol, drain_s=0.5 * window)
            wall = time.perf_counter() - t0
            scale = res.rate_rps / res.load if res.load else float("nan")
            lo, hi = (x * scale for x in res.ci)
            ratio = res.rate_rps / pred["rate_rps"]
            flag = "  !" if abs(ratio - 1) > 0.10 else ""
            at = insts[0].trace.scale_rate(res.per_replication[0])
            run = lp.simulate(insts[0].with_(trace=at), lp.make_policy(eng, prefix_caching=False))
            a = run.arrays
            span = float(np.nanmax(a["finish_s"]) - a["arrival_s"][0])
            t_meas = span / max(run.stats["iterations"], 1)
            pre = float(a["preemptions"].sum()) / len(a["preemptions"])
            print(f"{cname:<11} {eng:<13} {pred['binding']:<9} "
                  f"{1e3 * pred['batch_time_s']:>8.2f} {pred['mem_rps']:>9.3f} "
                  f"{pred['rate_rps']:>9.3f} {res.rate_rps:>13.3f} "
                  f"{f'[{lo:.3f}, {hi:.3f}]':>17} {ratio:>6.3f} {1e3 * t_meas:>9.2f} "
                  f"{pre:>11.3f} {wall:>7.1f}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
