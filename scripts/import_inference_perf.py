"""Build lpserve/data/serving/inference_sim_h100_vllm.json from a checkout of the public
runs (the ``default_args/`` folder of inference-sim/training).

    python scripts/import_inference_perf.py PATH/TO/default_args > lpserve/data/serving/inference_sim_h100_vllm.json

Each run folder is read by :func:`lpserve.trace.serving_runs.load_inference_perf`; the
output keeps every stage with its workload parameters and measured means and p90s.
"""
import json
import sys
from pathlib import Path

from lpserve.trace.serving_runs import load_inference_perf

PROVENANCE = {
    "origin": "GitHub inference-sim/training, default_args/*/ "
              "(commit ed5c1d26900e6909758d5e1641a18edaf56a1caf, 2026-03-18)",
    "measured": "inference-perf (kubernetes-sigs) against vLLM (V1 engine) on H100 SXM, "
                "2026-02-17/18; exp-config.yaml, results/config.yaml, "
                "results/stage_K_lifecycle_metrics.json of each run",
    "license": "the repository states no license; only measured figures and benchmark "
               "settings are kept here, with this attribution",
}


def main(root: str) -> None:
    stages = []
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        # vLLM V1 of February 2026: async scheduling is its default (since 0.14)
        stages.extend(s.as_dict() for s in load_inference_perf(
            folder, gpu="h100-sxm", engine_version="vLLM V1", schedule_ahead=True))
    json.dump({"provenance": PROVENANCE, "stages": stages}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
