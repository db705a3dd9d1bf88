"""Integrity of the sweep store: per-row checksums, damaged parts, unusable directories,
and claim files that let concurrent sweeps on one directory split the cells.

Regressions for: a forged row (``status=ok``, NaN metrics, empty digest) counting as a
finished cell; a garbage CSV part failing the whole read with "Error tokenizing data";
``parts/`` as a file or a read-only folder giving FileExistsError / PermissionError
tracebacks; two sweeps on one folder both running every cell.
"""
from __future__ import annotations

import json
import os
from unittest import mock

import numpy as np
import pytest

from lpserve.sweep import ResultStore, StoreError, run_sweep
from lpserve.sweep.claims import Claims
from lpserve.sweep.store import have_pyarrow, row_checksum
from tests.unit.sweep._grids import stats_grid


def _row(cell: str, x: float = 1.0) -> dict:
    return {"cell": cell, "status": "ok", "error": "", "result_digest": f"d-{cell}", "x": x,
            "n": 3, "name": "12e45", "none": None, "nan": float("nan")}


@pytest.fixture(params=["parquet", "csv"])
def store(request, tmp_path):
    if request.param == "parquet" and not have_pyarrow():
        pytest.skip("pyarrow is not installed (Parquet parts fall back to CSV)")
    return ResultStore(tmp_path / "sweep", format=request.param)


def test_checksums_survive_the_round_trip(store):
    store.write_part([_row("a"), _row("b", 2.5)])
    assert store.finished() == {"a", "b"} and store.rejected == []
    raw = store.read_raw()
    assert all(c == row_checksum(r) for c, r in zip(raw["checksum"], raw.to_dict("records")))


def test_a_forged_row_is_not_a_finished_cell(store, tmp_path):
    import pandas as pd

    store.write_part([_row("a")])
    forged = store.parts_dir / f"part-99999999999999999999-1-00001.{store.format}"
    df = pd.DataFrame([{"cell": "b", "status": "ok", "error": "", "result_digest": "",
                        "x": np.nan, "run_id": "x", "part": "p"}])
    df.to_parquet(forged) if store.format == "parquet" else df.to_csv(forged, index=False)
    assert store.finished() == {"a"}
    assert store.rejected and store.rejected[0][0] == str(forged) and \
        "checksum" in store.rejected[0][2]
    # an edited value breaks the checksum too
    raw = store.read_raw()
    raw.loc[0, "x"] = 7.0
    edited = store.parts_dir / f"part-99999999999999999998-1-00001.{store.format}"
    raw.to_parquet(edited) if store.format == "parquet" else raw.to_csv(edited, index=False)
    assert len(store.read_raw()) == 1 and len(store.rejected) == 2


def test_truncated_and_garbage_parts_are_reported_not_raised(tmp_path):
    store = ResultStore(tmp_path / "s", format="csv")
    p = store.write_part([_row("a"), _row("b")])
    text = p.read_text()
    p.write_text(text[: len(text) - 40])          # the last row cut short
    (store.parts_dir / "part-99999999999999999999-1-00001.csv").write_bytes(
        b'"unclosed,\x00\x01garbage\n1,2,3,4,5\n')
    assert store.finished() == {"a"}
    reasons = " | ".join(f"{f}: {r}" for f, _, r in store.rejected)
    assert "checksum" in reasons and "part-99999999999999999999" in reasons


def test_unreadable_parquet_part_names_the_file(tmp_path):
    if not have_pyarrow():
        pytest.skip("pyarrow is not installed")
    store = ResultStore(tmp_path / "s", format="parquet")
    p = store.write_part([_row("a")])
    p.write_bytes(p.read_bytes()[:50])
    assert store.finished() == set()
    assert store.rejected[0][0] == str(p) and "unreadable part file" in store.rejected[0][2]


def test_parts_as_a_file_or_an_unwritable_folder_is_a_clear_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "parts").write_text("in the way")
    with pytest.raises(StoreError, match=r"a/parts exists and is not a folder"):
        ResultStore(tmp_path / "a")
    (tmp_path / "b").write_text("a file")
    with pytest.raises(StoreError, match=r"/b exists and is not a folder"):
        ResultStore(tmp_path / "b")
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o500)
        ctx = mock.patch.object(os, "getpid", os.getpid)  # nothing to patch
    else:  # root writes anywhere: make the write itself fail as it would for a user
        ctx = mock.patch("pathlib.Path.write_bytes",
                         side_effect=PermissionError(13, "Permission denied"))
    with ctx, pytest.raises(StoreError, match=r"cannot create or write .*ro/parts"):
        ResultStore(ro)


def test_claims_split_cells_and_stale_claims_are_taken_over(tmp_path):
    a, b = Claims(tmp_path, "run-a").start(), Claims(tmp_path, "run-b").start()
    try:
        assert a.take(["c1", "c2"]) == ["c1", "c2"]
        assert b.take(["c1", "c2", "c3"]) == ["c3"]
        assert b.held_elsewhere(["c1", "c2", "c3"]) == ["c1", "c2"]
        # a dead run (on this host: its pid is gone) leaves stale claims
        dead = json.loads((tmp_path / "claims" / "c1.claim").read_text())
        dead.update(run_id="run-dead", pid=2 ** 22 + 12345, pid_start=1)
        (tmp_path / "claims" / "c1.claim").write_text(json.dumps(dead))
        (tmp_path / "claims" / "run-run-dead.lease").write_text("{}")
        assert b.take(["c1"]) == ["c1"] and b.took_over("c1")
    finally:
        a.stop()
        b.stop()
    c = Claims(tmp_path, "run-c").start()
    try:  # the stopped runs' claims are stale now
        assert c.take(["c2", "c3"]) == ["c2", "c3"]
    finally:
        c.stop()


def test_a_forged_row_is_recomputed_by_the_next_run(tmp_path):
    import pandas as pd

    g = stats_grid(loads=(0.5, 1.0), replications=1)
    first = run_sweep(g, tmp_path / "s", backend="serial")
    store = ResultStore(tmp_path / "s")
    raw = store.read_raw()
    victim = raw["cell"].iloc[0]
    for p in store.part_files():  # forge: the cell's row now carries NaN metrics
        df = store._read_part(p)
        df.loc[df["cell"] == victim, "n_requests"] = np.nan
        df.to_parquet(p) if p.suffix == ".parquet" else df.to_csv(p, index=False)
    again = run_sweep(g, tmp_path / "s", backend="serial")
    assert again.n_run == 1 and again.n_skipped == first.n_cells - 1
    assert again.rejected and "checksum" in again.rejected[0][2]
    assert set(again.table["cell"]) == set(first.table["cell"])
    assert pd.Series(again.table["n_requests"]).notna().all()
