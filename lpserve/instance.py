"""A problem instance (layer 2): trace + cluster + cost model + SLO + horizon, and the
benchmark instances of ``instances/`` (:func:`load_instance`)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lpserve.cluster import Cluster
from lpserve.trace import Trace

#: the benchmark instances shipped with the repository (``instances/<name>/instance.toml``)
INSTANCES_DIR = Path(__file__).resolve().parents[1] / "instances"

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


@dataclass(frozen=True)
class Tier:
    """A service tier: a name, its latency objectives and the tenants (trace tenant ids)
    it covers. Requests of tenants in no tier have the instance's SLO (tier
    ``"default"``)."""

    name: str
    slo: SLO
    tenants: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name == "default":
            raise ValueError(f"Tier.name must be a non-empty string other than 'default', "
                             f"got {self.name!r}")
        if not isinstance(self.slo, SLO):
            raise ValueError(f"Tier {self.name!r}: slo must be an SLO, got {self.slo!r}")
        ids = tuple(self.tenants)
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))
               or t < 0]
        if bad or not ids:
            raise ValueError(f"Tier {self.name!r}: tenants must be a non-empty tuple of "
                             f"tenant ids >= 0, got {self.tenants!r}")
        object.__setattr__(self, "tenants", tuple(int(t) for t in ids))


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
        tiers: service tiers (:class:`Tier`), each with its own SLO for its tenants; the
            summary reports SLO attainment per tier. Tenants in none use ``slo``.
    """

    trace: Trace
    cluster: Cluster
    slo: SLO = SLO()
    horizon_s: float | None = None
    cost: Any = None
    tiers: tuple[Tier, ...] = ()

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
        tiers = tuple(self.tiers)
        if any(not isinstance(t, Tier) for t in tiers):
            raise ValueError(f"Instance.tiers must hold Tier objects, got {self.tiers!r}")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"Instance.tiers: tier names must be distinct, got {names}")
        seen: dict[int, str] = {}
        for t in tiers:
            for u in t.tenants:
                if u in seen:
                    raise ValueError(f"Instance.tiers: tenant {u} is in tiers "
                                     f"{seen[u]!r} and {t.name!r}")
                seen[u] = t.name
        object.__setattr__(self, "tiers", tiers)

    def request_slos(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request: TTFT and TPOT objectives (s, float64) and tier name (object),
        shape ``(n,)``, from :attr:`tiers` (the instance SLO and ``"default"`` otherwise)."""
        n = len(self.trace)
        ttft = np.full(n, float(self.slo.ttft_s))
        tpot = np.full(n, float(self.slo.tpot_s))
        tier = np.full(n, "default", dtype=object)
        ten = self.trace.tenant
        if ten is not None:
            for t in self.tiers:
                m = np.isin(ten, np.asarray(t.tenants, np.int64))
                ttft[m], tpot[m], tier[m] = t.slo.ttft_s, t.slo.tpot_s, t.name
        return ttft, tpot, tier

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
        if self.tiers:  # hashed only when set, so digests without tiers stay as they were
            meta["tiers"] = [[t.name, t.slo.ttft_s, t.slo.tpot_s, list(t.tenants)]
                             for t in self.tiers]
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


def instance_names() -> list[str]:
    """Names of the instances under ``instances/`` (each has ``instance.toml``)."""
    if not INSTANCES_DIR.is_dir():
        return []
    return sorted(p.parent.name for p in INSTANCES_DIR.glob("*/instance.toml"))


def load_instance(path_or_name: str | Path) -> tuple[Any, dict[str, Any]]:
    """Read ``instances/<name>/instance.toml`` (or a path to one, or to its folder).

    Returns ``(Instance, spec)`` where ``spec`` is the parsed TOML (its ``[optimal]``
    table holds certified values by formulation name).

    TOML: ``[cluster]`` (Cluster fields), ``[cost]`` (``kind = "unit-round"`` with
    ``memory_tokens``, or ``kind = "analytic"``), ``[slo]`` (optional), ``[trace]`` with
    ``file`` (CSV with ``arrival_s,prompt_tokens,output_tokens`` and optional
    ``predicted_lo,predicted_hi``).
    """
    import tomllib

    p = Path(path_or_name)
    if not p.exists():
        p = INSTANCES_DIR / str(path_or_name)
    if p.is_dir():
        p = p / "instance.toml"
    if not p.is_file():
        raise FileNotFoundError(f"instance {path_or_name!r}: no such file or instance "
                                f"(known: {', '.join(instance_names()) or 'none'})")
    spec = tomllib.loads(p.read_text())
    for key in ("cluster", "cost", "trace"):
        if key not in spec:
            raise ValueError(f"{p}: missing table [{key}]")
    tfile = p.parent / spec["trace"]["file"]
    data = np.genfromtxt(tfile, delimiter=",", names=True, dtype=None, encoding="utf-8")
    data = np.atleast_1d(data)
    cols = data.dtype.names or ()
    for c in ("arrival_s", "prompt_tokens", "output_tokens"):
        if c not in cols:
            raise ValueError(f"{tfile}: missing column {c!r} (have {list(cols)})")
    opt = {c: data[c] for c in ("predicted_lo", "predicted_hi") if c in cols}
    trace = Trace.from_arrays(arrival_s=data["arrival_s"].astype(float),
                              prompt_tokens=data["prompt_tokens"].astype(np.int64),
                              output_tokens=data["output_tokens"].astype(np.int64),
                              name=spec.get("name", p.parent.name), **opt)
    cluster = Cluster(**spec["cluster"])
    cs = dict(spec["cost"])
    kind = cs.pop("kind", "analytic")
    if kind == "unit-round":
        from lpserve.cost import UnitRoundCost

        cost = UnitRoundCost(memory_tokens=int(cs["memory_tokens"]))
    elif kind == "analytic":
        cost = None
    else:
        raise ValueError(f"{p}: [cost] kind must be 'unit-round' or 'analytic', got {kind!r}")
    slo = SLO(**spec["slo"]) if "slo" in spec else SLO()
    return Instance(trace=trace, cluster=cluster, slo=slo, cost=cost), spec
