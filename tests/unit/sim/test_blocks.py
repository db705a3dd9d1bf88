"""Block manager: unit tests and a hypothesis state machine."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.oracles.blocks import BlockError, BlockManager


def test_prefix_reuse_needs_every_earlier_block():
    bm = BlockManager(10, 16, prefix_caching=True)
    a = [bm.take_hashed(k, d, 0.0) for d, k in enumerate(["a", "b", "c"])]
    bm.release(a, 0, 1.0)
    assert bm.evictable == 3 and bm.plain_free == 7
    assert bm.match(["a", "b", "c", "d"]) == a
    bm.evict([a[0]])
    assert bm.match(["a", "b", "c"]) == []  # the chain is broken at its head
    bm.check()


def test_double_free_and_overallocation_raise():
    bm = BlockManager(4, 16, prefix_caching=False)
    s = bm.take_hashed("x", 0, 0.0)
    assert s == -1 and bm.anon_used == 1  # caching off: anonymous
    bm.take_anon(3)
    with pytest.raises(BlockError):
        bm.take_anon(1)
    bm.release([], 4, 0.0)
    with pytest.raises(BlockError):
        bm.release([], 1, 0.0)
    bm2 = BlockManager(4, 16, prefix_caching=True)
    t = bm2.take_hashed("k", 0, 0.0)
    bm2.release([t], 0, 0.0)
    with pytest.raises(BlockError):
        bm2.release([t], 0, 0.0)


class BlockMachine(RuleBasedStateMachine):
    """Random request lifecycles against a model of who holds what."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(24, 4, prefix_caching=True)
        self.holders: dict[int, tuple[list[int], int]] = {}
        self.next_id = 0
        self.t = 0.0

    @rule(keys=st.lists(st.sampled_from("abcdef"), max_size=5, unique=True),
          extra=st.integers(0, 4))
    def admit(self, keys, extra):
        self.t += 1.0
        hits = self.bm.match(keys)
        n_hit_free = sum(1 for s in hits if self.bm.ref[s] == 0)
        new = len(keys) - len(hits) + extra
        if self.bm.available - n_hit_free < new:
            return
        self.bm.acquire(hits, self.t)
        slots = list(hits)
        anon = 0
        need = new - self.bm.plain_free
        if need > 0:
            ev = self.bm.evictable_slots()[:need]
            self.bm.evict(ev.tolist())
        for d in range(len(hits), len(keys)):
            s = self.bm.take_hashed(keys[d], d, self.t)
            if s >= 0:
                slots.append(s)
            else:
                anon += 1
        self.bm.take_anon(extra)
        self.holders[self.next_id] = (slots, anon + extra)
        self.next_id += 1

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def finish(self, data):
        self.t += 1.0
        rid = data.draw(st.sampled_from(sorted(self.holders)))
        slots, anon = self.holders.pop(rid)
        self.bm.release(slots, anon, self.t)

    @precondition(lambda self: self.bm.evictable > 0)
    @rule(k=st.integers(1, 5))
    def evict(self, k):
        ev = self.bm.evictable_slots()[:k]
        self.bm.evict(ev.tolist())

    @invariant()
    def pools_are_consistent(self):
        self.bm.check()
        held = sum(a for _, a in self.holders.values())
        assert held == self.bm.anon_used
        refs = {}
        for slots, _ in self.holders.values():
            for s in slots:
                refs[s] = refs.get(s, 0) + 1
        assert all(self.bm.ref[s] == c for s, c in refs.items())
        assert self.bm.used <= self.bm.total
        assert self.bm.plain_free + self.bm.evictable + self.bm.used == self.bm.total


TestBlockMachine = BlockMachine.TestCase
TestBlockMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
