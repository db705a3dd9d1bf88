"""Wall time of ``lpserve gap`` at its defaults (targets: under 8 s warm, under 30 s cold,
i.e. with numba compiling every kernel as on a fresh clone), and the figure it reports:
each policy's mean end-to-end latency over the cost-model lower bound on the bundled trace.

Runs the command in a fresh process, as a user would, with ``--json`` and a temporary report
folder; ``--cold`` points numba at an empty cache folder first. Exits 1 when the wall time
misses the target or the report lacks its plots.

    python benchmarks/gap_default.py [--cold] [--target-s S] [extra lpserve gap arguments ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", action="store_true",
                    help="compile every numba kernel (an empty NUMBA_CACHE_DIR), as a fresh "
                    "clone does")
    ap.add_argument("--target-s", type=float, default=None,
                    help="wall-time target (s; default 8 warm, 30 cold)")
    args, extra = ap.parse_known_args()
    target = args.target_s if args.target_s is not None else (30.0 if args.cold else 8.0)
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as cache:
        cmd = [sys.executable, "-m", "lpserve.cli", "gap", "--json", "--out", tmp, *extra]
        env = dict(os.environ, **({"NUMBA_CACHE_DIR": cache} if args.cold else {}))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stderr.strip() or proc.stdout.strip())
            return proc.returncode
        d = json.loads(proc.stdout)
        pngs = sorted(p.name for p in Path(tmp).glob("*.png"))
    print(d["workload"])
    print(f"{'policy':<26}{'kind':<12}{'e2e mean s':>11}{'bound s':>9}{'ratio':>8}"
          f"{'P99/P50':>9}")
    for r in d["table"]:
        print(f"{r['policy']:<26}{r['kind']:<12}{r['e2e_s']['mean']:>11.3f}"
              f"{r['bound_value']:>9.3f}{r['ratio_to_bound']:>8.3f}"
              f"{r['e2e_s_p99_over_p50']:>9.3f}")
    best = min(d["table"], key=lambda r: r["ratio_to_bound"])
    ok = wall < target and len(pngs) >= 3
    print(f"plots: {', '.join(pngs)}")
    print(f"FIGURE lpserve gap (defaults, {'cold' if args.cold else 'warm'}) wall {wall:.1f} s "
          f"(command's own {d['wall_s']:.1f} s, simulation {d['sim_s']:.1f} s), target < "
          f"{target:g} s: "
          f"{'met' if ok else 'MISSED'}; best ratio to the bound {best['ratio_to_bound']:.3f} "
          f"({best['policy']})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
