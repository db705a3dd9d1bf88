"""Priority preemption (``EngineConfig.priority_preemption``): waiting requests that
outrank running ones take their place, and the bound it puts on a decode run so that the
fast path preempts exactly where the reference mode does (``models/simulator.md``)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from lpserve.sim.replica import Replica

_BIG = 1 << 62


def preempt_outranked(rep: "Replica") -> None:
    """``EngineConfig.priority_preemption``: for each waiting request in rank order that
    cannot be admitted (batch full or KV short), preempt the worst-ranked running
    requests while their rank is strictly worse than the waiting one's."""
    eng, bm = rep.eng, rep.bm
    ranks = rep._rank_all()
    order = sorted((ranks[i], pos, i) for pos, i in enumerate(rep.waiting)
                   if ranks[i] != math.inf)
    seats = eng.max_num_seqs - len(rep.running)
    mem = bm.available - rep.wm_blocks
    floor = math.inf  # best rank among requests preempted here
    for r, _, w in order:
        if r >= floor:
            break
        need = rep._admit_need(w)
        if need > bm.total - rep.wm_blocks:
            continue
        while seats < 1 or mem < need:
            v = rep._victim()
            if v < 0 or ranks.get(v, math.inf) <= r:
                return
            before = bm.available
            rep._preempt(v)
            floor = min(floor, ranks.get(v, math.inf))
            seats += 1
            mem += bm.available - before
        seats -= 1
        mem -= need


def free_cap(rep: "Replica") -> int:
    """Most blocks a decode run may take before :func:`preempt_outranked` could act: the
    waiting requests that outrank a running one take free KV in rank order, and a
    preemption fires once it no longer covers their needs, which the reference mode
    checks every iteration. Conservative (all their needs together), so a run only
    ever stops early, never late; the needs do not change within a run (the run takes
    only plain free blocks, so no cached prefix is evicted). Negative when the
    planner's blocks for the run's first iteration already crossed it: then only that
    iteration may run."""
    ranks = rep._rank_all()
    worst = max((ranks.get(i, math.inf) for i in rep.running), default=-math.inf)
    total = rep.bm.total - rep.wm_blocks
    needs = [n for n in (rep._admit_need(w) for w in rep.waiting
                         if ranks[w] != math.inf and ranks[w] < worst) if n <= total]
    if not needs:
        return _BIG
    return rep.bm.available - rep.wm_blocks - sum(needs)
