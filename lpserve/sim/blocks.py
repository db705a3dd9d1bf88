"""Paged KV blocks of one replica with hash-chained prefix caching.

Every physical block is in exactly one of four states:

* **plain free** — no content; taken first by any allocation;
* **anonymous used** — held by one request, content not reusable (generated tokens, the
  partial last prompt block, or any block when prefix caching is off);
* **hashed used** — a full prompt block with a content key, held by ``ref >= 1`` requests;
* **evictable** — a hashed block no request holds (``ref == 0``); still findable by its
  key, reclaimed by the :class:`~lpserve.policy.Evictor` when plain free blocks run out.

``plain_free + evictable + anon_used + hashed_used == total`` always holds (checked by
:meth:`check`). A cached block is reusable only if every earlier block of the prompt is
(lookups walk the chain from block 0 and stop at the first miss), as vLLM's automatic
prefix caching. Hashed blocks live in slots ``0..total-1`` with per-slot arrays.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


class BlockError(RuntimeError):
    """An impossible block operation (double free, over-allocation)."""


class BlockManager:
    """Block pool of one replica.

    Args:
        total_blocks: physical KV blocks.
        block_tokens: tokens per block.
        prefix_caching: keep released hashed blocks findable (else they become plain free).
    """

    def __init__(self, total_blocks: int, block_tokens: int, prefix_caching: bool) -> None:
        if total_blocks < 1:
            raise BlockError(f"total_blocks must be >= 1, got {total_blocks}")
        self.total = int(total_blocks)
        self.block_tokens = int(block_tokens)
        self.prefix_caching = bool(prefix_caching)
        self.plain_free = self.total
        self.anon_used = 0
        self.hashed_used = 0
        self.evictable = 0
        self.key_to_slot: dict[Hashable, int] = {}
        self.slot_key: list[Hashable | None] = [None] * self.total
        self.ref = np.zeros(self.total, np.int64)
        self.last_access_s = np.zeros(self.total)
        self.created_s = np.zeros(self.total)
        self.hits = np.zeros(self.total, np.int64)
        self.depth = np.zeros(self.total, np.int64)
        self.has_key = np.zeros(self.total, bool)
        self._free_slots = list(range(self.total - 1, -1, -1))

    # ------------------------------------------------------------------ queries
    @property
    def used(self) -> int:
        return self.anon_used + self.hashed_used

    @property
    def available(self) -> int:
        """Blocks an allocation can get (plain free + evictable)."""
        return self.plain_free + self.evictable

    def match(self, keys: Sequence[Hashable]) -> list[int]:
        """Slots of the longest cached leading run of ``keys`` (every earlier block too)."""
        out = []
        k2s = self.key_to_slot
        for k in keys:
            s = k2s.get(k)
            if s is None:
                break
            out.append(s)
        return out

    def evictable_slots(self) -> np.ndarray:
        """Slot ids of evictable blocks (int64, ascending)."""
        return np.flatnonzero(self.has_key & (self.ref == 0)).astype(np.int64)

    # ------------------------------------------------------------------ operations
    def acquire(self, slots: Sequence[int], now_s: float) -> None:
        """Take a reference on cached blocks found by :meth:`match` (a prefix hit)."""
        for s in slots:
            if not self.has_key[s]:
                raise BlockError(f"acquire of slot {s} that holds no cached block")
            if self.ref[s] == 0:
                self.evictable -= 1
                self.hashed_used += 1
            self.ref[s] += 1
            self.hits[s] += 1
            self.last_access_s[s] = now_s

    def take_anon(self, n: int) -> None:
        """Take ``n`` plain free blocks as anonymous used blocks."""
        if n > self.plain_free:
            raise BlockError(f"take_anon({n}) with only {self.plain_free} plain free blocks")
        self.plain_free -= n
        self.anon_used += n

    def take_hashed(self, key: Hashable, depth: int, now_s: float) -> int:
        """Take one plain free block for a full prompt block with content ``key``.

        Returns the slot, or -1 when the block stays anonymous (caching off, or the key is
        already cached by a request that computed it concurrently).
        """
        if not self.prefix_caching or key in self.key_to_slot:
            self.take_anon(1)
            return -1
        if self.plain_free < 1:
            raise BlockError("take_hashed with no plain free block")
        self.plain_free -= 1
        self.hashed_used += 1
        s = self._free_slots.pop()
        self.key_to_slot[key] = s
        self.slot_key[s] = key
        self.has_key[s] = True
        self.ref[s] = 1
        self.hits[s] = 0
        self.depth[s] = depth
        self.created_s[s] = now_s
        self.last_access_s[s] = now_s
        return s

    def release(self, slots: Sequence[int], n_anon: int, now_s: float) -> None:
        """Drop one request's references: its hashed ``slots`` and ``n_anon`` blocks."""
        if n_anon > self.anon_used:
            raise BlockError(f"release of {n_anon} anonymous blocks, only {self.anon_used} used")
        self.anon_used -= n_anon
        self.plain_free += n_anon
        for s in slots:
            if self.ref[s] <= 0:
                raise BlockError(f"double free of slot {s}")
            self.ref[s] -= 1
            if self.ref[s] == 0:
                self.hashed_used -= 1
                self.last_access_s[s] = now_s
                if self.prefix_caching:
                    self.evictable += 1
                else:
                    self._drop(s)
                    self.plain_free += 1

    def evict(self, slots: Sequence[int]) -> None:
        """Reclaim evictable blocks: they lose their key and become plain free."""
        for s in slots:
            if not self.has_key[s] or self.ref[s] != 0:
                raise BlockError(f"evict of slot {s} that is not evictable")
            self._drop(s)
            self.evictable -= 1
            self.plain_free += 1

    def _drop(self, s: int) -> None:
        del self.key_to_slot[self.slot_key[s]]
        self.slot_key[s] = None
        self.has_key[s] = False
        self._free_slots.append(s)

    def check(self) -> None:
        """Raise :class:`BlockError` unless every pool count is consistent."""
        tot = self.plain_free + self.evictable + self.anon_used + self.hashed_used
        if tot != self.total:
            raise BlockError(f"free + used != total: {self.plain_free} + {self.evictable} + "
                             f"{self.anon_used} + {self.hashed_used} != {self.total}")
        if min(self.plain_free, self.evictable, self.anon_used, self.hashed_used) < 0:
            raise BlockError("negative block count")
        keyed = int(self.has_key.sum())
        if keyed != self.evictable + self.hashed_used or keyed != len(self.key_to_slot):
            raise BlockError(f"{keyed} keyed slots but {self.evictable} evictable + "
                             f"{self.hashed_used} hashed used")
        if int(np.sum(self.has_key & (self.ref == 0))) != self.evictable:
            raise BlockError("evictable count does not match ref == 0 slots")
