"""Per-run checkpoints of a comparison, so that an interrupted run resumes (layer 5).

A :class:`RunStore` is a folder with one ``<key>.npz`` per simulation a comparison ran:
the run's table row (JSON) and the per-request arrays the comparison needs afterwards
(latencies, finished mask). The key is the sha256 of everything that can change the
run's outcome: the lpserve code itself (:func:`code_digest`, over the package's ``.py``
and ``.toml`` files), the instance digest, the policy's identity (its registered or
solved name and engine overrides, or the pickle of a Policy object), the predictor and
the seed. A resumed comparison loads the runs it finds and simulates the others, and
since a simulation is a pure function of its inputs it gives the same table as one that
was never interrupted (``wall_s`` is the original run's).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any, Mapping

import numpy as np

#: per-request arrays kept for each run
ARRAY_KEYS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")


@functools.cache
def code_digest() -> str:
    """sha256 over the lpserve package's ``.py`` and ``.toml`` files (path and bytes)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".toml") and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def identity(spec: Any, overrides: Mapping[str, Any] | None = None) -> str:
    """A text that identifies a policy spec: ``registered:NAME`` or the sha256 of the
    pickled Policy, plus its engine overrides."""
    if isinstance(spec, str):
        base = f"name:{spec}"
    else:
        try:
            base = "pickle:" + hashlib.sha256(pickle.dumps(spec)).hexdigest()
        except Exception as exc:
            raise ValueError(f"checkpoint: policy {getattr(spec, 'name', spec)!r} cannot be "
                             f"pickled ({type(exc).__name__}: {exc}), so its runs cannot be "
                             "keyed; run without a checkpoint folder") from None
    return base + "|" + json.dumps(dict(overrides or {}), sort_keys=True, default=str)


def predictor_identity(predictor: Any) -> str:
    """``none``, the spec text, or the sha256 of the pickled predictor."""
    if predictor is None or isinstance(predictor, str):
        return str(predictor).strip().lower() if predictor is not None else "none"
    return "pickle:" + hashlib.sha256(pickle.dumps(predictor)).hexdigest()


class RunStore:
    """A checkpoint folder of simulation runs (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"checkpoint folder {str(self.folder)!r}: cannot create it "
                             f"({exc})") from None

    @staticmethod
    def key(*, instance_digest: str, policy: str, predictor: str, seed: int) -> str:
        """The run's key (sha256 hex)."""
        text = json.dumps({"code": code_digest(), "instance": instance_digest,
                           "policy": policy, "predictor": predictor, "seed": int(seed)},
                          sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def path(self, key: str) -> Path:
        """The file of run ``key``."""
        return self.folder / f"{key}.npz"

    def load(self, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """``(row, arrays)`` of a stored run, or ``None``."""
        p = self.path(key)
        if not p.is_file():
            return None
        try:
            with np.load(p, allow_pickle=False) as z:
                row = json.loads(str(z["row"]))
                arrays = {k: np.array(z[k]) for k in (*ARRAY_KEYS, "finished")}
        except (OSError, ValueError, KeyError):
            return None  # a partial or foreign file: run again
        return row, arrays

    def save(self, key: str, row: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Store one run atomically (write, then rename)."""
        tmp = self.folder / f".{key}.{os.getpid()}.tmp.npz"
        np.savez(tmp, row=np.array(json.dumps(dict(row))),
                 **{k: np.asarray(arrays[k]) for k in (*ARRAY_KEYS, "finished")})
        os.replace(tmp, self.path(key))

    def __len__(self) -> int:
        return sum(1 for _ in self.folder.glob("*.npz"))


__all__ = ["ARRAY_KEYS", "RunStore", "code_digest", "identity", "predictor_identity"]
