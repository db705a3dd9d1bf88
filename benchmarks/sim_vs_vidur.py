"""lpserve's simulator beside Vidur on Vidur's fixed workload.

10,000 requests, Poisson arrivals (seed 42), total tokens ~ U[512, 2048] split
prefill:decode = 3:1, Llama-2-7B on A100-80GB TP1, vLLM scheduler (batch cap 128, 4096
tokens per batch), no prefix caching, round robin. Configurations: 3 QPS on 1 replica,
12 QPS on 4 replicas, 3 QPS on 4 replicas. Prints wall time (numba compile excluded and
reported separately), the speed-up over Vidur, and TTFT / TBT / E2E medians side by
side. Vidur's measured figures are read from ``benchmarks/data/vidur_reference.json``;
when Vidur's per-request file ``vidur_requests_<qps>qps_<replicas>r.csv.gz`` is there, the
very same requests (arrival times and token counts) are simulated, else the workload is
regenerated from the same distributions.

    python benchmarks/sim_vs_vidur.py [--requests 10000] [--reference PATH]

Exits 1 when a speed-up is below 50x (when Vidur's wall time is known).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

CONFIGS = [("3qps-1rep", 3.0, 1), ("12qps-4rep", 12.0, 4), ("3qps-4rep", 3.0, 4)]
REF = Path(__file__).resolve().parent / "data" / "vidur_reference.json"


def vidur_workload(n: int, qps: float, seed: int = 42):
    """Vidur's synthetic workload: Poisson(qps) arrivals, total ~ U[512, 2048], 3:1 split."""
    import lpserve as lp

    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / qps, n))
    arrival -= arrival[0]
    total = rng.integers(512, 2049, n)
    decode = np.ceil(total / 4.0).astype(np.int64)
    return lp.Trace.from_arrays(arrival_s=arrival, prompt_tokens=total - decode,
                                output_tokens=decode, name=f"vidur-synthetic-{qps}qps")


def vidur_requests(qps: float, replicas: int):
    """Vidur's own requests for a configuration, or None when the file is missing."""
    import lpserve as lp

    f = REF.parent / f"vidur_requests_{qps:g}qps_{replicas}r.csv.gz"
    if not f.exists():
        return None
    import pandas as pd

    df = pd.read_csv(f).sort_values("arrived_at", kind="stable")
    return lp.Trace.from_arrays(arrival_s=df["arrived_at"].to_numpy(),
                                prompt_tokens=df["num_prefill_tokens"].to_numpy(),
                                output_tokens=df["num_decode_tokens"].to_numpy(),
                                name=f.name)


def _records(obj) -> list[dict]:
    if isinstance(obj, list):
        return [r for r in obj if isinstance(r, dict)]
    if isinstance(obj, dict):
        for key in ("configs", "runs", "results", "configurations"):
            if key in obj:
                return _records(obj[key])
        recs = []
        for k, v in obj.items():
            if isinstance(v, dict):
                recs.append({"name": k, **v})
        return recs
    return []


def _get(rec: dict, *names):
    for n in names:
        cur = rec
        ok = True
        for part in n.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                ok = False
                break
        if ok and cur is not None:
            return cur
    return None


def load_reference(path: Path) -> dict[tuple[float, int], dict] | None:
    """Vidur's figures keyed by (qps, replicas): wall_s and p50s in seconds."""
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    recs = _records(raw)
    idle = raw.get("harness_readme_uncontended_wall_s", {}) if isinstance(raw, dict) else {}
    out = {}
    for r in recs:
        qps = _get(r, "qps", "config.qps")
        reps = _get(r, "replicas", "num_replicas", "config.replicas")
        if qps is None or reps is None:
            continue
        if (_get(r, "global_scheduler") or "round_robin") not in ("round_robin", "rr"):
            continue
        if (_get(r, "replica_scheduler") or "vllm") != "vllm":
            continue

        def sec(*keys_ms_s):
            for k in keys_ms_s:
                v = _get(r, k)
                if v is not None:
                    return float(v) / 1000.0 if k.endswith("_ms") else float(v)
            return float("nan")

        out[(float(qps), int(reps))] = {
            "wall_s": sec("wall_s", "wall.s"),
            # the smaller of the measured (shared host) and the uncontended wall time
            "wall_min_s": min(sec("wall_s", "wall.s"),
                              float(idle.get(f"{float(qps):g}qps_{int(reps)}r", math.inf))),
            "iterations": _get(r, "iterations"),
            "ttft_p50_s": sec("ttft_p50_ms", "ttft_p50_s", "ttft_s.p50", "ttft.p50"),
            "tbt_p50_s": sec("tbt_p50_ms", "tbt_p50_s", "tbt_s.p50", "tbt.p50"),
            "e2e_p50_s": sec("e2e_p50_ms", "e2e_p50_s", "e2e_s.p50", "e2e.p50"),
        }
    return out


