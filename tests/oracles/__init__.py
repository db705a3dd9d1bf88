"""Plain-Python models of the compiled replica's data structures, the oracles their
kernel twins are tested against (``tests/unit/sim/test_pool.py``,
``test_link_kernels.py``)."""
