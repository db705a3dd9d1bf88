"""lpserve: principled LLM-serving policies.

Mathematical models of serving decisions (routing, batch scheduling, KV-cache eviction,
prefill/decode control), a calibrated GPU cost model, a fast event-driven simulator, and
policies exported to real engines.

``import lpserve`` stays light: the public names below are resolved lazily, so numba,
scipy, cvxpy and friends are imported only by the code that needs them.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # layer 0
    "Trace": "lpserve.trace",
    "LoadReport": "lpserve.trace",
    "TraceError": "lpserve.trace",
    "load_trace": "lpserve.trace.loaders",
    "bundled_trace": "lpserve.trace.loaders",
    "generate": "lpserve.trace.generate",
    "Cluster": "lpserve.cluster",
    "ReplicaGroup": "lpserve.cluster",
    # layer 1
    "cost_model": "lpserve.cost",
    "CostModel": "lpserve.cost",
    "TableCost": "lpserve.cost",
    "UnitRoundCost": "lpserve.cost",
    # layer 2
    "Instance": "lpserve.instance",
    "SLO": "lpserve.instance",
    "Tier": "lpserve.instance",
    # layer 3
    "Policy": "lpserve.policy",
    "Meta": "lpserve.policy",
    "Claim": "lpserve.policy",
    # layer 4
    "cache_replay": "lpserve.evaluate.cache",
    "solve": "lpserve.opt",
    "Solution": "lpserve.opt.solution",
    "Status": "lpserve.opt.solution",
    # layer 5
    "make_policy": "lpserve.registry",
    "compare": "lpserve.evaluate",
    "interval": "lpserve.evaluate.interval",
    "robustness": "lpserve.evaluate",
    "capacity": "lpserve.evaluate",
    "simulate": "lpserve.registry",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lpserve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
