"""The simulator against real serving: each public measured run rebuilt and simulated.

For every stage of the bundled public runs (inference-perf against vLLM's V1 engine on
H100 SXM: Llama-2-7B TP1, Llama-2-70B TP4, Mixtral-8x7B TP2, CodeLlama-34B TP2; provenance
in ``lpserve/data/serving/README.md``) this rebuilds the client's workload (constant-rate
arrivals, the shared-prefix prompt set cycled in a shuffled order, exact output lengths),
simulates it on one replica with lpserve's ``vllm`` policy, the run's
``max_num_batched_tokens`` / ``max_num_seqs`` and vLLM's async scheduling
(``schedule_ahead``), and prints per stage the measured and
simulated mean and p90 E2E and TTFT and mean inter-token latency (seconds per generated
token), their absolute percentage errors, whether each side saturated, then the MAPE per
figure on the validation split (stages of runs the shipped fits never saw) and on the
train split (``lpserve.evaluate.sim_to_real.TRAIN_PROFILES``). Stages the real server
overloaded (requests timed out) are listed but kept out of the MAPE.

    python benchmarks/sim_to_real.py [--calibration NAME|FILE] [--engine E] [--json]

Default: the cost model ``lp.cost_model`` picks for each run with ``engine="vllm"``.
"""
from __future__ import annotations

import argparse
import json
import time

from lpserve.evaluate.sim_to_real import COMPARED, compare_runs, mape, split_of
from lpserve.trace.serving_runs import bundled_serving_runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", default=None,
                    help="a shipped calibration's name or a TOML from `lpserve calibrate`")
    ap.add_argument("--engine", default="vllm", help="engine profile (default: vllm)")
    ap.add_argument("--split", choices=("all", "train", "validation"), default="all")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    opts = {"engine": args.engine}
    if args.calibration:
        opts["calibration"] = args.calibration
    stages = [s for s in bundled_serving_runs()
              if args.split == "all" or split_of(s) == args.split]
    t0 = time.perf_counter()
    rows = compare_runs(stages, **opts)
    wall = time.perf_counter() - t0
    by_split = {sp: mape([r for r in rows if split_of(r.stage) == sp])
                for sp in ("validation", "train")}
    false_sat = [r.stage.key for r in rows if r.sim_saturated and not r.real_saturated]
    if args.json:
        print(json.dumps({"rows": [dict(r.row(), split=split_of(r.stage)) for r in rows],
                          "mape": by_split, "saturated_only_in_sim": false_sat,
                          "wall_s": wall}, indent=1, default=float))
        return
    head = "  ".join(f"{m[:-2]}.{s}".rjust(20) for m, s in COMPARED)
    print(f"{'stage':46s} {'split':5s} {'rps':>4s}  {head}  saturated (real/sim)")
    print(f"{'':46s} {'':5s} {'':>4s}  " + "  ".join(
        "real / sim ms (APE)".rjust(20) for _ in COMPARED))
    for r in rows:
        cells = []
        for m, s in COMPARED:
            k = f"{m}.{s}"
            cells.append(f"{1e3 * r.real[k]:.0f}/{1e3 * r.sim[k]:.0f} ({r.ape(k):.0f}%)"
                         .rjust(20))
        sat = f"{'yes' if r.real_saturated else 'no'}/{'yes' if r.sim_saturated else 'no'}"
        print(f"{r.stage.key[16:]:46s} {split_of(r.stage)[:5]:5s} {r.stage.rate_rps:4.0f}  "
              + "  ".join(cells) + f"  {sat}")
    cal = sorted({r.calibration for r in rows})
    front = sorted({round(r.frontend_latency_s * 1e3, 2) for r in rows})
    print(f"\ncalibration(s): {', '.join(cal)}; engine {args.engine}; front-end latency "
          f"{', '.join(f'{x:g}' for x in front)} ms; {len(rows)} stages simulated in {wall:.1f} s")
    for sp, mp in by_split.items():
        n = sum(1 for r in rows if split_of(r.stage) == sp and not r.real_saturated)
        print(f"MAPE {sp:10s} ({n:2d} stages): " + ", ".join(
            f"{k} {v:.1f} %" for k, v in mp.items()))
    print(f"saturated in simulation but not for real: {len(false_sat)}"
          + (f" ({', '.join(k[16:] for k in false_sat)})" if false_sat else ""))
    print("itl: seconds per generated token after the first; inference-perf's own ITL "
          "(gaps between streamed chunks) is about half of it on these runs")


if __name__ == "__main__":
    main()
