"""Oracle of the compiled block pool (``lpserve/sim/_pool.py``): paged KV blocks of one
replica with hash-chained prefix caching, in plain Python, and the evictor's view of them.

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

from operator import itemgetter
from typing import Any, Hashable, Sequence

import numpy as np

from lpserve.arrays import readonly
from lpserve.policy import EvictorView
from lpserve.sim.hooks import ask_evictor


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
        # radix structure and session signal for the evictors (EvictorView.children/
        # parent/turn_gap_s): each cached block's parent key and slot, the cached child keys
        # of every key (kept by key, so they survive the parent's own eviction) and their
        # count per cached slot, and the inter-turn gap of the returning request that last
        # touched the block (0 if that request was not a returning session)
        self.parent_key: list[Hashable | None] = [None] * self.total
        self.child_keys: dict[Hashable, set] = {}
        self.parent_slot = np.full(self.total, -1, np.int64)
        self.n_children = np.zeros(self.total, np.int64)
        self.turn_gap_s = np.zeros(self.total)
        # conversation and wait kind of the request that last released each block
        # (EvictorView.thread / wait_kind; -1 unknown)
        self.thread = np.full(self.total, -1, np.int64)
        self.wait_kind = np.full(self.total, -1, np.int64)
        self._free_slots = list(range(self.total - 1, -1, -1))

    # ------------------------------------------------------------------ queries
    @property
    def used(self) -> int:
        """Blocks in use: anonymous (being filled) plus hashed ones held by requests."""
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
    def acquire(self, slots: Sequence[int], now_s: float, turn_gap_s: float = 0.0) -> None:
        """Take a reference on cached blocks found by :meth:`match` (a prefix hit) for a
        request whose inter-turn gap is ``turn_gap_s`` (0 if it is not a returning session)."""
        for s in slots:
            if not self.has_key[s]:
                raise BlockError(f"acquire of slot {s} that holds no cached block")
            if self.ref[s] == 0:
                self.evictable -= 1
                self.hashed_used += 1
            self.ref[s] += 1
            self.hits[s] += 1
            self.last_access_s[s] = now_s
            self.turn_gap_s[s] = turn_gap_s

    def take_anon(self, n: int) -> None:
        """Take ``n`` plain free blocks as anonymous used blocks."""
        if n > self.plain_free:
            raise BlockError(f"take_anon({n}) with only {self.plain_free} plain free blocks")
        self.plain_free -= n
        self.anon_used += n

    def take_hashed(self, key: Hashable, depth: int, now_s: float,
                    parent_key: Hashable | None = None, turn_gap_s: float = 0.0) -> int:
        """Take one plain free block for a full prompt block with content ``key`` whose
        prefix chain ends in ``parent_key`` (None for a prompt's first block).

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
        self.turn_gap_s[s] = turn_gap_s
        self.parent_key[s] = parent_key
        k2s = self.key_to_slot
        if parent_key is not None:
            self.child_keys.setdefault(parent_key, set()).add(key)
            ps = k2s.get(parent_key, -1)
            self.parent_slot[s] = ps
            if ps >= 0:
                self.n_children[ps] += 1
        kids = self.child_keys.get(key, ())
        self.n_children[s] = len(kids)
        for ck in kids:  # cached children that outlived this block's previous copy
            self.parent_slot[k2s[ck]] = s
        return s

    def release(self, slots: Sequence[int], n_anon: int, now_s: float, thread: int = -1,
                wait_kind: int = -1) -> None:
        """Drop one request's references: its hashed ``slots`` and ``n_anon`` blocks; the
        request's ``thread`` and ``wait_kind`` label the blocks it leaves evictable."""
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
                self.thread[s], self.wait_kind[s] = thread, wait_kind
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
        key, p = self.slot_key[s], self.parent_key[s]
        if p is not None:
            kids = self.child_keys[p]
            kids.discard(key)
            if not kids:
                del self.child_keys[p]
            if self.parent_slot[s] >= 0:
                self.n_children[self.parent_slot[s]] -= 1
            self.parent_key[s] = None
        for ck in self.child_keys.get(key, ()):
            self.parent_slot[self.key_to_slot[ck]] = -1
        self.parent_slot[s] = -1
        self.n_children[s] = 0
        del self.key_to_slot[key]
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
        keyed_slots = np.flatnonzero(self.has_key)
        if keyed_slots.size:
            ps = self.parent_slot[keyed_slots]
            count = np.bincount(ps[ps >= 0], minlength=self.total)
            if not np.array_equal(count[keyed_slots], self.n_children[keyed_slots]):
                raise BlockError("cached children per block do not match the parent links")


def choose_evictions(bm: BlockManager, evictor: Any, need: int, *, now_s: float,
                     replica: int, queued: np.ndarray | None, who: str) -> list[int]:
    """Slots of the ``need`` evictable blocks of ``bm`` that ``evictor`` gives up.

    ``queued`` (slots the waiting requests would hit) fills ``EvictorView.queued`` for an
    evictor that ``reads_queue``; ``who`` names the policy in errors.
    """
    slots = bm.evictable_slots()
    view = EvictorView(now_s=now_s, replica=replica, block=readonly(slots),
                       last_access_s=readonly(bm.last_access_s[slots]),
                       hits=readonly(bm.hits[slots]), depth=readonly(bm.depth[slots]),
                       created_s=readonly(bm.created_s[slots]),
                       children=readonly(bm.n_children[slots]),
                       parent=(readonly(_parent_positions(bm, slots))
                               if getattr(evictor, "reads_tree", True) else None),
                       turn_gap_s=readonly(bm.turn_gap_s[slots]),
                       queued=None if queued is None else readonly(np.isin(slots, queued)),
                       thread=readonly(bm.thread[slots]),
                       wait_kind=readonly(bm.wait_kind[slots]), block_tokens=bm.block_tokens,
                       key=_slot_keys(bm, slots) if getattr(evictor, "reads_keys", False)
                       else None)
    return slots[ask_evictor(evictor, view, need, who)].tolist()


def _parent_positions(bm: BlockManager, slots: np.ndarray) -> np.ndarray:
    """Per evictable slot (``slots`` ascending), the position in ``slots`` of its cached
    parent block, -1 where the parent is not evictable or not cached (int64)."""
    pslot = bm.parent_slot[slots]
    parent = np.searchsorted(slots, pslot)
    ok = (pslot >= 0) & (parent < slots.size)
    ok[ok] = slots[parent[ok]] == pslot[ok]
    return np.where(ok, parent, -1).astype(np.int64)


def _slot_keys(bm: BlockManager, slots: np.ndarray) -> tuple:
    """The prefix keys of cached ``slots`` (a tuple, in slot order)."""
    if slots.size == 0:
        return ()
    keys = itemgetter(*slots.tolist())(bm.slot_key)
    return keys if slots.size > 1 else (keys,)
