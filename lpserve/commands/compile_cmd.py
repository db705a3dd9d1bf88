"""``lpserve compile``: compile the simulator's numba kernels into numba's on-disk cache.

The compiled engine's kernels (``lpserve/sim/_*.py``, ``lpserve/kernels``, the cost
model's kernels) compile on first use and are cached next to their sources
(``__pycache__``; ``NUMBA_CACHE_DIR`` moves the cache), so every later process loads them
in a few seconds. A fresh checkout pays the compilation once; ``scripts/setup-env.sh`` runs
this command so that the first ``lpserve gap`` or test run does not. It simulates a tiny
instance with every registered policy (each engine path it uses), then reports the time.

numba checks a cached kernel against its own source file only: a kernel whose callee in
another module changed would load stale machine code. So the command first hashes every
package source that defines kernels and, when the hash differs from the one recorded at
the last compile (``lpserve/__pycache__/kernels.sha256``), deletes the package's numba
cache files (``*.nbi``, ``*.nbc``) before compiling.
"""
from __future__ import annotations

import argparse
import re
import time
from typing import Any

__all__ = ["compile_kernels", "invalidate_stale_kernels", "register"]

_KERNEL = re.compile(rb"^[ \t]*@(numba\.|nb\.)?n?jit\b", re.M)  # a numba decorator line


def invalidate_stale_kernels(root: Any = None) -> bool:
    """Delete the numba cache files under ``root`` (default: the lpserve package) when a
    kernel source there changed since the last call (see the module docstring); True if
    they were deleted. With ``NUMBA_CACHE_DIR`` set by the user nothing is touched for the
    package (its owner manages that cache)."""
    import hashlib
    import os
    from pathlib import Path

    if root is None:
        if os.environ.get("NUMBA_CACHE_DIR"):
            return False
        root = Path(__file__).resolve().parents[1]
    root = Path(root)
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        text = f.read_bytes()
        if _KERNEL.search(text):  # a file with a numba decorator
            h.update(str(f.relative_to(root)).encode() + b"\0" + text)
    stamp = root / "__pycache__" / "kernels.sha256"
    if stamp.exists() and stamp.read_text() == h.hexdigest():
        return False
    for pattern in ("*.nbi", "*.nbc"):
        for f in root.rglob(pattern):
            f.unlink()
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(h.hexdigest())
    return True


def compile_kernels() -> dict[str, Any]:
    """Simulate a 12-request instance with every registered policy (on two colocated
    replicas, or one prefill and one decode replica for the disaggregated ones), once with
    the invariant checks on, so that every kernel the simulator uses is compiled and
    cached. Returns ``{"policies": n, "wall_s": s}``."""
    import numpy as np

    from lpserve.cluster import Cluster
    from lpserve.instance import SLO, Instance
    from lpserve.registry import make_policy, policy_names, simulate
    from lpserve.trace import Trace

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    n = 12
    tr = Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 1.0, n)),
                           prompt_tokens=rng.integers(16, 400, n),
                           output_tokens=rng.integers(1, 24, n),
                           block_ids=[[1, 2, 3][:k] for k in rng.integers(0, 4, n)],
                           block_tokens=16)
    colo = Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2, gpu_memory_fraction=0.2)
    disagg = Cluster(gpu="a100-80gb", llm="llama-2-7b", prefill_replicas=1,
                     decode_replicas=1, gpu_memory_fraction=0.2)
    slo = SLO(ttft_s=1.0, tpot_s=0.1)  # for the policies whose targets mirror the SLO
    names = policy_names()
    for k, name in enumerate(names):
        # prediction readers run with the online History predictor (every kernel path)
        pred = "history" if make_policy(name).reads_predictions else None
        try:
            simulate(Instance(trace=tr, cluster=colo, slo=slo), name, check=k == 0,
                     predictor=pred)
        except ValueError:  # a policy for disaggregated clusters
            simulate(Instance(trace=tr, cluster=disagg, slo=slo), name, check=k == 0,
                     predictor=pred)
    return {"policies": len(names), "wall_s": round(time.perf_counter() - t0, 2)}


def _run(args: argparse.Namespace) -> int:
    from lpserve.commands.common import emit_json

    stale = invalidate_stale_kernels()
    out = {**compile_kernels(), "recompiled": stale}
    if args.json:
        emit_json(out)
    else:
        print(f"lpserve compile: simulator kernels ready ({out['policies']} policies, "
              f"{out['wall_s']:.1f} s"
              f"{'; kernel sources changed: cache rebuilt' if stale else ''})")
    return 0


def register(sub: Any) -> None:
    """Add ``lpserve compile`` to the sub-command parsers ``sub``."""
    p = sub.add_parser("compile", help="compile the simulator's numba kernels into the cache "
                       "(once per checkout; later runs load them)",
                       description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_run)
