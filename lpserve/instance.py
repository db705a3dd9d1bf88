"""A problem instance (layer 2): trace + cluster + cost model + SLO + horizon, and the
benchmark instances of ``instances/`` (:func:`load_instance`)."""
from __future__ import annotations

import dataclasses
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
    """Latency targets of one request (s): time to first token, time per output token,
    and ``e2e_s``, a deadline for the whole response (end-to-end latency; a deadline
    request of JITServe). A request meets its SLO when it meets all three."""

    ttft_s: float = float("inf")
    tpot_s: float = float("inf")
    e2e_s: float = float("inf")

    def __post_init__(self) -> None:
        for k in ("ttft_s", "tpot_s", "e2e_s"):
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
            ``TableCost``), or a tuple of one per replica (heterogeneous clusters);
            ``None`` builds each replica's from its GPU, LLM and TP.
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
        if isinstance(self.cost, (tuple, list)):
            if len(self.cost) != self.cluster.n_replicas:
                raise ValueError(f"Instance.cost: {len(self.cost)} cost models for "
                                 f"{self.cluster.n_replicas} replicas")
            object.__setattr__(self, "cost", tuple(self.cost))

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

    def request_e2e_s(self) -> np.ndarray:
        """Per request: the end-to-end deadline (s, float64, shape ``(n,)``) of its tier's
        SLO (the instance's for tenants in no tier); ``inf`` where there is none."""
        e2e = np.full(len(self.trace), float(self.slo.e2e_s))
        ten = self.trace.tenant
        if ten is not None:
            for t in self.tiers:
                e2e[np.isin(ten, np.asarray(t.tenants, np.int64))] = t.slo.e2e_s
        return e2e

    @property
    def heterogeneous(self) -> bool:
        """True when the replicas have different cost models."""
        if isinstance(self.cost, tuple):
            return len({id(c) for c in self.cost}) > 1
        return self.cost is None and self.cluster.heterogeneous

    def cost_model(self) -> Any:
        """The cost model every replica shares (built from the cluster when ``cost`` is
        None); raises for a heterogeneous instance (use :meth:`replica_cost_models`)."""
        if self.heterogeneous:
            raise ValueError(f"instance on {self.cluster.describe()}: the replicas have "
                             "different cost models; use replica_cost_models()")
        if isinstance(self.cost, tuple):
            return self.cost[0]
        if self.cost is not None:
            return self.cost
        from lpserve.cost import cost_model

        return cost_model(gpu=self.cluster.gpu, llm=self.cluster.llm, tp=self.cluster.tp)

    def replica_cost_models(self) -> list[Any]:
        """One cost model per replica, in replica order (length ``cluster.n_replicas``);
        replicas of one type share one object."""
        if isinstance(self.cost, tuple):
            return list(self.cost)
        if self.cost is not None or not self.cluster.heterogeneous:
            return [self.cost_model()] * self.cluster.n_replicas
        from lpserve.cost import cost_models_for

        return cost_models_for(self.cluster)

    def with_(self, **changes: Any) -> "Instance":
        """A copy with some fields changed (``dataclasses.replace``; validated again by
        ``__post_init__``)."""
        from dataclasses import replace

        return replace(self, **changes)

    def digest(self) -> str:
        """A stable sha256 hex digest of every input that can change a result."""
        h = hashlib.sha256()
        t = self.trace
        for name in ("arrival_s", "prompt_tokens", "output_tokens", "block_flat",
                     "block_offsets", "session_id", "program_id", "parent", "tenant",
                     "predicted_lo", "predicted_hi", "wait_kind"):
            a = getattr(t, name)
            if a is None and name == "wait_kind":
                continue  # a later field: digests of traces without it stay as they were
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
                             + ([t.slo.e2e_s] if np.isfinite(t.slo.e2e_s) else [])
                             for t in self.tiers]
        if np.isfinite(self.slo.e2e_s):  # likewise: only a set deadline is hashed
            meta["slo_e2e_s"] = self.slo.e2e_s
        h.update(json.dumps(meta, sort_keys=True, default=str).encode())
        for cost in (self.cost if isinstance(self.cost, tuple) else (self.cost,)):
            if cost is None:
                continue
            h.update(str(getattr(cost, "kind", type(cost).__name__)).encode())
            params = getattr(cost, "params", None)
            if params is not None:
                h.update(np.ascontiguousarray(params, dtype=np.float64).tobytes())
            # swap bandwidth is not in params; hashed only when overridden, so digests of
            # instances at the default stay as they were
            pcie = getattr(cost, "pcie_efficiency", 1.0)
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
    if not p.exists():
        raise FileNotFoundError(f"instance {path_or_name!r}: no such file or instance "
                                f"(known: {', '.join(instance_names()) or 'none'})")
    spec = tomllib.loads(_read_text(p))
    for key in ("cluster", "cost", "trace"):
        if not isinstance(spec.get(key), dict):
            raise ValueError(f"{p}: missing table [{key}]")
    if not isinstance(spec["trace"].get("file"), str):
        raise ValueError(f"{p}: [trace] needs file = \"<csv file>\"")
    tfile = p.parent / spec["trace"]["file"]
    trace = _instance_trace(tfile, spec.get("name", p.parent.name))
    fields = {f.name for f in dataclasses.fields(Cluster)}
    bad = sorted(set(spec["cluster"]) - fields)
    if bad:
        raise ValueError(f"{p}: [cluster] has unknown key(s) {bad}; known: {sorted(fields)}")
    cluster = Cluster(**spec["cluster"])
    cs = dict(spec["cost"])
    kind = cs.pop("kind", "analytic")
    if kind == "unit-round":
        from lpserve.cost import UnitRoundCost

        m = cs.get("memory_tokens")
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"{p}: [cost] memory_tokens must be an integer >= 1, got {m!r}")
        cost = UnitRoundCost(memory_tokens=m)
    elif kind == "analytic":
        cost = None
    else:
        raise ValueError(f"{p}: [cost] kind must be 'unit-round' or 'analytic', got {kind!r}")
    try:
        slo = SLO(**spec["slo"]) if "slo" in spec else SLO()
    except TypeError as exc:
        raise ValueError(f"{p}: [slo]: {exc}") from None
    return Instance(trace=trace, cluster=cluster, slo=slo, cost=cost), spec


