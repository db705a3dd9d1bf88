"""Speed of the cost-model kernels: decode-batch iterations per second on one core.

Prints the numba kernel's rate on batches of 32 decode contexts (vectorized entry point
``batch_times`` and the decode fast path ``decode_run``), the plain-Python ``_ref``
twin's rate on the same batches, and the speed-up.

    python benchmarks/cost_speed.py [--batches 2000000] [--gpu a100-80gb --llm llama-2-70b --tp 4]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np

from lpserve.cost import _kernels as K
from lpserve.cost import cost_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=2_000_000)
    ap.add_argument("--ref-batches", type=int, default=20_000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--gpu", default="a100-80gb")
    ap.add_argument("--llm", default="llama-2-70b")
    ap.add_argument("--tp", type=int, default=4)
    args = ap.parse_args()
    p = cost_model(gpu=args.gpu, llm=args.llm, tp=args.tp).params
    rng = np.random.default_rng(0)
    n, b = args.batches, args.batch_size
    ctx = rng.integers(1, 4096, size=n * b).astype(np.int64)
    d_off = np.arange(0, n * b + 1, b, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    p_off = np.zeros(n + 1, dtype=np.int64)
    out = np.zeros(n)
    K.batch_times(p, empty, empty, p_off[:2], ctx[:b], d_off[:2], out[:1])  # compile
    t0 = time.perf_counter()
    K.batch_times(p, empty, empty, p_off, ctx, d_off, out)
    kernel_s = time.perf_counter() - t0
    kernel_rate = n / kernel_s

    K.decode_run(p, ctx[:b], 1)
    iters = 5_000_000
    t0 = time.perf_counter()
    total = K.decode_run(p, ctx[:b], iters)
    run_rate = iters / (time.perf_counter() - t0)

    m = min(args.ref_batches, n)
    out_ref = np.zeros(m)
    t0 = time.perf_counter()
    K.batch_times_ref(p, empty, empty, p_off[:m + 1], ctx, d_off[:m + 1], out_ref)
    ref_rate = m / (time.perf_counter() - t0)
    assert np.allclose(out_ref, out[:m], rtol=1e-11), "kernel and _ref disagree"
    assert total > 0

    print(f"cost model: {args.llm} on {args.gpu} x{args.tp}, decode batches of {b} contexts")
    print(f"numba batch_times : {kernel_rate / 1e6:8.2f} M batch-iterations/s "
          f"({n:,} batches in {kernel_s:.3f} s)")
    print(f"numba decode_run  : {run_rate / 1e6:8.2f} M iterations/s (context sums updated in O(1))")
    print(f"python _ref twin  : {ref_rate / 1e3:8.2f} k batch-iterations/s")
    print(f"speed-up (batch_times / _ref): {kernel_rate / ref_rate:,.0f}x")
    ok = kernel_rate >= 5e6 and kernel_rate / ref_rate >= 50
    print("targets (>= 5 M/s, >= 50x):", "met" if ok else "MISSED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