def main() -> int:
    import lpserve as lp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--reference", type=Path, default=REF)
    args = ap.parse_args()
    policy = lp.make_policy("vllm-v0", max_num_seqs=128, max_num_batched_tokens=4096,
                            prefix_caching=False)
    t0 = time.perf_counter()
    warm = lp.Instance(trace=vidur_workload(50, 3.0), cluster=lp.Cluster(
        gpu="a100-80gb", llm="llama-2-7b", tp=1, replicas=1))
    lp.simulate(warm, policy)
    compile_s = time.perf_counter() - t0
    ref = load_reference(args.reference)
    if ref is None:
        print(f"NOTE: {args.reference} is missing: Vidur's measured results are not "
              "available, so no speed-up or median comparison can be made.")
    print(f"numba compile + first small run: {compile_s:.2f} s (excluded below)")
    print("vidur s: the smaller of Vidur's measured wall time and its uncontended wall time")
    hdr = (f"{'config':<11} {'lpserve s':>9} {'vidur s':>8} {'speedup':>8} | "
           f"{'TTFT p50 ms':>17} | {'TBT p50 ms':>15} | {'E2E p50 s':>15}")
    print(hdr)
    print(" " * 40 + "lpserve / vidur")
    ok = True
    for name, qps, reps in CONFIGS:
        trace = vidur_requests(qps, reps) if args.requests == 10_000 else None
        source = "Vidur's requests" if trace is not None else "regenerated"
        if trace is None:
            trace = vidur_workload(args.requests, qps)
        inst = lp.Instance(trace=trace, cluster=lp.Cluster(
            gpu="a100-80gb", llm="llama-2-7b", tp=1, replicas=reps))
        t = time.perf_counter()
        res = lp.simulate(inst, policy)
        wall = time.perf_counter() - t
        s = res.summary()
        v = (ref or {}).get((qps, reps))
        vw = v["wall_min_s"] if v else float("nan")
        speed = vw / wall if v and math.isfinite(vw) else float("nan")
        if math.isfinite(speed) and speed < 50:
            ok = False

        def pair(x, y, scale, fmt):
            return f"{x * scale:{fmt}} / {y * scale:{fmt}}" if v else f"{x * scale:{fmt}} / -"

        print(f"{name:<11} {wall:>9.3f} {vw:>8.1f} {speed:>7.0f}x | "
              f"{pair(s['ttft_s']['p50'], v['ttft_p50_s'] if v else 0, 1e3, '7.1f'):>17} | "
              f"{pair(s['tpot_s']['p50'], v['tbt_p50_s'] if v else 0, 1e3, '6.2f'):>15} | "
              f"{pair(s['e2e_s']['p50'], v['e2e_p50_s'] if v else 0, 1, '6.2f'):>15}"
              f"   [{source}] finished {s['n_finished']}/{s['n_requests']}, "
              f"iterations {res.stats['iterations']:,}"
              + (f" (Vidur {v['iterations']:,})" if v and v.get('iterations') else "")
              + f", preemptions {s['preemptions']}")
    print("TBT: lpserve's per-request TPOT (decode time / (output - 1)); Vidur's "
          "decode_time_execution_plus_preemption_normalized.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
