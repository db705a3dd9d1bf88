"""Sweep grids: parsing, validation, expansion into cells, and cell digests.

A grid is a TOML file (or the equivalent nested dict)::

    name = "default"
    kind = "simulate"          # simulate | solve | bound | cache | stats
    replications = 3           # independent seeds per point, from SeedSequence(seed)
    seed = 0                   # root entropy of the replication seeds

    [traces.conv]              # named base traces; the `trace` axis picks among them
    source = "azure-conv-10min"  # bundled trace name or a file path (relative to the grid)
    head = 120                 # keep the first `head` requests after `start` (optional)
    arrivals = "poisson"       # "trace": keep arrival times, scaled by `load`;
                               # "poisson": redraw Poisson arrivals at load x trace rate

    [cluster]                  # fixed Cluster fields
    gpu = "a100-80gb"
    llm = "llama-2-7b"

    [slo]
    ttft_s = 1.0
    tpot_s = 0.1

    [params]                   # fixed values of any other axis (horizon_s, formulation, ...)
    predictor = "history"      # output-length predictor of simulate cells (a spec:
                               # "noisy-oracle:sigma=0.3"; "none": on purpose without)

    [engine]                   # EngineConfig overrides of simulate cells: for every policy,
    max_num_seqs = 128
    [engine.vllm]              # and for one policy (wins over the shared ones)
    max_num_batched_tokens = 131072

    [axes]                     # every combination of these values is one point
    policy = ["vllm", "sarathi"]
    load = [0.5, 1.0, 2.0]
    "engine.max_num_seqs" = [64, 256]   # an EngineConfig field as an axis

A *cell* is one point times one replication. Its canonical inputs (every value that can
change its result, including the content digest of its base trace) are hashed with
sha256 into the cell key, so the key does not depend on axis order, on which other
values the grid lists, or on where the trace file lives.

Replication ``r`` of a grid with root seed ``s`` uses seed
``SeedSequence(s).spawn(R)[r].generate_state(1)[0]``: the same seed for every point of a
replication (common random numbers across policies and loads), independent streams
across replications.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

#: bump when the meaning of a cell's inputs changes; part of every cell key
SCHEMA_VERSION = 1

KINDS = ("simulate", "solve", "bound", "cache", "stats")
ARRIVALS = ("trace", "poisson")

#: Cluster fields that may be fixed in [cluster] or varied as axes -> type
CLUSTER_FIELDS: dict[str, type] = {
    "gpu": str, "llm": str, "tp": int, "replicas": int, "prefill_replicas": int,
    "decode_replicas": int, "link_gbps": float, "gpu_memory_fraction": float,
    "block_tokens": int, "host_memory_gb": float,
}
#: other axes -> type; `policy` is checked against the registry, `trace` against [traces]
OTHER_AXES: dict[str, type] = {
    "kind": str, "policy": str, "trace": str, "load": float, "rate_per_s": float,
    "seed": int, "slo_ttft_s": float, "slo_tpot_s": float, "horizon_s": float,
    "formulation": str, "time_limit_s": float, "capacity_blocks": int, "cache_policy": str,
    "predictor": str,
}
#: prefix of an axis that varies an EngineConfig field of simulate cells
ENGINE_AXIS = "engine."
AXES: dict[str, type] = {**OTHER_AXES, **CLUSTER_FIELDS}
TRACE_KEYS = ("source", "format", "head", "start", "arrivals")
TOP_KEYS = ("name", "kind", "replications", "seed", "traces", "cluster", "slo", "params",
            "axes", "description", "engine")
DEFAULT_CLUSTER = {"gpu": "a100-80gb", "llm": "llama-2-7b", "tp": 1, "replicas": 1}
#: which inputs each cell kind reads (others are left out of its key)
KIND_INPUTS: dict[str, tuple[str, ...]] = {
    "simulate": ("policy", "slo_ttft_s", "slo_tpot_s", "horizon_s"),
    "solve": ("formulation", "time_limit_s", "slo_ttft_s", "slo_tpot_s", "horizon_s"),
    "bound": ("formulation", "time_limit_s", "slo_ttft_s", "slo_tpot_s", "horizon_s"),
    "cache": ("capacity_blocks", "cache_policy"),
    "stats": (),
}
USES_CLUSTER = ("simulate", "solve", "bound")


def _reads(kind: str, key: str) -> bool:
    """Whether cells of ``kind`` read the input ``key``."""
    if key in ("kind", "trace", "load", "rate_per_s", "seed"):
        return True
    if key == "predictor" or key.startswith(ENGINE_AXIS):
        return kind == "simulate"
    if key in CLUSTER_FIELDS:
        return kind in USES_CLUSTER
    return key in KIND_INPUTS[kind]


class GridError(ValueError):
    """A grid that cannot be run; the message names the key and the value."""


@dataclass(frozen=True)
class TraceSpec:
    """A named base trace of a grid (see the module docstring for the keys)."""

    name: str
    source: str
    format: str = "auto"
    head: int | None = None
    start: int = 0
    arrivals: str = "trace"

    def canonical(self, content_digest: str) -> dict[str, Any]:
        """The inputs that can change a result: not the path, but the file's contents."""
        return {"name": self.name, "digest": content_digest, "head": self.head,
                "start": self.start, "arrivals": self.arrivals}


