"""Frozen cluster specifications (layer 0: numpy only).

A :class:`Cluster` names the hardware and model by catalog keys (see
:mod:`lpserve.cost` for the catalog) and describes how replicas are laid out:
colocated replicas, or prefill and decode pools joined by a KV-transfer link.
Names are validated against the catalog when a cost model is built from them.

A heterogeneous cluster lists its colocated replicas as :class:`ReplicaGroup` s
(``Cluster.mixed(llm=..., groups=[("h100-sxm", 2), ("a100-80gb", 4)])``); every replica
then has its own GPU type and tensor-parallel degree (:meth:`Cluster.replica_types`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

VALID_TP = (1, 2, 4, 8)


@dataclass(frozen=True)
class ReplicaGroup:
    """``count`` colocated replicas of one GPU type at one tensor-parallel degree.

    Attributes:
        gpu: catalog GPU key, e.g. ``"h100-sxm"``.
        count: replicas in the group (>= 1).
        tp: tensor-parallel degree of each replica (1, 2, 4 or 8).
    """

    gpu: str
    count: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, str) or not self.gpu:
            raise ValueError(f"ReplicaGroup.gpu must be a non-empty catalog key, got "
                             f"{self.gpu!r}")
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            raise ValueError(f"ReplicaGroup.count must be an integer >= 1, got {self.count!r}")
        if self.tp not in VALID_TP:
            raise ValueError(f"ReplicaGroup.tp must be one of {VALID_TP}, got {self.tp!r}")


@dataclass(frozen=True)
class Cluster:
    """Replicas of one LLM on one GPU type, or on several (``groups``).

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
        groups: the colocated replicas of a heterogeneous cluster, in replica order;
            empty for a homogeneous one. When given, ``gpu`` and ``tp`` are those of the
            first group and ``replicas`` the total (:meth:`mixed` fills them in).
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
    groups: tuple[ReplicaGroup, ...] = ()

    @classmethod
    def mixed(cls, *, llm: str, groups: Any, **fields_: Any) -> "Cluster":
        """A heterogeneous colocated cluster: ``groups`` is a sequence of
        :class:`ReplicaGroup` or ``(gpu, count)`` / ``(gpu, count, tp)`` tuples, in replica
        order; other :class:`Cluster` fields are keyword arguments."""
        gs = []
        for g in groups:
            if isinstance(g, ReplicaGroup):
                gs.append(g)
            elif isinstance(g, (tuple, list)) and 1 <= len(g) <= 3:
                gs.append(ReplicaGroup(*g))
            else:
                raise ValueError(f"Cluster.mixed: a group must be a ReplicaGroup or a "
                                 f"(gpu, count[, tp]) tuple, got {g!r}")
        if not gs:
            raise ValueError("Cluster.mixed: give at least one group")
        for k in ("gpu", "tp", "replicas"):
            if k in fields_:
                raise ValueError(f"Cluster.mixed: {k!r} comes from the groups, do not pass it")
        return cls(gpu=gs[0].gpu, llm=llm, tp=gs[0].tp, replicas=sum(g.count for g in gs),
                   groups=tuple(gs), **fields_)

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
        if self.groups:
            self._check_groups()

    def _check_groups(self) -> None:
        gs = self.groups
        if not isinstance(gs, tuple) or not all(isinstance(g, ReplicaGroup) for g in gs):
            raise ValueError(f"Cluster.groups must be a tuple of ReplicaGroup, got {gs!r} "
                             "(use Cluster.mixed(llm=..., groups=[(gpu, count[, tp]), ...]))")
        if self.disaggregated:
            raise ValueError("Cluster.groups: heterogeneous replicas are colocated only; "
                             f"got prefill_replicas={self.prefill_replicas}")
        total = sum(g.count for g in gs)
        if (self.gpu, self.tp, self.replicas) != (gs[0].gpu, gs[0].tp, total):
            raise ValueError(
                f"Cluster.groups: gpu, tp and replicas must be the first group's GPU and TP "
                f"and the total count ({gs[0].gpu!r}, {gs[0].tp}, {total}), got "
                f"({self.gpu!r}, {self.tp}, {self.replicas}); use Cluster.mixed(...)")

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

    @property
    def n_gpus(self) -> int:
        """GPUs over all replicas (each replica takes its tensor-parallel degree)."""
        return sum(tp for _, tp in self.replica_types())

    @property
    def heterogeneous(self) -> bool:
        """True when the replicas differ in GPU type or tensor-parallel degree."""
        return len(set(self.replica_types())) > 1

    def replica_types(self) -> list[tuple[str, int]]:
        """``(gpu, tp)`` of every replica, in replica order (length ``n_replicas``; for a
        disaggregated cluster the prefill pool, then the decode pool)."""
        if self.groups:
            return [(g.gpu, g.tp) for g in self.groups for _ in range(g.count)]
        return [(self.gpu, self.tp)] * self.n_replicas

    def describe(self) -> str:
        """Human-readable layout, e.g. ``"2 x h100-sxm tp=1 + 4 x a100-80gb tp=1 / llama-3-8b"``."""
        if self.groups:
            parts = [f"{g.count} x {g.gpu} tp={g.tp}" for g in self.groups]
        elif self.disaggregated:
            parts = [f"{self.prefill_replicas} prefill + {self.decode_replicas} decode x "
                     f"{self.gpu} tp={self.tp}"]
        else:
            parts = [f"{self.replicas} x {self.gpu} tp={self.tp}"]
        return " + ".join(parts) + f" / {self.llm}"

    def with_(self, **changes: Any) -> "Cluster":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """Every field as a JSON-ready value (``extra`` as a dict; sizes in the fields' own
        units, ``link_gbps`` in GB/s, ``host_memory_gb`` in GB); ``groups`` only when the
        cluster has them, so the digests of homogeneous instances are unchanged."""
        out = {
            "gpu": self.gpu, "llm": self.llm, "tp": self.tp, "replicas": self.replicas,
            "prefill_replicas": self.prefill_replicas, "decode_replicas": self.decode_replicas,
            "link_gbps": self.link_gbps, "gpu_memory_fraction": self.gpu_memory_fraction,
            "block_tokens": self.block_tokens, "host_memory_gb": self.host_memory_gb,
            "extra": dict(self.extra),
        }
        if self.groups:
            out["groups"] = [{"gpu": g.gpu, "count": g.count, "tp": g.tp} for g in self.groups]
        return out
