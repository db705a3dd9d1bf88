"""Load a seed-paper benchmark of ``benchmarks/seeds/`` as a module (the slow tests call
its functions at reduced sizes)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SEEDS = Path(__file__).resolve().parents[2] / "benchmarks" / "seeds"


def load(name: str):
    """The module ``benchmarks/seeds/<name>.py``."""
    if str(SEEDS) not in sys.path:
        sys.path.insert(0, str(SEEDS))
    spec = importlib.util.spec_from_file_location(f"seed_{name}", SEEDS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
