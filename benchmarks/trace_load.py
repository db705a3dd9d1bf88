"""Trace loading speed: the 30-minute Azure conversation slice (10,108 rows) and the
Mooncake conversation slice (5,719 rows with prefix-block ids).

Usage: python benchmarks/trace_load.py [SHARED_TRACES_DIR]

Prints the best of 5 loads of each file (first-import costs excluded by a warm-up load),
and exits 1 if a target (Azure < 1 s, Mooncake < 2 s) is missed.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import lpserve as lp

TARGETS_S = {
    "azure_llm_2023_conv_first30min.csv.gz": 1.0,
    "mooncake_fast25_conversation_first30min.jsonl.gz": 2.0,
}


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        Path(__file__).resolve().parents[1].parent / "shared" / "traces"
    if not root.is_dir():
        print(f"trace folder not found: {root} (pass it as the first argument)")
        return 2
    ok = True
    for fname, target in TARGETS_S.items():
        path = root / fname
        lp.load_trace(path)  # warm-up: imports pandas and friends once
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            tr = lp.load_trace(path)
            times.append(time.perf_counter() - t0)
        best = min(times)
        ok &= best < target
        print(f"{fname}: {len(tr):,} requests in {best * 1000:.1f} ms "
              f"(median {sorted(times)[2] * 1000:.1f} ms; target < {target:.0f} s) "
              f"{'OK' if best < target else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
