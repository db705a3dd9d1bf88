"""Name -> policy factory (layer 5). Registering a policy puts it under the conformance
suite (``tests/conformance``)."""
from __future__ import annotations

from typing import Any, Callable

from lpserve.policies import baselines as B
from lpserve.policy import Policy

POLICIES: dict[str, Callable[..., Policy]] = {
    "vllm": B.vllm,
    "vllm-chunked": B.vllm_chunked,
    "sarathi": B.sarathi,
    "orca": B.orca,
    "static": B.static,
    "vllm+random": B.routed("random"),
    "vllm+least-outstanding": B.routed("least-outstanding"),
    "vllm+least-kv": B.routed("least-kv"),
    "vllm+power-of-two": B.routed("power-of-two"),
    "vllm+prefix-affinity": B.routed("prefix-affinity"),
}


def policy_names() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(POLICIES)


def make_policy(name: str, **params: Any) -> Policy:
    """A fresh policy by registered name; ``params`` go to its factory."""
    if not isinstance(name, str) or name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; registered: {', '.join(policy_names())}")
    return POLICIES[name](**params)
