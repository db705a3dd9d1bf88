"""A binary min-heap over parallel arrays, in numba: entries ``(p, s, g)`` ordered
lexicographically (``p``, ``s`` float64, ``g`` int64), each with an int64 payload ``v``
(a validity stamp, or unused); with distinct keys the pops follow the key order exactly,
as ``heapq`` on the same tuples. Shared by the session evictors' replay (:mod:`lpserve.policies._group_kernels`)
and the compiled VTC twin (:mod:`lpserve.sim._vtc_kernels`); their plain-Python twins use
``heapq`` on the same tuples."""
from __future__ import annotations

from numba import njit

__all__ = ["heap_less", "heap_pop", "heap_push", "heap_swap"]


@njit(cache=True)
def heap_less(hp, hs, hg, i, j):  # pragma: no cover - numba
    """Entry ``i`` before entry ``j``: by primary, secondary, then group (request order)."""
    if hp[i] != hp[j]:
        return hp[i] < hp[j]
    if hs[i] != hs[j]:
        return hs[i] < hs[j]
    return hg[i] < hg[j]


@njit(cache=True)
def heap_swap(hp, hs, hg, hv, i, j):  # pragma: no cover - numba
    """Swap entries ``i`` and ``j``."""
    hp[i], hp[j] = hp[j], hp[i]
    hs[i], hs[j] = hs[j], hs[i]
    hg[i], hg[j] = hg[j], hg[i]
    hv[i], hv[j] = hv[j], hv[i]


@njit(cache=True)
def heap_push(hp, hs, hg, hv, m, p, s, g, v):  # pragma: no cover - numba
    """Push key ``(p, s, g)`` with validity stamp ``v`` onto the heap of ``m`` entries;
    returns the new size."""
    i = m
    hp[i], hs[i], hg[i], hv[i] = p, s, g, v
    while i > 0:
        par = (i - 1) // 2
        if not heap_less(hp, hs, hg, i, par):
            break
        heap_swap(hp, hs, hg, hv, i, par)
        i = par
    return m + 1


@njit(cache=True)
def heap_pop(hp, hs, hg, hv, m):  # pragma: no cover - numba
    """Remove the smallest entry (read it at index 0 first); returns the new size."""
    m -= 1
    hp[0], hs[0], hg[0], hv[0] = hp[m], hs[m], hg[m], hv[m]
    i = 0
    while True:
        lft = 2 * i + 1
        best = i
        if lft < m and heap_less(hp, hs, hg, lft, best):
            best = lft
        if lft + 1 < m and heap_less(hp, hs, hg, lft + 1, best):
            best = lft + 1
        if best == i:
            break
        heap_swap(hp, hs, hg, hv, i, best)
        i = best
    return m
