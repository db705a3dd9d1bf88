"""Ragged prefix-block ids in CSR layout: array helpers of :class:`lpserve.trace.Trace`
(layer 0: numpy only).

Request ``i`` owns ``flat[offsets[i]:offsets[i+1]]``; ``offsets`` has one entry more than
there are requests.
"""
from __future__ import annotations

import numpy as np

__all__ = ["take_blocks", "infinite_prefix_hits"]


def take_blocks(flat: np.ndarray, offs: np.ndarray,
                idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The block lists of requests ``idx`` (int64, any order) as new ``(flat, offsets)``."""
    lengths = (offs[1:] - offs[:-1])[idx]
    new_offs = np.zeros(idx.size + 1, np.int64)
    np.cumsum(lengths, out=new_offs[1:])
    if idx.size == 0:
        return np.zeros(0, np.int64), new_offs
    starts = offs[idx]
    # positions: for each selected request, starts[i] + arange(lengths[i])
    rep = np.repeat(starts - new_offs[:-1], lengths)
    pos = np.arange(int(new_offs[-1]), dtype=np.int64) + rep
    return flat[pos], new_offs


def infinite_prefix_hits(flat: np.ndarray, offs: np.ndarray) -> int:
    """Blocks that hit an infinite cache starting empty: each request hits the longest
    leading run of its ids that an earlier request sent as a prefix (hash chains: block
    ``k`` is reusable only if blocks ``0..k-1`` are too)."""
    chain: dict[tuple[int, int], int] = {}  # (key of the prefix before, block id) -> key
    hits = 0
    for i in range(offs.shape[0] - 1):
        key = -1
        for b in flat[offs[i]:offs[i + 1]].tolist():
            nxt = chain.get((key, b))
            if nxt is None:  # a new chain node: this and every later block of i miss
                nxt = len(chain)
                chain[(key, b)] = nxt
            else:
                hits += 1
            key = nxt
    return hits