@dataclass(frozen=True)
class Cell:
    """One run of a sweep: canonical ``inputs`` and their sha256 ``digest`` (the key)."""

    digest: str
    inputs: dict[str, Any] = field(hash=False, compare=False)

    def columns(self) -> dict[str, Any]:
        """The inputs as flat table columns (cluster fields and SLO spelled out)."""
        inp = self.inputs
        out: dict[str, Any] = {"cell": self.digest, "kind": inp["kind"],
                               "trace": inp["trace"]["name"], "rep": inp["rep"],
                               "seed": inp["seed"], "load": inp.get("load"),
                               "rate_per_s": inp.get("rate_per_s")}
        for k in KIND_INPUTS[inp["kind"]]:
            out[k] = inp.get(k)
        if "predictor" in inp:
            out["predictor"] = inp["predictor"]
        for k, v in (inp.get("engine") or {}).items():
            out[ENGINE_AXIS + k] = v
        for k, v in (inp.get("cluster") or {}).items():
            out[k] = v
        return out


def cell_digest(inputs: Mapping[str, Any]) -> str:
    """sha256 hex digest of canonical JSON of ``inputs`` (sorted keys, no whitespace)."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def replication_seeds(root_seed: int, replications: int) -> list[int]:
    """Independent 32-bit seeds, one per replication, spawned from ``SeedSequence(root)``."""
    children = np.random.SeedSequence(int(root_seed)).spawn(int(replications))
    return [int(c.generate_state(1, dtype=np.uint32)[0]) for c in children]


def _coerce(key: str, value: Any, typ: type, where: str) -> Any:
    """``value`` as ``typ`` or a GridError naming ``where`` (the key) and the value."""
    if typ is str:
        if not isinstance(value, str) or not value:
            raise GridError(f"grid {where}: expected a non-empty string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GridError(f"grid {where}: expected a number, got {value!r}")
    if typ is int:
        if float(value) != int(value):
            raise GridError(f"grid {where}: expected an integer, got {value!r}")
        return int(value)
    x = float(value)
    if not math.isfinite(x):
        raise GridError(f"grid {where}: expected a finite number, got {value!r}")
    return x


def _check_value(key: str, value: Any, where: str) -> None:
    if key in ("load", "rate_per_s", "slo_ttft_s", "slo_tpot_s", "horizon_s", "time_limit_s",
               "link_gbps") and not value > 0:
        raise GridError(f"grid {where}: must be > 0, got {value!r}")
    if key in ("capacity_blocks", "seed", "replicas") and value < 0:
        raise GridError(f"grid {where}: must be >= 0, got {value!r}")
    if key == "kind" and value not in KINDS:
        raise GridError(f"grid {where}: unknown cell kind {value!r}; known: {', '.join(KINDS)}")
    if key == "predictor":
        from lpserve.registry import resolve_predictor

        try:
            resolve_predictor(value, f"grid {where}")
        except ValueError as exc:
            raise GridError(str(exc)) from None
    if key == "policy":
        from lpserve.registry import POLICIES, policy_names

        if value not in POLICIES:
            raise GridError(f"grid {where}: unknown policy {value!r}; registered: "
                            f"{', '.join(policy_names())}")


@dataclass(frozen=True)
class Grid:
    """A validated sweep grid. Build with :func:`load_grid` (file, bundled name or dict)."""

    name: str
    kind: str
    replications: int
    seed: int
    traces: dict[str, TraceSpec]
    fixed: dict[str, Any]
    axes: dict[str, list[Any]]
    description: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    engine: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, base_dir: str | os.PathLike | None = None
                  ) -> "Grid":
        """Validate a grid given as a nested dict (the TOML structure)."""
        if not isinstance(data, Mapping):
            raise GridError(f"grid: expected a table of settings, got {type(data).__name__}")
        for k in data:
            if k not in TOP_KEYS:
                raise GridError(f"grid: unknown key {k!r}; known: {', '.join(TOP_KEYS)}")
        name = _coerce("name", data.get("name", "sweep"), str, "name")
        kind = data.get("kind", "simulate")
        _check_value("kind", _coerce("kind", kind, str, "kind"), "kind")
        reps = _coerce("replications", data.get("replications", 1), int, "replications")
        if reps < 1:
            raise GridError(f"grid replications: must be >= 1, got {reps!r}")
        seed = _coerce("seed", data.get("seed", 0), int, "seed")
        if seed < 0:
            raise GridError(f"grid seed: must be >= 0, got {seed!r}")
        traces = cls._parse_traces(data.get("traces"), base_dir)

        fixed: dict[str, Any] = {}
        for table, prefix, allowed in (("cluster", "", CLUSTER_FIELDS), ("slo", "slo_", None),
                                       ("params", "", OTHER_AXES)):
            section = data.get(table, {}) or {}
            if not isinstance(section, Mapping):
                raise GridError(f"grid [{table}]: expected a table, got {section!r}")
            for k, v in section.items():
                key = prefix + k
                if table == "slo" and k not in ("ttft_s", "tpot_s"):
                    raise GridError(f"grid [slo]: unknown key {k!r}; known: ttft_s, tpot_s")
                if allowed is not None and key not in allowed:
                    raise GridError(f"grid [{table}]: unknown key {k!r}; known: "
                                    f"{', '.join(sorted(allowed))}")
                if key in ("kind", "trace", "seed"):
                    raise GridError(f"grid [{table}]: {k!r} is set at the top level or as an "
                                    "axis, not here")
                val = _coerce(key, v, AXES[key], f"[{table}].{k}")
                _check_value(key, val, f"[{table}].{k}")
                fixed[key] = val

        axes_in = data.get("axes", {}) or {}
        if not isinstance(axes_in, Mapping):
            raise GridError(f"grid [axes]: expected a table of lists, got {axes_in!r}")
        axes: dict[str, list[Any]] = {}
        for k, values in axes_in.items():
            if k.startswith(ENGINE_AXIS):
                axes[k] = _engine_axis(k, values)
                continue
            if k not in AXES:
                raise GridError(f"grid [axes]: unknown axis {k!r}; known: "
                                f"{', '.join(sorted(AXES))}, and engine.<EngineConfig field>")
            if not isinstance(values, (list, tuple)):
                raise GridError(f"grid axes.{k}: expected a list of values, got {values!r}")
            if len(values) == 0:
                raise GridError(f"grid axes.{k}: empty list of values")
            if k in fixed:
                raise GridError(f"grid axes.{k}: also given a fixed value ({fixed[k]!r})")
            vals = []
            for i, v in enumerate(values):
                val = _coerce(k, v, AXES[k], f"axes.{k}[{i}]")
                _check_value(k, val, f"axes.{k}[{i}]")
                if k == "trace" and val not in traces:
                    raise GridError(f"grid axes.trace[{i}]: unknown trace {val!r}; defined in "
                                    f"[traces]: {', '.join(traces) or 'none'}")
                if val in vals:
                    raise GridError(f"grid axes.{k}[{i}]: duplicate value {v!r}")
                vals.append(val)
            axes[k] = vals
        if "seed" in axes and reps != 1:
            raise GridError(f"grid axes.seed: explicit seeds need replications = 1, got "
                            f"{reps}")
        if {"load", "rate_per_s"} <= set(axes) | set(fixed):
            raise GridError("grid: give `load` (a factor of the trace's rate) or `rate_per_s`, "
                            "not both")
        if "trace" not in axes and len(traces) > 1:
            raise GridError(f"grid: {len(traces)} traces in [traces] need a `trace` axis")
        kinds = axes.get("kind", [kind])
        if "simulate" in kinds and "policy" not in axes and "policy" not in fixed:
            raise GridError("grid: simulate cells need a `policy` axis or [params].policy")
        if any(k in ("solve", "bound") for k in kinds) and "formulation" not in axes | fixed:
            raise GridError("grid: solve and bound cells need a `formulation` axis or "
                            "[params].formulation")
        for k in axes:
            readers = [kd for kd in kinds if _reads(kd, k)]
            if not readers:
                raise GridError(f"grid axes.{k}: not read by {'/'.join(kinds)} cells (each "
                                "value would repeat the same cells)")
        engine = _engine_table(data.get("engine"))
        _check_engine(engine, axes, fixed)
        return cls(name=name, kind=kind, replications=reps, seed=seed, traces=traces,
                   fixed=fixed, axes=axes, description=str(data.get("description", "")),
                   raw=dict(data), engine=engine)

    @staticmethod
    def _parse_traces(section: Any, base_dir: str | os.PathLike | None) -> dict[str, TraceSpec]:
        from lpserve.trace.loaders import BUNDLED, DEFAULT_TRACE

        if section is None:
            section = {"default": {"source": DEFAULT_TRACE}}
        if not isinstance(section, Mapping) or not section:
            raise GridError(f"grid [traces]: expected a non-empty table of named traces, got "
                            f"{section!r}")
        out: dict[str, TraceSpec] = {}
        for name, spec in section.items():
            where = f"traces.{name}"
            if not isinstance(spec, Mapping):
                raise GridError(f"grid {where}: expected a table with `source`, got {spec!r}")
            for k in spec:
                if k not in TRACE_KEYS:
                    raise GridError(f"grid {where}: unknown key {k!r}; known: "
                                    f"{', '.join(TRACE_KEYS)}")
            source = _coerce("source", spec.get("source", DEFAULT_TRACE), str, where + ".source")
            if source not in BUNDLED:
                p = Path(source).expanduser()
                if not p.is_absolute() and base_dir is not None:
                    p = Path(base_dir) / p
                if not p.exists():
                    raise GridError(f"grid {where}.source: no such file or bundled trace "
                                    f"{source!r}; bundled: {', '.join(BUNDLED)}")
                source = str(p.resolve())
            head = spec.get("head")
            if head is not None:
                head = _coerce("head", head, int, where + ".head")
                if head < 1:
                    raise GridError(f"grid {where}.head: must be >= 1, got {head!r}")
            start = _coerce("start", spec.get("start", 0), int, where + ".start")
            if start < 0:
                raise GridError(f"grid {where}.start: must be >= 0, got {start!r}")
            arrivals = spec.get("arrivals", "trace")
            if arrivals not in ARRIVALS:
                raise GridError(f"grid {where}.arrivals: unknown value {arrivals!r}; known: "
                                f"{', '.join(ARRIVALS)}")
            fmt = _coerce("format", spec.get("format", "auto"), str, where + ".format")
            out[name] = TraceSpec(name=name, source=source, format=fmt, head=head, start=start,
                                  arrivals=arrivals)
        return out

    # ------------------------------------------------------------------ expansion
    @property
    def n_cells(self) -> int:
        """Points times replications (an upper bound on :meth:`cells` for mixed kinds)."""
        return int(np.prod([len(v) for v in self.axes.values()], dtype=np.int64)) * \
            self.replications

    def points(self) -> list[dict[str, Any]]:
        """Every combination of axis values (first axis outermost), fixed values merged."""
        names = list(self.axes)
        return [{**self.fixed, **dict(zip(names, combo))}
                for combo in itertools.product(*(self.axes[n] for n in names))]

    def cells(self, trace_digests: Mapping[str, str]) -> list[Cell]:
        """All cells, given the content digest of each named base trace.

        Cells with the same inputs appear once: in a grid that mixes kinds, a bound or
        cache cell does not repeat for every value of an axis only simulations read.
        """
        seeds = replication_seeds(self.seed, self.replications)
        out: list[Cell] = []
        seen: set[str] = set()
        for point in self.points():
            for rep in range(self.replications):
                inputs = self.cell_inputs(point, rep, point.get("seed", seeds[rep]),
                                          trace_digests)
                cell = Cell(cell_digest(inputs), inputs)
                if cell.digest not in seen:  # e.g. bound cells on a policy axis
                    seen.add(cell.digest)
                    out.append(cell)
        return out

    def cell_inputs(self, point: Mapping[str, Any], rep: int, seed: int,
                    trace_digests: Mapping[str, str]) -> dict[str, Any]:
        """Canonical inputs of one cell: only what its kind reads, with defaults filled."""
        kind = point.get("kind", self.kind)
        tname = point.get("trace", next(iter(self.traces)))
        spec = self.traces[tname]
        if spec.name not in trace_digests:
            raise GridError(f"grid traces.{tname}: no content digest given")
        inputs: dict[str, Any] = {"schema": SCHEMA_VERSION, "kind": kind, "rep": int(rep),
                                  "seed": int(seed),
                                  "trace": spec.canonical(trace_digests[spec.name])}
        if "rate_per_s" in point:
            inputs["rate_per_s"] = float(point["rate_per_s"])
        else:
            inputs["load"] = float(point.get("load", 1.0))
        if kind in USES_CLUSTER:
            inputs["cluster"] = {**DEFAULT_CLUSTER,
                                 **{k: point[k] for k in CLUSTER_FIELDS if k in point}}
        defaults = {"slo_ttft_s": None, "slo_tpot_s": None, "horizon_s": None,
                    "time_limit_s": None, "capacity_blocks": None, "cache_policy": "lru"}
        for k in KIND_INPUTS[kind]:
            inputs[k] = point.get(k, defaults.get(k))
        if kind == "simulate":  # only when set, so the keys of plain grids do not change
            if point.get("predictor") is not None:
                inputs["predictor"] = point["predictor"]
            eng = self.engine_overrides(point)
            if eng:
                inputs["engine"] = eng
        if kind == "cache" and inputs["capacity_blocks"] is None:
            raise GridError("grid: cache cells need a `capacity_blocks` axis or "
                            "[params].capacity_blocks")
        return inputs

    def engine_overrides(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """EngineConfig overrides of a point's policy: ``[engine]`` shared fields, then
        ``[engine.<policy>]``, then ``engine.<field>`` axes (sorted by field)."""
        out = {k: v for k, v in self.engine.items() if not isinstance(v, Mapping)}
        own = self.engine.get(point.get("policy", ""))
        if isinstance(own, Mapping):
            out.update(own)
        out.update({k[len(ENGINE_AXIS):]: v for k, v in point.items()
                    if k.startswith(ENGINE_AXIS)})
        return dict(sorted(out.items()))

    def as_dict(self) -> dict[str, Any]:
        """The grid as a JSON-friendly dict (for the sweep's manifest)."""
        return {"name": self.name, "kind": self.kind, "replications": self.replications,
                "seed": self.seed, "description": self.description,
                "traces": {k: vars(v) for k, v in self.traces.items()},
                "fixed": self.fixed, "axes": self.axes, "engine": self.engine}


def _engine_fields() -> dict[str, Any]:
    from lpserve.policy.engine import ENGINE_TEXT_FIELDS

    return ENGINE_TEXT_FIELDS


def _engine_value(key: str, value: Any, where: str) -> Any:
    """A TOML value of EngineConfig field ``key`` (text parsed as on the CLI)."""
    from lpserve.policy.engine import parse_engine_value

    if key not in _engine_fields():
        raise GridError(f"grid {where}: unknown EngineConfig field {key!r}; settable: "
                        f"{', '.join(_engine_fields())}")
    try:
        return parse_engine_value(key, value, f"grid {where}") if isinstance(value, str) \
            else value
    except ValueError as exc:
        raise GridError(str(exc)) from None


def _engine_axis(key: str, values: Any) -> list[Any]:
    where = f"axes.{key}"
    if not isinstance(values, (list, tuple)) or not values:
        raise GridError(f"grid {where}: expected a non-empty list of values, got {values!r}")
    out = [_engine_value(key[len(ENGINE_AXIS):], v, f"{where}[{i}]")
           for i, v in enumerate(values)]
    if len(set(map(repr, out))) != len(out):
        raise GridError(f"grid {where}: duplicate values {values!r}")
    return out


def _engine_table(section: Any) -> dict[str, Any]:
    """``[engine]``: EngineConfig fields, and ``[engine.<policy>]`` tables of them."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise GridError(f"grid [engine]: expected a table, got {section!r}")
    from lpserve.registry import POLICIES

    out: dict[str, Any] = {}
    for k, v in section.items():
        if isinstance(v, Mapping):
            if k not in POLICIES:
                raise GridError(f"grid [engine.{k}]: {k!r} is not a registered policy")
            out[k] = {f: _engine_value(f, x, f"[engine.{k}].{f}") for f, x in v.items()}
        else:
            out[k] = _engine_value(k, v, f"[engine].{k}")
    return out


def _check_engine(engine: Mapping[str, Any], axes: Mapping[str, list[Any]],
                  fixed: Mapping[str, Any]) -> None:
    """Build every policy's EngineConfig with every override it gets, so a bad value
    fails when the grid is read, naming where it came from."""
    if not engine and not any(k.startswith(ENGINE_AXIS) for k in axes):
        return
    from lpserve.registry import make_policy

    policies = axes.get("policy", [fixed["policy"]] if "policy" in fixed else [])
    eng_axes = {k: v for k, v in axes.items() if k.startswith(ENGINE_AXIS)}
    combos = [dict(zip(eng_axes, c)) for c in itertools.product(*eng_axes.values())] or [{}]
    probe = Grid(name="", kind="simulate", replications=1, seed=0, traces={}, fixed={},
                 axes={}, engine=dict(engine))
    for pol in policies:
        base = make_policy(pol).engine
        for combo in combos:
            over = probe.engine_overrides({"policy": pol, **combo})
            try:
                base.updated(over, where=f"grid [engine] / engine axes for policy {pol!r}")
            except ValueError as exc:
                raise GridError(str(exc)) from None


def bundled_grids() -> list[str]:
    """Names of the grids shipped in ``lpserve/data/grids``."""
    from importlib import resources

    root = resources.files("lpserve") / "data" / "grids"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_grid(grid: "Grid | Mapping[str, Any] | str | os.PathLike") -> Grid:
    """A :class:`Grid` from a Grid, a dict, a TOML file path, or a bundled grid name."""
    if isinstance(grid, Grid):
        return grid
    if isinstance(grid, Mapping):
        return Grid.from_dict(grid)
    path = Path(grid)
    if not path.exists() and isinstance(grid, str) and os.sep not in grid \
            and not grid.endswith(".toml"):
        from importlib import resources

        ref = resources.files("lpserve") / "data" / "grids" / f"{grid}.toml"
        if not ref.is_file():
            raise GridError(f"grid {grid!r}: no such file or bundled grid; bundled: "
                            f"{', '.join(bundled_grids())}")
        return Grid.from_dict(tomllib.loads(ref.read_text()))
    if not path.exists():
        raise FileNotFoundError(f"grid file {str(path)!r} not found")
    if not path.is_file():  # a folder, a FIFO (reading it could block), a device
        raise GridError(f"grid {str(path)!r}: not a regular file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        raise GridError(f"grid {str(path)!r}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise GridError(f"grid {str(path)!r}: not UTF-8 text ({exc.reason} at byte "
                        f"{exc.start})") from None
    return Grid.from_dict(data, base_dir=path.parent)
