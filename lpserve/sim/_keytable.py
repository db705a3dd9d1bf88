"""The open-addressing table of a replica's KV pool (numba): content key -> the slot that
caches it and the number of cached blocks whose prefix chain ends in it (``_pool``'s ``hk``,
``hs``, ``hc``, ``hu`` arrays; capacity a power of two, ``mask = capacity - 1``). Linear
probing from the key's splitmix64 hash; deletion by backward shift, so probes stay exact
and every operation is O(1) expected, never a scan of the cache.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def mix64(x):
    """splitmix64's finalizer on the bits of int64 ``x`` (int64 in, int64 out)."""
    z = np.uint64(x) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z)


@njit(cache=True)
def probe(hu, hk, key):
    """Table index holding ``key``, else the empty one where it would go."""
    mask = hk.shape[0] - 1
    j = mix64(key) & mask
    while hu[j] and hk[j] != key:
        j = (j + 1) & mask
    return j


@njit(cache=True)
def find(hu, hk, key):
    """Table index of ``key`` (-1 if absent)."""
    j = probe(hu, hk, key)
    return j if hu[j] else -1


@njit(cache=True)
def get_or_add(hu, hk, hs, hc, key):
    """Table entry of ``key``, inserted (no slot, no cached child) when absent."""
    j = probe(hu, hk, key)
    if not hu[j]:
        hu[j] = 1
        hk[j] = key
        hs[j] = -1
        hc[j] = 0
    return j


@njit(cache=True)
def drop_if_empty(hu, hk, hs, hc, j):
    """Delete entry ``j`` when it holds no cached block and no cached child (backward
    shift, so probing stays exact)."""
    if hs[j] >= 0 or hc[j] > 0:
        return
    mask = hk.shape[0] - 1
    hu[j] = 0
    i = j
    k = (j + 1) & mask
    while hu[k]:
        home = mix64(hk[k]) & mask
        # move k to the hole at i when its home is not in (i, k] (cyclically)
        if (k > i and (home <= i or home > k)) or (k < i and (home <= i and home > k)):
            hk[i] = hk[k]
            hs[i] = hs[k]
            hc[i] = hc[k]
            hu[i] = 1
            hu[k] = 0
            i = k
        k = (k + 1) & mask
