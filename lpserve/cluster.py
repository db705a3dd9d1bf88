"""Frozen cluster specifications (layer 0: numpy only).

A :class:`Cluster` names the hardware and model by catalog keys (see
:mod:`lpserve.cost` for the catalog) and describes how replicas are laid out:
colocated replicas, or prefill and decode pools joined by a KV-transfer link.
Names are validated against the catalog when a cost model is built from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

VALID_TP = (1, 2, 4, 8)


@dataclass(frozen=True)
class Cluster:
    """Replicas of one LLM on one GPU type.

    Attributes:
        gpu: catalog GPU key, e.g. ``"a100-80gb"``.
        llm: catalog LLM key, e.g. ``"llama-2-7b"``.
        tp: tensor-parallel degree of every replica (1, 2, 4 or 8).
        replicas: number of colocated replicas (prefill and decode on the same GPUs).
        prefill_replicas: replicas dedicated to prefill (disaggregated serving); 0 when
            colocated.
        decode_replicas: replicas dedicated to decode; 0 when colocated.
        link_gbps: bandwidth of the KV-transfer link between the prefill and decode pools,
            in gigabytes per second; ``None`` uses the GPU's catalog interconnect.
        gpu_memory_fraction: share of GPU memory the engine may use for weights,
            activations and KV cache (vLLM's ``gpu_memory_utilization``).
        block_tokens: tokens per paged-KV block.
        host_memory_gb: host (CPU) memory per replica for swapped-out KV, in GB.
    """

    gpu: str
    llm: str
    tp: int = 1
    replicas: int = 1
    prefill_replicas: int = 0
    decode_replicas: int = 0
    link_gbps: float | None = None
    gpu_memory_fraction: float = 0.9
    block_tokens: int = 16
    host_memory_gb: float = 64.0
    extra: tuple[tuple[str, Any], ...] = field(default=(), compare=True)

    def __post_init__(self) -> None:
        for name in ("gpu", "llm"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise ValueError(f"Cluster.{name} must be a non-empty catalog key, got {v!r}")
        if self.tp not in VALID_TP:
            raise ValueError(f"Cluster.tp must be one of {VALID_TP}, got {self.tp!r}")
        for name in ("replicas", "prefill_replicas", "decode_replicas", "block_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"Cluster.{name} must be a non-negative integer, got {v!r}")
        if self.block_tokens < 1:
            raise ValueError(f"Cluster.block_tokens must be >= 1, got {self.block_tokens}")
        if (self.prefill_replicas > 0) != (self.decode_replicas > 0):
            raise ValueError(
                "Cluster: disaggregated serving needs both prefill_replicas and "
                f"decode_replicas > 0, got {self.prefill_replicas} and {self.decode_replicas}"
            )
        if self.disaggregated and self.replicas not in (0, 1):
            raise ValueError(
                "Cluster: give either colocated replicas or prefill/decode pools, not both "
                f"(replicas={self.replicas})"
            )
        if not self.disaggregated and self.replicas < 1:
            raise ValueError(f"Cluster.replicas must be >= 1, got {self.replicas}")
        if not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(
                f"Cluster.gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}"
            )
        if self.link_gbps is not None and not self.link_gbps > 0:
            raise ValueError(f"Cluster.link_gbps must be > 0, got {self.link_gbps}")
        if not self.host_memory_gb >= 0:
            raise ValueError(f"Cluster.host_memory_gb must be >= 0, got {self.host_memory_gb}")

    @property
    def disaggregated(self) -> bool:
        """True when prefill and decode run on separate pools."""
        return self.prefill_replicas > 0

    @property
    def n_replicas(self) -> int:
        """Total replicas (all pools)."""
        if self.disaggregated:
            return self.prefill_replicas + self.decode_replicas
        return self.replicas

    def with_(self, **changes: Any) -> "Cluster":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (``extra`` as a dict); sizes in the fields' own
        units (``link_gbps`` in GB/s, ``host_memory_gb`` in GB)."""
        return {
            "gpu": self.gpu, "llm": self.llm, "tp": self.tp, "replicas": self.replicas,
            "prefill_replicas": self.prefill_replicas, "decode_replicas": self.decode_replicas,
            "link_gbps": self.link_gbps, "gpu_memory_fraction": self.gpu_memory_fraction,
            "block_tokens": self.block_tokens, "host_memory_gb": self.host_memory_gb,
            "extra": dict(self.extra),
        }
