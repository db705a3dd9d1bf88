"""Results of a sweep on disk: small atomic part files, merged on read.

Layout of a sweep directory::

    OUT/manifest.json                 the grid and the cell count (rewritten per run)
    OUT/parts/part-<ns>-<pid>-<n>.parquet   one file per completed batch of cells

A part file is written under a temporary name in the same folder, flushed to disk and
renamed into place (``os.replace`` is atomic on POSIX), so a crash at any moment leaves
either a whole part or none; stale temporary files are removed on the next run. Reading
concatenates the parts and keeps one row per cell (a successful row wins over an error
row, then the newest part wins), so nothing is lost or duplicated. Parquet needs pyarrow;
without it parts are CSV.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

PART_GLOB = "part-*"
_TMP_PREFIX = ".tmp-"


def have_pyarrow() -> bool:
    """Whether pyarrow (for Parquet) is importable."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


class ResultStore:
    """The part files of one sweep directory.

    Args:
        out_dir: the sweep directory (created if missing).
        format: ``"parquet"``, ``"csv"`` or ``"auto"`` (Parquet when pyarrow is present).
    """

    def __init__(self, out_dir: str | os.PathLike, format: str = "auto") -> None:
        if format not in ("auto", "parquet", "csv"):
            raise ValueError(f"ResultStore.format must be auto, parquet or csv, got {format!r}")
        if format == "auto":
            format = "parquet" if have_pyarrow() else "csv"
        elif format == "parquet" and not have_pyarrow():
            raise ValueError("ResultStore.format='parquet' needs pyarrow (pip install pyarrow)")
        self.out_dir = Path(out_dir)
        self.parts_dir = self.out_dir / "parts"
        self.format = format
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self._seq = 0
        self.run_id = uuid.uuid4().hex[:12]

    # ------------------------------------------------------------------ writing
    def clean_tmp(self) -> int:
        """Remove temporary files left by a crashed run; returns how many."""
        n = 0
        for p in self.parts_dir.glob(_TMP_PREFIX + "*"):
            p.unlink(missing_ok=True)
            n += 1
        return n

    def write_part(self, rows: list[dict[str, Any]]) -> Path | None:
        """Write ``rows`` as one new part file, atomically; ``None`` for no rows."""
        if not rows:
            return None
        import pandas as pd

        self._seq += 1
        stem = f"part-{time.time_ns():020d}-{os.getpid()}-{self._seq:05d}"
        final = self.parts_dir / f"{stem}.{self.format}"
        tmp = self.parts_dir / f"{_TMP_PREFIX}{stem}.{self.format}"
        df = pd.DataFrame([{"run_id": self.run_id, **r, "part": stem} for r in rows])
        with open(tmp, "wb") as fh:
            if self.format == "parquet":
                df.to_parquet(fh, index=False)
            else:
                df.to_csv(fh, index=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        dfd = os.open(self.parts_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return final

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Write ``manifest.json`` atomically (the grid and what this run is)."""
        tmp = self.out_dir / f"{_TMP_PREFIX}manifest.json"
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        os.replace(tmp, self.out_dir / "manifest.json")

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest written by :meth:`write_manifest`, or None."""
        p = self.out_dir / "manifest.json"
        return json.loads(p.read_text()) if p.exists() else None

    # ------------------------------------------------------------------ reading
    def part_files(self) -> list[Path]:
        """Complete part files, oldest first."""
        return sorted(p for p in self.parts_dir.glob(PART_GLOB)
                      if p.suffix in (".parquet", ".csv"))

    def read_raw(self) -> "Any":
        """Every row of every part (duplicates kept), in write order: a DataFrame."""
        import pandas as pd

        frames = []
        for p in self.part_files():
            if p.suffix == ".parquet":
                frames.append(pd.read_parquet(p))
            else:
                # identifiers stay strings (a hex run id such as "12e45..." would
                # otherwise read back as a number)
                frames.append(pd.read_csv(p, dtype={"run_id": str, "part": str, "cell": str,
                                                    "error": str, "result_digest": str},
                                          keep_default_na=True))
        if not frames:
            return pd.DataFrame(columns=["cell", "status", "error", "result_digest"])
        df = pd.concat(frames, ignore_index=True, sort=False)
        for col in ("error", "result_digest"):
            if col in df:
                df[col] = df[col].fillna("")
        return df

    def read(self, cells: Iterable[str] | None = None) -> "Any":
        """One row per cell (an ``ok`` row over an ``error`` row, then the newest).

        Args:
            cells: keep only these cell keys (e.g. the cells of the current grid).
        """
        df = self.read_raw()
        if df.empty:
            return df
        df = df.assign(_ok=(df["status"] == "ok").astype(int), _order=range(len(df)))
        df = df.sort_values(["_ok", "_order"]).drop_duplicates("cell", keep="last")
        df = df.sort_values("_order").drop(columns=["_ok", "_order"]).reset_index(drop=True)
        if cells is not None:
            keep = set(cells)
            df = df[df["cell"].isin(keep)].reset_index(drop=True)
        return df

    def finished(self) -> set[str]:
        """Keys of cells with an ``ok`` row."""
        df = self.read_raw()
        if df.empty:
            return set()
        return set(df.loc[df["status"] == "ok", "cell"].astype(str))

    def recorded(self) -> set[str]:
        """Keys of cells with any row (finished or failed)."""
        df = self.read_raw()
        return set() if df.empty else set(df["cell"].astype(str))

    def compact(self) -> Path | None:
        """Merge all parts into one (deduplicated) part, then remove the old ones."""
        old = self.part_files()
        if len(old) <= 1:
            return old[0] if old else None
        df = self.read().drop(columns=["part"], errors="ignore")
        new = self.write_part(df.to_dict("records"))
        for p in old:
            p.unlink()
        return new