def _read_text(p: Path) -> str:
    """The text of regular file ``p`` (a FIFO or device is refused: reading could block)."""
    import stat

    if not stat.S_ISREG(p.stat().st_mode):
        raise ValueError(f"{p}: not a regular file")
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _instance_trace(tfile: Path, name: str) -> Trace:
    """The CSV trace of an instance (``arrival_s,prompt_tokens,output_tokens`` and
    optional ``predicted_lo,predicted_hi``); errors name the file, line, column, value."""
    import csv
    import io

    if not tfile.exists():
        raise FileNotFoundError(f"{tfile}: no such file (the instance's [trace] file)")
    rows = list(csv.reader(io.StringIO(_read_text(tfile))))
    if not rows:
        raise ValueError(f"{tfile}: file is empty")
    head = [c.strip() for c in rows[0]]
    for c in ("arrival_s", "prompt_tokens", "output_tokens"):
        if c not in head:
            raise ValueError(f"{tfile}: missing column {c!r} (have {head})")
    if len(set(head)) != len(head):
        raise ValueError(f"{tfile}: line 1: a column name appears twice ({head})")
    cols: dict[str, list[float]] = {c: [] for c in head}
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(x.strip() for x in row):
            continue
        if len(row) != len(head):
            raise ValueError(f"{tfile}: line {lineno}: {len(row)} fields, header has "
                             f"{len(head)}")
        for c, x in zip(head, row):
            try:
                cols[c].append(float(x))
            except ValueError:
                raise ValueError(f"{tfile}: line {lineno}, column {c!r}: not a number: "
                                 f"{x!r}") from None
    opt = {c: cols[c] for c in ("predicted_lo", "predicted_hi") if c in cols}
    return Trace.from_arrays(arrival_s=cols["arrival_s"], prompt_tokens=cols["prompt_tokens"],
                             output_tokens=cols["output_tokens"], name=name, **opt)
