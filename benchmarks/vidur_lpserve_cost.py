"""Vidur's benchmark workload run inside Vidur with an lpserve policy and lpserve's cost
model: no profiling data, no execution-time predictor training.

Workload (Vidur's own synthetic generator, as the peer harness runs it): 10,000 requests,
Poisson arrivals at 3 QPS (seed 42), total tokens ~ U[512, 2048] split prefill:decode =
3:1, Llama-2-7B on A100 TP1, one replica, vLLM replica scheduler (batch cap 128, 4096
tokens per batch). The replica scheduler is ``lpserve_vllm`` (Vidur's vLLM scheduler with
the lpserve policy's order), the router ``lpserve``, the predictor ``lpserve_cost``.

Runs in the Vidur environment (``bash scripts/vidur-env.sh``)::

    .venv-vidur/bin/python benchmarks/vidur_lpserve_cost.py [--requests 10000] [--qps 3]
        [--replicas 1] [--policy vllm] [--params '{}']

Runs offline (``HF_HUB_OFFLINE=1``) in a fresh working directory and fails if Vidur
created a profiling or predictor cache there. Prints wall time (import, set-up, run),
requests per wall second, TTFT / TBT / E2E percentiles from Vidur's request metrics and
the number of policy rankings. Exits 1 if the run does not finish every request.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--qps", type=float, default=3.0)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--policy", default="vllm",
                    help="registered lpserve policy or module:attr (default: vllm, FCFS)")
    ap.add_argument("--params", default="{}", help="policy parameters as JSON")
    args = ap.parse_args(argv)

    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("WANDB_MODE", "disabled")
    sys.path.insert(0, str(REPO))  # module:attr policies from the repository
    work = Path(tempfile.mkdtemp(prefix="vidur-lpserve-"))
    os.chdir(work)

    t0 = time.perf_counter()
    import numpy as np
    import pandas as pd

    from lpserve.adapters import vidur as V
    t_import = time.perf_counter() - t0

    t1 = time.perf_counter()
    cfg = V.simulation_config(
        policy=args.policy, params=json.loads(args.params), output_dir=str(work / "out"),
        synthetic={"num_requests": args.requests, "qps": args.qps, "min_tokens": 512,
                   "max_tokens": 2048, "prefill_to_decode_ratio": 3.0},
        num_replicas=args.replicas, seed=42)
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    set_seeds(cfg.seed)
    sim = Simulator(cfg)
    t_init = time.perf_counter() - t1
    t2 = time.perf_counter()
    sim.run()
    t_run = time.perf_counter() - t2
    wall = time.perf_counter() - t0

    caches = [p for p in work.rglob("*") if ".vidur_cache" in p.parts]
    if caches:
        print(f"FAIL: Vidur created profiling/predictor files: {caches[:3]}", file=sys.stderr)
        return 1
    df = pd.read_csv(Path(cfg.metrics_config.output_dir) / "request_metrics.csv")
    if len(df) != args.requests:
        print(f"FAIL: {len(df)} of {args.requests} requests finished", file=sys.stderr)
        return 1
    rankings = sum(s.n_rankings for s in sim.scheduler._replica_schedulers.values())

    def pct(col: str, scale: float) -> str:
        v = df[col].to_numpy(dtype=float) * scale
        return " / ".join(f"{x:.4g}" for x in np.percentile(v, [50, 90, 99]))

    print(f"vidur {V.VIDUR_VERSION} + lpserve policy {args.policy!r} + lpserve cost model, "
          f"N={args.requests} qps={args.qps:g} replicas={args.replicas}")
    print(f"wall={wall:.1f}s (import {t_import:.1f}s, setup {t_init:.1f}s, "
          f"run {t_run:.1f}s) req/wall_s={args.requests / wall:.0f} "
          f"policy rankings={rankings}")
    print(f"TTFT p50/p90/p99 = {pct('prefill_e2e_time', 1e3)} ms; "
          f"TBT p50/p90/p99 = {pct('decode_time_execution_plus_preemption_normalized', 1e3)} ms; "
          f"E2E p50/p90/p99 = {pct('request_e2e_time', 1.0)} s; "
          f"restarts={int(df['request_num_restarts'].sum())}")
    print(json.dumps({"wall_s": round(wall, 2), "import_s": round(t_import, 2),
                      "setup_s": round(t_init, 2), "run_s": round(t_run, 2),
                      "n_requests": args.requests, "policy": args.policy,
                      "rankings": int(rankings),
                      "e2e_p50_s": float(np.median(df["request_e2e_time"])),
                      "ttft_p50_s": float(np.median(df["prefill_e2e_time"]))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
