"""A problem instance (layer 2): trace + cluster + cost model + SLO + horizon."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from lpserve.cluster import Cluster
from lpserve.trace import Trace


@dataclass(frozen=True)
class SLO:
    """Latency targets of one request: time to first token and time per output token (s)."""

    ttft_s: float = float("inf")
    tpot_s: float = float("inf")

    def __post_init__(self) -> None:
        for k in ("ttft_s", "tpot_s"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"SLO.{k} must be a positive number of seconds, got {v!r}")


@dataclass(frozen=True, eq=False)
class Instance:
    """What a policy is evaluated on.

    Attributes:
        trace: the requests.
        cluster: replicas, GPU, LLM.
        slo: per-request latency targets (for goodput).
        horizon_s: simulated time after which no iteration starts; unfinished requests
            are reported (``None``: run until every request finishes or is rejected).
        cost: a cost model object (``lpserve.cost_model(...)``, ``UnitRoundCost``,
            ``TableCost``); ``None`` builds one from the cluster's GPU, LLM and TP.
    """

    trace: Trace
    cluster: Cluster
    slo: SLO = SLO()
    horizon_s: float | None = None
    cost: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.trace, Trace):
            raise ValueError(f"Instance.trace must be a Trace, got {type(self.trace).__name__}")
        if not isinstance(self.cluster, Cluster):
            raise ValueError(f"Instance.cluster must be a Cluster, got "
                             f"{type(self.cluster).__name__}")
        if not isinstance(self.slo, SLO):
            raise ValueError(f"Instance.slo must be an SLO, got {self.slo!r}")
        if self.horizon_s is not None and not (float(self.horizon_s) > 0):
            raise ValueError(f"Instance.horizon_s must be > 0 or None, got {self.horizon_s!r}")

    def cost_model(self) -> Any:
        """The instance's cost model (built from the cluster when ``cost`` is None)."""
        if self.cost is not None:
            return self.cost
        from lpserve.cost import cost_model

        return cost_model(gpu=self.cluster.gpu, llm=self.cluster.llm, tp=self.cluster.tp)

    def with_(self, **changes: Any) -> "Instance":
        from dataclasses import replace

        return replace(self, **changes)

    def digest(self) -> str:
        """A stable sha256 hex digest of every input that can change a result."""
        h = hashlib.sha256()
        t = self.trace
        for name in ("arrival_s", "prompt_tokens", "output_tokens", "block_flat",
                     "block_offsets", "session_id", "program_id", "parent", "tenant",
                     "predicted_lo", "predicted_hi"):
            a = getattr(t, name)
            h.update(name.encode())
            if a is None:
                h.update(b"none")
            else:
                arr = np.ascontiguousarray(a)
                h.update(str(arr.dtype).encode())
                h.update(arr.tobytes())
        meta = {
            "block_tokens": t.block_tokens,
            "cluster": self.cluster.as_dict(),
            "slo": [self.slo.ttft_s, self.slo.tpot_s],
            "horizon_s": self.horizon_s,
        }
        h.update(json.dumps(meta, sort_keys=True, default=str).encode())
        if self.cost is not None:
            h.update(str(getattr(self.cost, "kind", type(self.cost).__name__)).encode())
            params = getattr(self.cost, "params", None)
            if params is not None:
                h.update(np.ascontiguousarray(params, dtype=np.float64).tobytes())
            # swap bandwidth is not in params; hashed only when overridden, so digests of
            # instances at the default stay as they were
            pcie = getattr(self.cost, "pcie_efficiency", 1.0)
            if pcie != 1.0:
                h.update(f"pcie_efficiency={float(pcie)!r}".encode())
        return h.hexdigest()
