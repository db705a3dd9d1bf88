"""Array helpers shared by every layer (layer 0: numpy only).

:func:`readonly` is the one way lpserve hands arrays to code that must not change them:
trace columns, and every field of the views a policy decides on. :func:`group_rows`
numbers the distinct key tuples of a set of rows.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["group_rows", "readonly"]


def readonly(a: Any, dtype: Any = None, *, copy: bool = False) -> np.ndarray:
    """``a`` as a contiguous read-only array of ``dtype`` (``None``: keep its dtype).

    No data is copied when ``a`` already is a contiguous array of that dtype and
    ``copy`` is False: the result is then a read-only *view* of ``a`` (``a`` itself stays
    writable). Pass ``copy=True`` when the caller keeps writing into ``a`` and the reader
    must see the values of now.
    """
    if not copy and type(a) is np.ndarray and a.flags.c_contiguous and \
            (dtype is None or a.dtype == dtype):
        arr = a.view()  # the common case, without numpy's conversion machinery
        arr.flags.writeable = False
        return arr
    arr = np.array(a, dtype=dtype, copy=True) if copy else \
        np.ascontiguousarray(a, dtype=dtype)
    if not copy and isinstance(a, np.ndarray) and arr is a:
        arr = arr.view()  # never freeze the caller's own array
    arr.setflags(write=False)
    return arr


def group_rows(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Groups of rows with equal key tuples ``(keys[0][j], keys[1][j], ...)``.

    ``keys``: equal-length 1-D integer arrays, ``keys[0]`` the most significant. Returns
    ``(first, gid)``: ``first`` (int64, ``(n_groups,)``) the smallest row index of each
    group, groups in lexicographic order of their keys; ``gid`` (int64, ``(n,)``) each
    row's group. The numbering is ``np.unique(np.stack(keys), axis=1, return_index=True,
    return_inverse=True)``'s, from one stable ``lexsort`` of the integer keys instead of a
    sort of packed rows (several times faster).
    """
    n = int(keys[0].size) if keys else 0
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort(keys[::-1])
    new = np.zeros(n, bool)
    new[0] = True
    for k in keys:
        ks = k[order]
        new[1:] |= ks[1:] != ks[:-1]
    gid = np.empty(n, np.int64)
    gid[order] = np.cumsum(new) - 1
    return order[new].astype(np.int64), gid
