"""Compressed swap-out and per-victim preemption decisions of a :class:`Replica`.

The equations are in ``models/kv-compression-swap.md``; :mod:`lpserve.preemption` computes
them from the cost model. A compressed swap-out holds ``ceil(held / ratio)`` host blocks
(2) and is priced in the replica's next iteration as PCIe time of the compressed bytes plus
a quantize pass (4); swap-in takes back all ``held`` GPU blocks, so the request returns
with exactly the context it had, and is priced the same way (dequantize pass).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lpserve.cost._kernels import iteration_time
from lpserve.policy import PolicyError
from lpserve.preemption import (PREEMPTION_CHOICES, PreemptionView, compressed_host_blocks,
                                swap_one_way_s)

if TYPE_CHECKING:  # pragma: no cover
    from lpserve.sim.replica import Replica


def one_way_s(rep: "Replica", held_blocks: int, mode: str) -> float:
    """Seconds to move ``held_blocks`` of ``rep``'s KV one way by ``mode``."""
    return swap_one_way_s(rep.sim.cost, held_blocks, rep.bt, mode,
                          rep.eng.compression_ratio)


def compress_out(rep: "Replica", v: int, held: int) -> bool:
    """Quantize and swap out victim ``v`` (``held`` GPU blocks) if its compressed KV fits in
    host memory; False (nothing changed) if it does not."""
    S = rep.S
    need = compressed_host_blocks(held, rep.eng.compression_ratio)
    if need > rep.host_free:
        return False
    rep.host_free -= need
    S.host_blocks[v] = need
    S.swap_gpu_blocks[v] = held
    S.swapped[v] = True
    S.compressed[v] = True
    rep._swap_s += one_way_s(rep, held, "compress-swap")
    rep.n_swaps += 1
    rep.n_compressed_swaps += 1
    rep.compressed_tokens += int(S.computed[v])
    return True


def view(rep: "Replica", v: int, held: int) -> PreemptionView:
    """The :class:`PreemptionView` of victim ``v`` holding ``held`` GPU blocks."""
    S, eng = rep.S, rep.eng
    ctx = int(S.computed[v])
    rec = float(iteration_time(rep.params, np.array([ctx], np.int64), np.zeros(1, np.int64),
                               np.zeros(0, np.int64))) if ctx else 0.0
    return PreemptionView(
        now_s=rep.now, replica=rep.index, request=int(v), context_tokens=ctx,
        held_blocks=int(held), block_tokens=rep.bt, host_free_blocks=int(rep.host_free),
        compression_ratio=float(eng.compression_ratio),
        compression_accuracy_cost=float(eng.compression_accuracy_cost),
        recompute_s=rec, swap_s=2.0 * one_way_s(rep, held, "swap"),
        compress_swap_s=2.0 * one_way_s(rep, held, "compress-swap"),
        swap_host_blocks=int(held),
        compress_host_blocks=compressed_host_blocks(held, eng.compression_ratio))


def decide(rep: "Replica", v: int, held: int) -> str:
    """``EngineConfig.preemption_decider``'s choice for victim ``v``, checked."""
    d = rep.eng.preemption_decider
    choice = d.decide(view(rep, v, held))
    if choice not in PREEMPTION_CHOICES:
        raise PolicyError(f"policy {rep.sim.policy.name!r} (preemption_decider "
                          f"{getattr(d, 'name', d)!r}): decide() returned {choice!r}, "
                          f"expected one of {PREEMPTION_CHOICES}")
    return choice
