"""``lpserve compile``'s guard against stale numba caches: numba checks a cached kernel
against its own file only, so any changed kernel source rebuilds the whole cache."""
from __future__ import annotations

from lpserve.commands.compile_cmd import invalidate_stale_kernels


def test_a_changed_kernel_source_deletes_every_cache_file(tmp_path):
    (tmp_path / "a.py").write_text("from numba import njit\n@njit\ndef f(x):\n    return x\n")
    (tmp_path / "b.py").write_text("def g():\n    return 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    assert invalidate_stale_kernels(tmp_path)  # first call: no stamp yet
    (cache / "b.g-1.py311.nbi").write_bytes(b"x")
    (cache / "b.g-1.py311.1.nbc").write_bytes(b"x")
    assert not invalidate_stale_kernels(tmp_path)  # nothing changed: the cache stays
    assert (cache / "b.g-1.py311.nbi").exists()
    (tmp_path / "b.py").write_text("def g():\n    return 2\n")  # not a kernel file
    assert not invalidate_stale_kernels(tmp_path)
    (tmp_path / "a.py").write_text("from numba import njit\n@njit\ndef f(x):\n    return -x\n")
    assert invalidate_stale_kernels(tmp_path)  # a kernel changed: every cache file goes
    assert not list(cache.glob("*.nb?"))
