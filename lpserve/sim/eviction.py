"""The prefix cache's eviction step: the evictor's view of a replica's cached blocks and
its checked choice (``models/simulator.md``; the evictors are in
:mod:`lpserve.policies.evictors_kv`), and the block arithmetic of a replica's requests
(prompt allocation with prefix keys, blocks a release frees)."""
from __future__ import annotations

from operator import itemgetter
from typing import Any, Sequence

import numpy as np

from lpserve.arrays import readonly
from lpserve.policy import EvictorView
from lpserve.policy.checks import check_evictions
from lpserve.sim.blocks import BlockManager
from lpserve.sim.state import State

__all__ = ["PREFIX_ESTIMATE_MAX", "SESSION_MIN_HIT_TOKENS", "alloc_prompt_blocks",
           "ask_evictor", "choose_evictions", "freed_blocks", "queued_slots"]

PREFIX_ESTIMATE_MAX = 256  # waiting requests whose cached prefix is estimated or matched
SESSION_MIN_HIT_TOKENS = 1024  # a request hitting this many cached tokens is a returning
# session (two 512-token blocks, the rule of the replay's session evictor)


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


def ask_evictor(evictor: Any, view: EvictorView, need: int, who: str) -> np.ndarray:
    """Positions into ``view.block`` of the ``need`` blocks ``evictor`` gives up, checked
    (distinct, in range, exactly ``need``: a :class:`~lpserve.policy.PolicyError` naming
    ``who`` otherwise); int64 ``(need,)``."""
    return check_evictions(evictor.evict(view, int(need)), int(need), int(view.block.size),
                           who)


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


def queued_slots(bm: BlockManager, state: State, waiting: Sequence[int],
                 block_tokens: int) -> np.ndarray:
    """Cached slots the first ``PREFIX_ESTIMATE_MAX`` waiting requests would hit."""
    out: list[int] = []
    for i in waiting[:PREFIX_ESTIMATE_MAX]:
        if not state.swapped[i] and not state.kv_remote[i]:
            out.extend(bm.match(state.block_keys(i, block_tokens)))
    return np.asarray(out, np.int64)


def alloc_prompt_blocks(rep: Any, i: int, target_blocks: int) -> None:
    """Grow request ``i`` on replica ``rep`` to ``target_blocks`` blocks (full prompt blocks
    get keys; ``rep.make_room`` evicts cached blocks when needed)."""
    S = rep.S
    held = int(S.anon[i] + S.nslots[i])
    extra = target_blocks - held
    if extra <= 0:
        return
    if not rep.make_room(extra):
        raise RuntimeError("internal: allocation without room")
    n_keyed = 0
    if rep.eng.prefix_caching and not S.kv_remote[i] and held == S.nslots[i]:
        n_keyed = max(0, min(target_blocks, int(S.prompt[i]) // rep.bt) - held)
    if n_keyed:
        keys = S.block_keys(i, rep.bt)
        gap = rep.turn_gap.get(i, 0.0)
        for j in range(held, held + n_keyed):
            s = rep.bm.take_hashed(keys[j], j, rep.now, keys[j - 1] if j else None, gap)
            if s < 0:  # the key is cached already: this block and the rest anonymous
                n_keyed = j - held + 1
                S.anon[i] += 1
                break
            S.slots[i].append(s)
            S.nslots[i] += 1
    rest = extra - n_keyed
    if rest > 0:
        rep.bm.take_anon(rest)
        S.anon[i] += rest


def freed_blocks(bm: BlockManager, S: State, v: int, taken: dict[int, int]) -> int:
    """Blocks of pool ``bm`` that releasing request ``v`` frees after the references in
    ``taken`` dropped (which it extends): its anonymous blocks and its slots no one else
    holds."""
    n = int(S.anon[v])
    for s in S.slots[v]:
        t = taken.get(s, 0)
        if bm.ref[s] - t == 1:
            n += 1
        taken[s] = t + 1
    return n
