"""Sub-commands of the ``lpserve`` CLI, one module each (see :mod:`lpserve.cli`)."""
