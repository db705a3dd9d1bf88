"""vLLM's CPU KV offload: a host-memory tier behind a replica's GPU prefix cache
(``EngineConfig.kv_offload_gib``; ``models/simulator.md`` (35)).

The rule is vLLM V1's ``OffloadingConnector`` (write-through of every full block, LRU,
the leading run found after the GPU hits loaded before the prefill), as
:mod:`lpserve.sim._offload_kernels` says.

The tier holds block keys only (the content keys of ``State.block_keys``): a key is in
the tier, or it is not. A block is stored when the prefill chunk that completes it has
run, and marked used when a later request finds it (on the GPU or in the tier). Work is
per admission and per prefill chunk, linear in the blocks they touch; none per decode.
The plain-Python model of the compiled tier (:mod:`lpserve.sim._offload_kernels`),
its oracle in ``tests/unit/sim/test_offload.py`` and ``test_offload_kernels.py``.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Hashable, Sequence

from lpserve.sim._offload_kernels import GIB, tier_blocks

__all__ = ["GIB", "HostTier", "Offload", "found_tokens", "tier_blocks"]

def found_tokens(offload: "Offload | None", keys: Sequence[Hashable], gpu_hits: int,
                 context: int, block_tokens: int) -> tuple[int, int]:
    """Prompt tokens a request of ``context`` tokens (prompt + generated) with block
    ``keys`` need not compute, its first ``gpu_hits`` blocks found in the GPU prefix cache,
    and the blocks it loads from ``offload``'s host tier (the leading run found there
    next): ``(cached, n_load)``. At least one token is computed (``cached <= context - 1``),
    as with the GPU cache alone."""
    n_host = 0 if offload is None else offload.tier.match(keys, gpu_hits)
    cached = min((gpu_hits + n_host) * block_tokens, context - 1)
    return cached, max(-(-cached // block_tokens) - gpu_hits, 0)


class HostTier:
    """The host tier of one replica: at most ``capacity`` block keys, least recently used
    dropped first.

    Attributes:
        capacity: host blocks (>= 1).
        n_stored: keys inserted (blocks copied to the host, write-through).
        n_dropped: keys dropped for room (LRU).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"host tier capacity must be >= 1 block, got {capacity}")
        self.capacity = int(capacity)
        self._keys: OrderedDict[Hashable, None] = OrderedDict()
        self.n_stored = 0
        self.n_dropped = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._keys

    def match(self, keys: Sequence[Hashable], start: int) -> int:
        """Length of the leading run of ``keys[start:]`` held by the tier."""
        n = 0
        held = self._keys
        for k in keys[start:]:
            if k not in held:
                break
            n += 1
        return n

    def touch(self, keys: Sequence[Hashable]) -> None:
        """Mark a prompt's block ``keys`` used now (stored if absent), the last block first,
        so a prompt's leading blocks, which every later turn or sharer needs before its own,
        are the last of them to be dropped; the least recently used keys are dropped beyond
        the capacity."""
        held = self._keys
        for k in reversed(keys):
            if k in held:
                held.move_to_end(k)
            else:
                held[k] = None
                self.n_stored += 1
        while len(held) > self.capacity:
            held.popitem(last=False)
            self.n_dropped += 1


class Offload:
    """A replica's CPU KV offload: its :class:`HostTier`, the requests loading from it and
    the load stream (one host-to-device copy at a time, beside the iterations).

    Attributes:
        tier: the host tier; loads: request -> end of its load (s; ended ones are
            forgotten by :meth:`next_end_s`); free_s: when the load
            stream is free; hit_tokens, loaded_blocks, load_s: prompt tokens found in the
            tier, blocks loaded and their copy time (s).
    """

    def __init__(self, capacity: int, cost: Any, block_tokens: int, kv_scale: float) -> None:
        self.tier = HostTier(capacity)
        self.cost, self.bt, self.kv_scale = cost, int(block_tokens), float(kv_scale)
        self.loads: dict[int, float] = {}
        self.free_s = 0.0
        self.hit_tokens = self.loaded_blocks = 0
        self.load_s = 0.0

    @classmethod
    def for_replica(cls, gib: float, cost: Any, block_tokens: int,
                    kv_scale: float) -> "Offload | None":
        """The offload of a replica priced by ``cost`` (its KV bytes per token, its
        ``swap_time_s`` for a load, times ``kv_scale``) with ``gib`` GiB of host tier (None
        for 0)."""
        if not gib:
            return None
        n = tier_blocks(gib, cost.kv_bytes_per_token, block_tokens)
        if n < 1:
            raise ValueError(f"EngineConfig.kv_offload_gib={gib!r} holds no KV block of "
                             f"{block_tokens} tokens "
                             f"({cost.kv_bytes_per_token * block_tokens:,.0f} bytes)")
        return cls(n, cost, block_tokens, kv_scale)

    def next_end_s(self, now_s: float) -> float:
        """The first end of a load after ``now_s`` (``inf`` with none; ended loads, and
        those of requests preempted while loading, are forgotten)."""
        if any(end <= now_s for end in self.loads.values()):
            self.loads = {i: end for i, end in self.loads.items() if end > now_s}
        return min(self.loads.values(), default=math.inf)

    def admit(self, i: int, keys: Sequence[Hashable], gpu_hits: int, n_load: int,
              cached: int, now_s: float) -> float:
        """Request ``i`` is admitted with ``cached`` prompt tokens not to compute: its
        first ``gpu_hits`` blocks found on the GPU and its next ``n_load`` blocks (of
        ``keys``) found in the tier, which it loads after the loads before it; those blocks
        are marked used in the tier (stored, for GPU hits the tier had dropped). Returns
        the seconds the request waits for its load (0 without one)."""
        self.tier.touch(keys[:gpu_hits + n_load])
        self.loads.pop(i, None)  # a load lost to a preemption
        if not n_load:
            return 0.0
        load_s = float(self.cost.swap_time_s(n_load, self.bt)) * self.kv_scale
        self.free_s = end = max(now_s, self.free_s) + load_s
        self.loads[i] = end
        self.hit_tokens += cached - min(gpu_hits * self.bt, cached)
        self.loaded_blocks += n_load
        self.load_s += load_s
        return end - now_s

    def computed(self, keys: Sequence[Hashable], start: int, end: int) -> None:
        """A prefill chunk computed prompt tokens ``start..end-1`` of a prompt with block
        ``keys``: its full blocks completed now are stored in the tier (write-through)."""
        self.tier.touch(keys[start // self.bt:end // self.bt])

    def ready(self, requests: list[int], now_s: float) -> list[int]:
        """``requests`` without those still loading at ``now_s``."""
        if not self.loads or not math.isfinite(self.next_end_s(now_s)):
            return requests
        return [i for i in requests if i not in self.loads]

    def stats(self) -> dict:
        """Counters of this replica's offload (summed over replicas by the run)."""
        return {"tier_blocks": self.tier.capacity, "hit_tokens": self.hit_tokens,
                "loaded_blocks": self.loaded_blocks, "load_s": self.load_s,
                "stored_blocks": self.tier.n_stored, "dropped_blocks": self.tier.n_dropped}
