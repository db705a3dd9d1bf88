"""Calibration entries: the shipped ones (``fitted.toml``) and a user's own TOML files.

A calibration entry is a TOML table ``[[calibration]]`` with ``name``, ``gpu`` (a GPU key,
a GPU family or ``"*"``), ``llm`` (an LLM key or ``"*"``), ``engine`` (one of
``engines.toml``), the parameter values it fixes and a ``[calibration.provenance]`` table.
Parameters an entry leaves out take the interconnect's defaults (communication, from
``links.toml``) or the engine's default entry (everything else).
"""
from __future__ import annotations

import difflib
import math
import tomllib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from lpserve.cost.catalog import GPUSpec, LLMSpec

#: the engines of the package's historical default calibration (``engine=None``)
DEFAULT_ENGINES = ("kernels", "vllm")
REQUIRED_KEYS = ("name", "gpu", "llm", "engine")


#: the shipped calibration files, in lookup order: fits to serving benchmarks (today's
#: engines, ``serving.toml``; written by ``scripts/fit_serving_profile.py``) before fits to
#: iteration timings (``fitted.toml``; ``python -m lpserve.cost.fit``), so that at equal
#: specificity an engine's serving-era profile is its default and the older ones stay
#: reachable by name (``calibration="splitwise-h100"``)
CALIBRATION_FILES = ("serving.toml", "fitted.toml")


@lru_cache(maxsize=None)
def calibrations() -> tuple[dict[str, Any], ...]:
    """Calibrated parameter sets from ``lpserve/data/calibration/`` (:data:`CALIBRATION_FILES`
    in order)."""
    folder = resources.files("lpserve") / "data" / "calibration"
    out: list[dict[str, Any]] = []
    for name in CALIBRATION_FILES:
        out.extend(tomllib.loads((folder / name).read_text())["calibration"])
    return tuple(out)


def _order(gpu: GPUSpec, llm: LLMSpec) -> tuple[tuple[str, str], ...]:
    return ((gpu.key, llm.key), (gpu.family, llm.key), (gpu.key, "*"), (gpu.family, "*"),
            ("*", "*"))


#: the engine era each shipped calibration's data measured, by its provenance data file
#: (an entry's own ``era`` field wins)
ERAS = {
    "splitwise_perf_model_medians.csv": "vLLM-based engine of 2023 (Splitwise, ISCA 2024)",
    "vidur_a100": "operator profiles, no engine (Vidur, MLSys 2024)",
    "nemo_trtllm": "TensorRT-LLM of 2023-24 (NVIDIA NeMo inference tables)",
    "sglang_b200": "SGLang 0.5.8 (February 2026)",
}


def era_of(entry: dict[str, Any]) -> str:
    """The serving-engine era a calibration entry models (``era``, else from the data it
    was fitted to; ``"unknown"`` for a user's entry that says neither)."""
    if entry.get("era"):
        return str(entry["era"])
    data = str(entry.get("provenance", {}).get("data", ""))
    for prefix, era in ERAS.items():
        if data.startswith(prefix):
            return era
    return "unknown"


def calibration_for(gpu: GPUSpec, llm: LLMSpec, engine: str | None = None,
                    entries: Iterable[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The most specific calibration: (gpu key, llm), (family, llm), (gpu, *), (family, *), *.

    ``engine`` restricts the search to that engine's entries; ``None`` searches the
    package's default set (the engines in :data:`DEFAULT_ENGINES`), which is what
    ``lp.cost_model`` used before engines could be named.
    """
    pool = list(calibrations() if entries is None else entries)
    engines = DEFAULT_ENGINES if engine is None else (engine,)
    for g, m in _order(gpu, llm):
        for eng in engines:  # at equal specificity the default set prefers operator profiles
            for e in pool:
                if e["gpu"] == g and e["llm"] == m and e.get("engine") == eng:
                    return dict(e)
    which = "the default set" if engine is None else f"engine {engine!r}"
    raise LookupError(f"no calibration of {which} matches gpu {gpu.key!r} (family "
                      f"{gpu.family!r}) and llm {llm.key!r}; calibrations need a ('*', '*') "
                      "entry per engine")


def named_calibration(name: str) -> dict[str, Any]:
    """The shipped calibration called ``name``."""
    for e in calibrations():
        if e.get("name") == name:
            return dict(e)
    names = sorted(e.get("name", "") for e in calibrations())
    raise KeyError(f"unknown calibration {name!r}; known: {', '.join(names)} (or a path to a "
                   "TOML file written by `lpserve calibrate`)")


def load_calibration_file(path: str | Path,
                          fields: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The ``[[calibration]]`` entries of a TOML file (as written by ``lpserve calibrate``).

    ``fields``: the numeric fields an entry may set (``lp.cost_model`` passes its
    parameters); another one is an error naming it and the nearest known one. Errors name
    the file and the entry and field at fault.
    """
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"calibration file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"calibration file {str(p)!r}: not valid TOML ({exc})") from None
    entries = raw.get("calibration")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"calibration file {str(p)!r}: needs one or more [[calibration]] tables")
    for i, e in enumerate(entries):
        where = f"calibration file {str(p)!r}, entry {i} ({e.get('name', 'no name')!r})"
        for k in REQUIRED_KEYS:
            if not isinstance(e.get(k), str) or not e.get(k):
                raise ValueError(f"{where}: field {k!r} must be a non-empty string")
        known = frozenset(fields) if fields is not None else None
        for k, v in e.items():
            if k in REQUIRED_KEYS or k in ("provenance", "era"):
                continue
            if known is not None and k not in known:
                near = difflib.get_close_matches(k, sorted(known), n=1)
                raise ValueError(f"{where}: unknown field {k!r}"[:300]
                                 + (f"; did you mean {near[0]!r}?" if near else
                                    f"; known: {', '.join(sorted(known))}"))
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{where}: field {k!r} must be a finite number, got "
                                 f"{v!r}"[:300])
    return [dict(e) for e in entries]


def resolve(calibration: str | Path, gpu: GPUSpec, llm: LLMSpec,
            engine: str | None, fields: Iterable[str] | None = None) -> dict[str, Any]:
    """The entry ``calibration`` names: a shipped calibration's name, or a TOML file (the
    entry of that file matching the pair, in the lookup order of :func:`calibration_for`;
    ``fields`` as in :func:`load_calibration_file`)."""
    text = str(calibration)
    if isinstance(calibration, Path) or text.endswith(".toml") or Path(text).exists():
        entries = load_calibration_file(calibration, fields)
        try:
            return calibration_for(gpu, llm, engine, entries) if engine else _first_match(
                gpu, llm, entries, text)
        except LookupError:
            raise LookupError(f"calibration file {text!r} has no entry for gpu {gpu.key!r} and "
                              f"llm {llm.key!r}" + (f" with engine {engine!r}" if engine else ""))
    return named_calibration(text)


def _first_match(gpu: GPUSpec, llm: LLMSpec, entries: list[dict[str, Any]], text: str) -> dict[str, Any]:
    for g, m in _order(gpu, llm):
        for e in entries:
            if e["gpu"] == g and e["llm"] == m:
                return dict(e)
    raise LookupError(text)
