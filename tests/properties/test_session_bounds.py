"""On random session traces: the segment LP equals the block LP
(proofs/kv-prefix-lp-segments.md), and every session-aware evictor stays below the
offline optimum: online <= OPT <= LP (proofs/kv-prefix-lp-bound.md)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.evaluate.cache import replay_accesses
from lpserve.opt import cache_flow as cf
from lpserve.opt import cache_segments as cs
from lpserve.policies.evictors_sessions import SESSION_SPECS
from lpserve.trace import Trace


@st.composite
def session_traces(draw, max_sessions: int = 3, max_turns: int = 5) -> Trace:
    """Sessions whose turns re-send a prefix of the previous turn plus fresh blocks (an
    agentic loop; sometimes the history is cut), with random gaps and wait kinds."""
    rows, sid, times, wk = [], [], [], []
    nxt = 0
    for s in range(draw(st.integers(1, max_sessions))):
        t = draw(st.sampled_from([0.0, 2.0, 7.0]))
        prev: list[int] = []
        for _ in range(draw(st.integers(1, max_turns))):
            keep = len(prev) if draw(st.booleans()) else draw(st.integers(0, len(prev)))
            row = prev[:keep] + list(range(nxt, nxt + draw(st.integers(1, 3))))
            nxt += len(row) - keep
            rows.append(row)
            sid.append(s)
            times.append(t)
            wk.append(draw(st.sampled_from([-1, 0, 1])))
            t += draw(st.sampled_from([1.0, 4.0, 30.0]))
            prev = row
    order = np.argsort(times, kind="stable")
    return Trace.from_arrays(arrival_s=np.asarray(times)[order],
                             prompt_tokens=[16 * len(rows[i]) for i in order],
                             output_tokens=[1] * len(rows), block_ids=[rows[i] for i in order],
                             block_tokens=16, session_id=np.asarray(sid)[order],
                             wait_kind=np.asarray(wk)[order])


@settings(max_examples=40, deadline=None)
@given(session_traces(), st.integers(1, 8))
def test_segment_lp_equals_block_lp_and_bounds_the_session_evictors(tr, C):
    acc = cf.block_accesses(tr)
    block = cf.solve(cf.build(acc, C))
    seg_ub, _ = cs.lp_hit_rate(acc, C)
    assert abs(seg_ub - block.info["value_lp"] / acc.n_accesses) <= 1e-7
    opt = cf.solve(cf.build(acc, C), integer=True).info["value_rounded"] / acc.n_accesses
    for name, spec in SESSION_SPECS.items():
        for sp in (spec, spec.with_(min_n=1, refit=1, duel_alpha=0.0)):
            assert replay_accesses(acc, C, name, **{k: getattr(sp, k) for k in
                                   ("min_n", "refit", "duel_alpha")}).hit_rate <= opt + 1e-9
    seg_hits = replay_accesses(acc, C, "lp").hits
    assert seg_hits == int(round(block.info["value_lp"]))
