"""Interconnects and serving engines: what the communication terms of the cost model use.

``lpserve/data/links.toml`` describes each GPU-to-GPU link kind (topology, latency and
bandwidth efficiency of all-reduce and all-to-all, with the measurement behind each
figure); ``lpserve/data/engines.toml`` names the engines a cost model can stand for and the
all-reduce algorithm each uses. Equations: ``models/cost-model.md`` (7) and (7b).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from lpserve.cost.catalog import INTERCONNECTS, VENDORS, GPUSpec

TOPOLOGIES = ("switch", "mesh", "bridge", "bus")
ALGORITHMS = ("nccl", "custom")


@dataclass(frozen=True)
class LinkSpec:
    """One interconnect kind (a row of ``links.toml``); latencies in s, efficiencies in (0, 1]."""

    key: str
    name: str
    topology: str
    peers: int
    nccl_fixed_s: float
    nccl_step_s: float
    nccl_efficiency: float
    custom_fixed_s: float
    custom_step_s: float
    custom_efficiency: float
    a2a_fixed_s: float
    a2a_efficiency: float
    source: str

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"link {self.key!r}: topology must be one of {TOPOLOGIES}, "
                             f"got {self.topology!r}")
        if not (isinstance(self.peers, int) and self.peers >= 1):
            raise ValueError(f"link {self.key!r}: peers must be a positive integer")
        for f in ("nccl_fixed_s", "nccl_step_s", "custom_fixed_s", "custom_step_s", "a2a_fixed_s"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"link {self.key!r}: {f} must be >= 0")
        for f in ("nccl_efficiency", "custom_efficiency", "a2a_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ValueError(f"link {self.key!r}: {f} must be in (0, 1]")

    def one_way_gbps(self, gpu: GPUSpec, tp: int) -> float:
        """GB/s one GPU can send in a collective among ``tp`` GPUs (topology of the header)."""
        if self.topology == "bus":
            return gpu.pcie_gbps / 2.0
        if self.topology == "bridge":
            return gpu.nvlink_gbps / 2.0 if tp <= 2 else gpu.pcie_gbps / 2.0
        if self.topology == "mesh":
            return gpu.nvlink_gbps / self.peers * max(tp - 1, 1) / 2.0
        return gpu.nvlink_gbps / 2.0

    def all_reduce(self, algorithm: str) -> tuple[float, float, float]:
        """(fixed latency s, latency per log2(tp) step s, bandwidth efficiency) of ``algorithm``."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"all-reduce algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        return (getattr(self, f"{algorithm}_fixed_s"), getattr(self, f"{algorithm}_step_s"),
                getattr(self, f"{algorithm}_efficiency"))


@dataclass(frozen=True)
class EngineSpec:
    """One serving engine (a row of ``engines.toml``)."""

    key: str
    name: str
    all_reduce: str
    vendors: tuple[str, ...]
    source: str


@lru_cache(maxsize=None)
def _links() -> dict[str, LinkSpec]:
    raw = tomllib.loads((resources.files("lpserve") / "data" / "links.toml").read_text())
    missing = set(INTERCONNECTS) - set(raw)
    if missing:
        raise LookupError(f"links.toml lacks the interconnects {sorted(missing)}")
    return {k: LinkSpec(key=k, **v) for k, v in raw.items()}


@lru_cache(maxsize=None)
def _engines() -> dict[str, EngineSpec]:
    raw = tomllib.loads((resources.files("lpserve") / "data" / "engines.toml").read_text())
    out = {}
    for k, v in raw.items():
        spec = EngineSpec(key=k, name=v["name"], all_reduce=v["all_reduce"],
                          vendors=tuple(v["vendors"]), source=v["source"])
        if spec.all_reduce not in ALGORITHMS or not set(spec.vendors) <= set(VENDORS):
            raise ValueError(f"engines.toml [{k}]: all_reduce must be one of {ALGORITHMS} and "
                             f"vendors among {VENDORS}")
        out[k] = spec
    return out


def get_link(key: str) -> LinkSpec:
    """The ``links.toml`` entry of interconnect ``key``."""
    table = _links()
    if key not in table:
        raise KeyError(f"unknown interconnect {key!r}; known: {', '.join(sorted(table))}")
    return table[key]


def engine_names() -> list[str]:
    """Engines a cost model can stand for (``engines.toml``)."""
    return sorted(_engines())


def get_engine(key: str) -> EngineSpec:
    """The ``engines.toml`` entry of engine ``key``."""
    table = _engines()
    if key not in table:
        raise KeyError(f"unknown engine {key!r}; known: {', '.join(sorted(table))}")
    return table[key]
