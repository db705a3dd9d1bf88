"""Bound chain on random small traces: online <= OPT <= LP <= infinite cache; rounded LP
feasible and <= OPT; Belady == brute force on unit instances (proofs/belady-unit-optimal.md,
proofs/kv-prefix-lp-bound.md)."""
from __future__ import annotations

import functools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lpserve.evaluate.cache import replay_accesses
from lpserve.opt import cache_flow as cf
from lpserve.policies.evictors_kv import SPECS
from lpserve.trace import Trace


@st.composite
def small_chain_traces(draw, max_requests: int = 7, max_blocks: int = 4) -> Trace:
    """Hash-chain traces: each request extends a prefix of an earlier one with fresh ids."""
    n = draw(st.integers(1, max_requests))
    rows: list[list[int]] = []
    nxt = 0
    for _ in range(n):
        nb = draw(st.integers(1, max_blocks))
        row: list[int] = []
        if rows and draw(st.booleans()):
            src = rows[draw(st.integers(0, len(rows) - 1))]
            row = src[:min(nb, draw(st.integers(0, len(src))))]
        while len(row) < nb:
            row.append(nxt)
            nxt += 1
        rows.append(row)
    gaps = draw(st.lists(st.sampled_from([0.0, 1.0, 5.0]), min_size=n, max_size=n))
    return Trace.from_arrays(arrival_s=np.cumsum(gaps), prompt_tokens=[16 * len(r) for r in rows],
                             output_tokens=[1] * n, block_ids=rows, block_tokens=16)


@settings(max_examples=40, deadline=None)
@given(small_chain_traces(), st.integers(1, 6))
def test_online_le_opt_le_lp_le_infinite(tr, C):
    acc = cf.block_accesses(tr)
    m = cf.build(acc, C)
    lp_sol = cf.solve(m)
    ilp = cf.solve(m, integer=True)
    A = acc.n_accesses
    opt = ilp.info["value_rounded"] / A
    lp_ub = lp_sol.info["value_lp"] / A
    inf = replay_accesses(acc, C, "infinite").hit_rate
    assert opt <= lp_ub + 1e-9 <= inf + 2e-9
    rounded = lp_sol.info["value_rounded"] / A
    assert rounded <= opt + 1e-9
    assert cf.certify(m, lp_sol)["capacity"] <= 1e-9
    for p in ["lru", *SPECS, "belady", "belady-prefix"]:
        assert replay_accesses(acc, C, p).hit_rate <= opt + 1e-9, p


def _brute_paging_hits(seq: tuple[int, ...], C: int) -> int:
    """Most hits of any demand-paging schedule with C slots kept between requests."""
    @functools.lru_cache(maxsize=None)
    def best(t: int, cache: frozenset) -> int:
        if t == len(seq):
            return 0
        h = int(seq[t] in cache)
        full = cache | {seq[t]}
        if len(full) <= C:
            return h + best(t + 1, frozenset(full))
        return h + max(best(t + 1, full - {v}) for v in full)
    return best(0, frozenset())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=10), st.integers(1, 3))
def test_belady_equals_brute_force_on_unit_instances(seq, C):
    # a single distinct block per request: prefix closure is void, classic paging
    tr = Trace.from_arrays(arrival_s=np.arange(len(seq), dtype=float),
                           prompt_tokens=[16] * len(seq), output_tokens=[1] * len(seq),
                           block_ids=[[x] for x in seq], block_tokens=16)
    acc = cf.block_accesses(tr)
    assert int(cf.belady(acc, C).sum()) == _brute_paging_hits(tuple(seq), C)
    m = cf.build(acc, C)
    assert round(cf.solve(m).info["value_lp"]) == _brute_paging_hits(tuple(seq), C)
