"""The prefix cache's eviction step: the evictor's view of a replica's cached blocks, the
policy's choice, and its validation (``models/simulator.md``; the evictors are in
:mod:`lpserve.policies.evictors_kv`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from lpserve.policy import EvictorView, PolicyError
from lpserve.views import readonly as _ro

if TYPE_CHECKING:  # pragma: no cover
    from lpserve.sim.replica import Replica

PREFIX_ESTIMATE_MAX = 256  # waiting requests whose cached prefix is estimated or matched
SESSION_MIN_HIT_TOKENS = 1024  # a request hitting this many cached tokens is a returning
# session (two 512-token blocks, the rule of the replay's session evictor)


def evict(rep: "Replica", need: int) -> None:
    """Reclaim ``need`` evictable blocks of ``rep`` chosen by the policy's evictor."""
    bm = rep.bm
    slots = bm.evictable_slots()
    pslot = bm.parent_slot[slots]
    parent = np.searchsorted(slots, pslot)  # slots ascending: position of the parent
    ok = (pslot >= 0) & (parent < slots.size)
    ok[ok] = slots[parent[ok]] == pslot[ok]
    parent = np.where(ok, parent, -1).astype(np.int64)
    view = EvictorView(now_s=rep.now, replica=rep.index, block=_ro(slots),
                       last_access_s=_ro(bm.last_access_s[slots]),
                       hits=_ro(bm.hits[slots]), depth=_ro(bm.depth[slots]),
                       created_s=_ro(bm.created_s[slots]),
                       children=_ro(bm.n_children[slots]), parent=_ro(parent),
                       turn_gap_s=_ro(bm.turn_gap_s[slots]),
                       queued=_ro(np.isin(slots, queued_slots(rep)))
                       if rep.sim.policy.evictor.reads_queue else None)
    pos = np.asarray(rep.sim.policy.evictor.evict(view, int(need)))
    name = rep.sim.role_name("evictor")
    if pos.shape != (need,) or pos.dtype.kind not in "iu":
        raise PolicyError(f"{name}: evict() returned shape {pos.shape} dtype {pos.dtype}, "
                          f"expected ({need},) integer positions")
    if pos.size and (pos.min() < 0 or pos.max() >= slots.size
                     or np.unique(pos).size != pos.size):
        raise PolicyError(f"{name}: evict() returned out-of-range or repeated positions "
                          f"(candidates: {slots.size})")
    bm.evict(slots[pos].tolist())


def queued_slots(rep: "Replica") -> np.ndarray:
    """Cached slots the first ``PREFIX_ESTIMATE_MAX`` waiting requests would hit."""
    S, out = rep.S, []
    for i in rep.waiting[:PREFIX_ESTIMATE_MAX]:
        if not S.swapped[i] and not S.kv_remote[i]:
            out.extend(rep.bm.match(S.block_keys(i, rep.bt)))
    return np.asarray(out, np.int64)
