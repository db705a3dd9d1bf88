"""WAIT and Nested WAIT against the fluid optimum as the system scales, beside MC-SF and
vLLM (Ao, Luo, Simchi-Levi, Wang, arXiv 2504.11320; ``models/wait-fluid.md``).

Round model (every iteration one time unit), overloaded so a queue always waits; arrival
rates and KV memory scale together by ``k``. Printed per ``k``: output tokens produced in
``--horizon`` iterations over the fluid optimum's (``tokens_per_iteration * H``), and
preemptions (or evictions).

1. Known lengths, lpserve's simulator: types (prompt, output) = (8, 4) and (16, 12)
   arriving 2k and k per iteration, memory 300k tokens: ``wait`` with the fluid
   thresholds, ``mcsf-oracle`` (MC-SF with exact lengths; its own batch cap raised to
   4,096) and ``vllm`` (prefill-first, admits whatever fits now, recompute on overflow),
   all with 4,096 sequences at most.
2. Unknown lengths, the round-model reference (``lpserve.opt.wait_ref``): outputs 4, 12,
   30 with shares 0.4 / 0.4 / 0.2, prompt 8, memory 500k, Poisson arrivals at 1.5 times
   the memory-bound rate: Nested WAIT with its derived margins and buffer, against the
   unknown-length optimum ``M / E[g]`` requests per iteration.

Run: ``python benchmarks/wait_fluid.py [--horizon 200]``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import lpserve as lp
from lpserve.opt.fluid import fluid_optimum, fluid_unknown_lengths, wait_thresholds
from lpserve.opt.wait_ref import nested_wait_caps, nested_wait_round

L, O = np.array([8, 16]), np.array([4, 12])


def known(k: int, H: int) -> tuple[lp.Instance, dict]:
    lam = np.array([2, 1]) * k
    arr = np.repeat(np.arange(H, dtype=float), lam.sum())
    typ = np.tile(np.repeat([0, 1], lam), H)
    tr = lp.Trace.from_arrays(arrival_s=arr, prompt_tokens=L[typ], output_tokens=O[typ])
    inst = lp.Instance(trace=tr, cost=lp.UnitRoundCost(memory_tokens=300 * k),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", block_tokens=1),
                       horizon_s=float(H))
    return inst, fluid_optimum(L, O, lam, 300 * k)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--horizon", type=int, default=200, help="iterations")
    args = ap.parse_args(argv)
    H = args.horizon
    print(f"1. known lengths (lpserve simulator), horizon {H} iterations: tokens / fluid "
          "optimum (preemptions)")
    print(f"{'k':>4} {'wait':>16} {'mcsf-oracle':>16} {'vllm':>16} {'thresholds':>22} {'wall s':>7}")
    for k in (1, 2, 4, 8, 16, 32):
        inst, fl = known(k, H)
        th = wait_thresholds(L, O, fl["x"])
        cells = []
        t0 = time.perf_counter()
        for name, kw in (("wait", {"thresholds": th}), ("mcsf-oracle", {"max_batch": 4096}),
                         ("vllm-v0", {})):
            res = lp.simulate(inst, lp.make_policy(name, max_num_seqs=4096, **kw), seed=0)
            a = res.arrays
            ratio = a["generated_tokens"].sum() / (fl["tokens_per_iteration"] * H)
            cells.append(f"{ratio:.4f} ({int(a['preemptions'].sum())})")
        print(f"{k:>4} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16} "
              f"{str(list(th.values())):>22} {time.perf_counter() - t0:>7.2f}")
    print(f"\n2. unknown lengths (round-model reference), horizon {H}: Nested WAIT tokens / "
          "unknown-length optimum (evictions), 3 seeds")
    l, o, p = np.array([8, 8, 8]), np.array([4, 12, 30]), np.array([0.4, 0.4, 0.2])
    g = l * o + o * (o - 1) // 2
    print(f"{'k':>4} {'seed 0':>14} {'seed 1':>14} {'seed 2':>14} {'caps':>18} "
          f"{'margins':>16} {'buffer':>7}")
    for k in (4, 16, 64, 256):
        M = 500 * k
        rate = 1.5 * M / float(p @ g)
        fl = fluid_unknown_lengths(l, o, p * rate, M)
        caps = nested_wait_caps(l, o, p, M, horizon=H)
        cells = []
        for seed in range(3):
            rng = np.random.default_rng(seed)
            arr = np.repeat(np.arange(H), rng.poisson(rate, H))
            typ = rng.choice(3, arr.size, p=p)
            r = nested_wait_round(arr, l[typ], o[typ], caps["bounds"], caps["caps"], M, H)
            cells.append(f"{r['tokens'] / (fl['tokens_per_iteration'] * H):.4f} "
                         f"({r['evictions']})")
        print(f"{k:>4} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14} {str(caps['caps']):>18} "
              f"{str([round(m, 3) for m in caps['margins'][1:]]):>16} "
              f"{caps['buffer_tokens']:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
