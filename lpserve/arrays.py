"""Array helpers shared by every layer (layer 0: numpy only).

:func:`readonly` is the one way lpserve hands arrays to code that must not change them:
trace columns, and every field of the views a policy decides on.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["readonly"]


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
