"""Time-limited solves: every formulation returns within T + 10 % + 1 s, with a bound.

For each size n and each formulation of ``lpserve.opt.FORMULATIONS``, ``lp.solve(name,
instance, time_limit_s=T)`` on two round-model instances (``UnitRoundCost``, one token per
block): ``overloaded`` (Poisson arrivals at 1 per round, M = 16, s ~ U{1..2},
o ~ U{1..M - s}, the shape of ``instances/small``) and ``light`` (0.05 per round, M = 50,
s ~ U{1..5}, the instance of ``opt_schedule_lp.py``). Prints wall time, status, objective
and bound per call and the largest ratio of wall time to the allowance ``1.1 T + 1``; exits
1 if a call exceeds it, or returns no finite bound where the area bound exists (the
scheduling formulations on a feasible instance). Every formulation is called once on a
tiny instance first, so the figures exclude the one-time import of HiGHS and the load of
the compiled cost kernels (measured separately with ``--cold``: one fresh process per call).

``--cli`` also runs ``lpserve bound NAME --instance DIR --time-limit T --json`` as a
separate process for every call and reports its wall time (process start included).

    python benchmarks/solve_time_limits.py [--sizes 60,1000,3000,10000] [--time-limit 2]
        [--formulations schedule-ip,schedule-lp,...] [--cli] [--cold]
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import lpserve as lp
from lpserve.opt import FORMULATIONS

FAMILIES = {"overloaded": dict(M=16, rate=1.0, s_max=2), "light": dict(M=50, rate=0.05, s_max=5)}
ROUND_MODEL = ("schedule-ip", "schedule-lp", "schedule-area")


def instance(family: str, n: int, seed: int = 0) -> lp.Instance:
    """The ``family`` instance with ``n`` requests (see the module docstring)."""
    f = FAMILIES[family]
    rng = np.random.default_rng(seed)
    M = f["M"]
    s = rng.integers(1, f["s_max"] + 1, n)
    o = np.array([rng.integers(1, M - x + 1) for x in s])
    a = np.floor(np.cumsum(rng.exponential(1.0 / f["rate"], n)))
    tr = lp.Trace.from_arrays(arrival_s=a - a[0], prompt_tokens=s, output_tokens=o,
                              name=f"{family}-{n}")
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                       cost=lp.UnitRoundCost(memory_tokens=M))


def write_instance(inst: lp.Instance, folder: Path) -> Path:
    """``instance.toml`` + ``trace.csv`` of a round-model instance, for the CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    t = inst.trace
    rows = "\n".join(f"{a!r},{s},{o}" for a, s, o in zip(t.arrival_s.tolist(),
                                                         t.prompt_tokens.tolist(),
                                                         t.output_tokens.tolist()))
    (folder / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + rows + "\n")
    (folder / "instance.toml").write_text(
        f'name = "{t.name}"\n[cluster]\ngpu = "a100-80gb"\nllm = "llama-2-7b"\n'
        f'tp = 1\nreplicas = 1\nblock_tokens = 1\n[cost]\nkind = "unit-round"\n'
        f'memory_tokens = {inst.cost.memory_tokens}\n[trace]\nfile = "trace.csv"\n')
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="60,1000,3000,10000")
    ap.add_argument("--time-limit", type=float, default=2.0)
    ap.add_argument("--formulations", default=",".join(FORMULATIONS))
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--cli", action="store_true", help="also time `lpserve bound` processes")
    ap.add_argument("--cold", action="store_true",
                    help="one fresh process per lp.solve call (import and kernel load included)")
    args = ap.parse_args()
    T = args.time_limit
    allow = 1.1 * T + 1.0
    names = args.formulations.split(",")
    if not args.cold:  # warm-up: imports, HiGHS, compiled kernels
        for name in names:
            lp.solve(name, instance("light", 5), time_limit_s=T)
    worst, failed = 0.0, []
    tmp = Path(tempfile.mkdtemp(prefix="lpserve-tl-"))
    print(f"time limit T = {T:g} s, allowance 1.1 T + 1 = {allow:g} s")
    print(f"{'family':<11}{'n':>6}  {'formulation':<19}{'wall_s':>8}  {'status':<10}"
          f"{'objective':>14}{'bound':>14}  {'cli_s':>6}")
    for family in args.families.split(","):
        for n in (int(x) for x in args.sizes.split(",")):
            inst = instance(family, n)
            folder = write_instance(inst, tmp / f"{family}-{n}") if args.cli else None
            for name in names:
                if args.cold:
                    code = (f"import sys, time; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                            f"import solve_time_limits as B, lpserve as lp\n"
                            f"inst = B.instance({family!r}, {n})\n"
                            f"t0 = time.perf_counter(); s = lp.solve({name!r}, inst, "
                            f"time_limit_s={T})\n"
                            f"print(time.perf_counter() - t0, s.status.value, s.objective, "
                            f"s.bound)")
                    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                         text=True, check=True).stdout.split()
                    wall, status, obj, bound = float(out[0]), out[1], float(out[2]), \
                        float(out[3])
                else:
                    t0 = time.perf_counter()
                    sol = lp.solve(name, inst, time_limit_s=T)
                    wall = time.perf_counter() - t0
                    status, obj, bound = sol.status.value, sol.objective, sol.bound
                cli = ""
                if folder is not None:
                    t0 = time.perf_counter()
                    r = subprocess.run([sys.executable, "-m", "lpserve.cli", "bound", name,
                                        "--instance", str(folder), "--time-limit", str(T),
                                        "--json"], capture_output=True, text=True)
                    cli_s = time.perf_counter() - t0
                    cli = f"{cli_s:6.2f}"
                    if r.returncode != 0:
                        failed.append(f"cli {family} {n} {name}: exit {r.returncode} "
                                      f"{r.stderr.strip()[-200:]}")
                    elif json.loads(r.stdout)["status"] != status and status != "limit":
                        pass  # a different stopping point of the solver is allowed
                    worst = max(worst, cli_s / allow)
                    if cli_s > allow:
                        failed.append(f"cli {family} {n} {name}: {cli_s:.2f} s > {allow:g} s")
                worst = max(worst, wall / allow)
                if wall > allow:
                    failed.append(f"{family} {n} {name}: {wall:.2f} s > {allow:g} s")
                if name in ROUND_MODEL and not math.isfinite(bound):
                    failed.append(f"{family} {n} {name}: no finite bound ({status})")
                print(f"{family:<11}{n:>6}  {name:<19}{wall:8.2f}  {status:<10}{obj:14.6g}"
                      f"{bound:14.6g}  {cli}", flush=True)
    print(f"FIGURE time-limited solves (T = {T:g} s, n <= {args.sizes.split(',')[-1]}): "
          f"largest wall / (1.1 T + 1) = {worst:.2f} (target <= 1)")
    for f in failed:
        print("FAILED", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
