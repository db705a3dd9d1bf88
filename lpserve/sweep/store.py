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

Every row carries a ``checksum``: the sha256 of its other fields (:func:`row_checksum`,
in a form that survives the Parquet and CSV round trips). A row whose checksum is missing
or wrong (a forged, edited or truncated row) and a part file that cannot be parsed are
left out on reading and listed in :attr:`ResultStore.rejected`, so their cells count as
not run and are computed again. The checksum detects damage and hand edits, not a
deliberate forger who recomputes it. Concurrent runs on one directory split the cells
through claim files (:mod:`lpserve.sweep.claims`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

import numpy as np

PART_GLOB = "part-*"
_TMP_PREFIX = ".tmp-"
CHECKSUM = "checksum"


def _canon(v: Any) -> str:
    """A field's value as text that a Parquet or CSV round trip does not change: empty
    for null, NaN and ""; ``repr(float)`` for whatever reads as a number (ints and
    numeric strings alike); sequences element-wise."""
    if v is None:
        return ""
    if isinstance(v, (list, tuple)) or (hasattr(v, "tolist") and getattr(v, "ndim", 0)):
        return "[" + ",".join(_canon(x) for x in list(v)) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_canon(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, str) and v == "":
        return ""
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        return str(v)
    return "" if math.isnan(x) else repr(x)


def row_checksum(row: dict[str, Any]) -> str:
    """sha256 (hex) of the row's fields but ``checksum``, null fields left out (a column
    missing from a part and a null value are the same), in key order."""
    h = hashlib.sha256()
    for k in sorted(row):
        if k == CHECKSUM:
            continue
        c = _canon(row[k])
        if c:
            h.update(f"{k}\x1f{c}\x1e".encode())
    return h.hexdigest()


class StoreError(ValueError):
    """A sweep directory that cannot be used (not a folder, not writable); the message
    names the path."""


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
        self._prepare()
        self._seq = 0
        self.run_id = uuid.uuid4().hex[:12]
        #: (part file, rows, reason) of what the last read left out
        self.rejected: list[tuple[str, int, str]] = []

    def _prepare(self) -> None:
        for d in (self.out_dir, self.parts_dir):
            if d.exists() and not d.is_dir():
                raise StoreError(f"sweep directory: {d} exists and is not a folder (a file "
                                 "is in the way; move it or choose another --out)")
        try:
            self.parts_dir.mkdir(parents=True, exist_ok=True)
            probe = self.parts_dir / f"{_TMP_PREFIX}probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StoreError(f"sweep directory: cannot create or write {self.parts_dir}: "
                             f"{exc.strerror or exc}") from None

    # ------------------------------------------------------------------ writing
    def clean_tmp(self, max_age_s: float = 3600.0) -> int:
        """Remove temporary files left by a crashed run (its pid gone, or older than
        ``max_age_s``); a live run's file being written is kept. Returns how many."""
        n = 0
        for p in self.parts_dir.glob(_TMP_PREFIX + "*"):
            if self._writer_alive(p) and time.time() - p.stat().st_mtime < max_age_s:
                continue
            p.unlink(missing_ok=True)
            n += 1
        return n

    @staticmethod
    def _writer_alive(p: Path) -> bool:
        """Whether the process named in temporary file ``p`` (``...-<pid>-<seq>``) runs."""
        try:
            pid = int(p.name.split(".")[1].split("-")[-2])
            if pid <= 0 or pid == os.getpid():
                return False
            os.kill(pid, 0)
        except (IndexError, ValueError, ProcessLookupError):
            return False
        except (PermissionError, OSError):
            return True
        return True

    def write_part(self, rows: list[dict[str, Any]]) -> Path | None:
        """Write ``rows`` as one new part file, atomically; ``None`` for no rows."""
        if not rows:
            return None
        import pandas as pd

        self._seq += 1
        stem = f"part-{time.time_ns():020d}-{os.getpid()}-{self._seq:05d}"
        final = self.parts_dir / f"{stem}.{self.format}"
        tmp = self.parts_dir / f"{_TMP_PREFIX}{stem}.{self.format}"
        recs = []
        for r in rows:
            rec = {"run_id": self.run_id, **{k: v for k, v in r.items() if k != CHECKSUM},
                   "part": stem}
            rec[CHECKSUM] = row_checksum(rec)
            recs.append(rec)
        df = pd.DataFrame(recs)
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
        tmp = self.out_dir / f"{_TMP_PREFIX}manifest-{os.getpid()}-{uuid.uuid4().hex[:6]}.json"
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        os.replace(tmp, self.out_dir / "manifest.json")

    def read_manifest(self) -> dict[str, Any] | None:
        """The manifest written by :meth:`write_manifest`, or None (also when damaged)."""
        p = self.out_dir / "manifest.json"
        try:
            return json.loads(p.read_text()) if p.exists() else None
        except (OSError, ValueError):
            return None

    # ------------------------------------------------------------------ reading
    def part_files(self) -> list[Path]:
        """Complete part files, oldest first."""
        return sorted(p for p in self.parts_dir.glob(PART_GLOB)
                      if p.suffix in (".parquet", ".csv"))

    def _read_part(self, p: Path) -> "Any":
        import pandas as pd

        if p.suffix == ".parquet":
            return pd.read_parquet(p)
        # identifiers stay strings (a hex run id such as "12e45..." would otherwise read
        # back as a number)
        return pd.read_csv(p, dtype={"run_id": str, "part": str, "cell": str, "error": str,
                                     "result_digest": str, CHECKSUM: str},
                           keep_default_na=True)

    def read_raw(self) -> "Any":
        """Every intact row of every part (duplicates kept), in write order: a DataFrame.
        Rows with a missing or wrong checksum and unreadable parts are left out and
        listed in :attr:`rejected`."""
        import pandas as pd

        frames = []
        self.rejected = []
        for p in self.part_files():
            try:
                df = self._read_part(p)
            except Exception as exc:  # any parse failure of a damaged file (pyarrow, csv)
                self.rejected.append((str(p), -1, f"unreadable part file "
                                      f"({type(exc).__name__}: {str(exc)[:200]})"))
                continue
            if "cell" not in df.columns or "status" not in df.columns:
                self.rejected.append((str(p), len(df), "part file without cell/status "
                                      "columns"))
                continue
            ok = np.array([CHECKSUM in df.columns and isinstance(c, str)
                           and c == row_checksum(r)
                           for c, r in zip(df[CHECKSUM] if CHECKSUM in df.columns
                                           else [None] * len(df),
                                           df.to_dict("records"))], bool)
            if not ok.all():
                self.rejected.append((str(p), int((~ok).sum()), "rows with a missing or "
                                      "wrong checksum (edited, forged or truncated)"))
                df = df[ok]
            frames.append(df)
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
        df = self.read().drop(columns=["part", CHECKSUM], errors="ignore")
        new = self.write_part(df.to_dict("records"))
        for p in old:
            p.unlink()
        return new
