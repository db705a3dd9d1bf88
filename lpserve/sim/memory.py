"""What a run's replicas hold in memory: their KV blocks (:func:`kv_memory`), and the
host memory of their arrays, checked before they are built (layer 4).

A compiled replica holds arrays sized by its KV block pool and the run's limits
(:class:`lpserve.sim.compiled.CompiledReplica`); a cluster of ``R`` replicas holds ``R``
times the first one's. :func:`check_replicas` builds nothing: it is given the first
replica, and refuses the run with the estimate when the rest would not fit in the memory
the machine has available (``MemAvailable`` of ``/proc/meminfo``), rather than letting
the operating system kill the process midway.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from lpserve.sim.speculative import SpecRunner, speculation_memory

#: share of the available memory a run's replicas may take (the rest: the run's
#: per-request state, results, the interpreter)
MAX_SHARE = 0.8


def replica_bytes(replica: Any) -> int:
    """Bytes of the arrays a compiled replica holds (its pool and its state)."""
    total = 0
    for group in (getattr(replica, "r", None), getattr(replica, "pool", None)):
        for a in (group or ()):
            if isinstance(a, np.ndarray):
                total += a.nbytes
    return total


def available_bytes() -> int | None:
    """Memory the machine has available now (bytes), or ``None`` where it cannot tell."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_replicas(first: Any, count: int, role: str, available: int | None = None,
                   scale: float = 1.0) -> None:
    """Refuse (``MemoryError`` with the estimate) a pool of ``count`` replicas like
    ``first`` that would take more than :data:`MAX_SHARE` of the available memory;
    ``scale`` (>= 1) sizes each as the largest pool of a heterogeneous cluster (its KV
    blocks over the first replica's: an over-estimate of the per-request part)."""
    per = int(replica_bytes(first) * scale)
    avail = available_bytes() if available is None else available
    if not per or avail is None or count * per <= MAX_SHARE * avail:
        return
    blocks = int(getattr(first, "ctx", None).total_blocks) if hasattr(first, "ctx") else 0
    raise MemoryError(
        f"{count:,} {role} replicas would hold about {count * per / 2**30:,.1f} GiB "
        f"({per / 2**20:,.2f} MiB each: a pool of {blocks:,} KV blocks and the run's "
        f"per-request state), more than {MAX_SHARE:.0%} of the {avail / 2**30:,.1f} GiB this "
        f"machine has available; simulate at most {int(MAX_SHARE * avail // per):,} "
        "replicas here, or fewer requests")


def kv_memory(cost: Any, cluster: Any, policy: Any, state: Any,
              seeds: np.random.SeedSequence) -> tuple[int, int, float, Any]:
    """``(total, host, kv_scale, spec)`` of one replica of ``cluster`` priced by ``cost``:
    its KV blocks on the GPU and on the host, KV bytes per token over the target model's
    (> 1 with draft models), and the speculative-decoding runner (None without
    speculation; its drafts' memory resizes the KV pool, and it takes the next child of
    ``seeds`` for its acceptance draws). Raises ValueError naming the cluster when no KV
    block fits."""
    bt = int(cluster.block_tokens)
    total = int(cost.kv_capacity_blocks(block_tokens=bt,
                                        gpu_memory_fraction=cluster.gpu_memory_fraction))
    block_bytes = float(cost.kv_bytes_per_token) * bt
    host = int(cluster.host_memory_gb * 1e9 // block_bytes) if block_bytes > 0 else 0
    kv_scale, spec = 1.0, None
    if policy.engine.speculation is not None:
        spec = SpecRunner(policy.engine.speculation, cost, state, seeds.spawn(1)[0],
                          policy.name)
        total, host, kv_scale = speculation_memory(
            cost, spec.drafts, cluster.gpu_memory_fraction, cluster.host_memory_gb, bt,
            f"policy {policy.name!r}: EngineConfig.speculation")
    if total < 1:
        raise ValueError(f"cluster {cluster.gpu}/{cluster.llm} tp={cluster.tp}: no room for "
                         f"KV blocks (kv_capacity_blocks = {total})")
    return total, host, kv_scale, spec
