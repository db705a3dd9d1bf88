"""The result store: atomic part files, merge on read, one row per cell."""
from __future__ import annotations

import pytest

from lpserve.sweep import ResultStore
from lpserve.sweep.store import have_pyarrow


def _row(cell: str, status: str = "ok", x: float = 1.0) -> dict:
    return {"cell": cell, "status": status, "error": "" if status == "ok" else "boom",
            "result_digest": f"d-{cell}-{x}" if status == "ok" else "", "x": x}


@pytest.fixture(params=["parquet", "csv"])
def store(request, tmp_path):
    if request.param == "parquet" and not have_pyarrow():
        pytest.skip("pyarrow is not installed (Parquet parts fall back to CSV)")
    return ResultStore(tmp_path / "sweep", format=request.param)


def test_parts_merge_into_one_row_per_cell(store):
    store.write_part([_row("a"), _row("b", "error")])
    store.write_part([_row("c")])
    store.write_part([_row("b", "ok", 2.0)])  # a retried failure
    assert len(store.part_files()) == 3
    df = store.read()
    assert sorted(df["cell"]) == ["a", "b", "c"]
    assert df.set_index("cell").loc["b", "status"] == "ok"
    assert df.set_index("cell").loc["b", "x"] == 2.0
    assert store.finished() == {"a", "b", "c"}
    assert len(store.read_raw()) == 4


def test_ok_row_wins_over_a_later_error_row(store):
    store.write_part([_row("a", "ok", 1.0)])
    store.write_part([_row("a", "error")])
    df = store.read()
    assert len(df) == 1 and df["status"].iloc[0] == "ok"


def test_error_rows_are_recorded_not_finished(store):
    store.write_part([_row("a", "error")])
    assert store.finished() == set()
    assert store.recorded() == {"a"}
    assert store.read()["error"].iloc[0] == "boom"


def test_temporary_files_are_ignored_and_cleaned(store):
    store.write_part([_row("a")])
    junk = store.parts_dir / f".tmp-part-0-0-00001.{store.format}"
    junk.write_bytes(b"half a file")
    assert list(store.read()["cell"]) == ["a"]
    assert store.clean_tmp() == 1 and not junk.exists()


def test_filter_by_cells_and_empty_store(store):
    assert store.read().empty and store.finished() == set()
    store.write_part([_row("a"), _row("b")])
    assert list(store.read(["b", "zzz"])["cell"]) == ["b"]


def test_compact_keeps_rows_and_run_ids(store):
    store.write_part([_row("a"), _row("b", "error")])
    other = ResultStore(store.out_dir, format=store.format)
    other.write_part([_row("b"), _row("c")])
    before = store.read().set_index("cell")
    store.compact()
    assert len(store.part_files()) == 1
    after = store.read().set_index("cell")
    assert sorted(after.index) == ["a", "b", "c"]
    assert (after["run_id"] == before["run_id"]).all()
    assert after.loc["b", "run_id"] == other.run_id


@pytest.mark.parametrize("run_id", ["123456789012", "12e456789012", "0000000000ab"])
def test_run_ids_read_back_as_written(store, run_id):
    """Hex run ids that look like numbers stay strings (CSV parts used to read them back
    as int or float, so the ids of two parts stopped comparing equal)."""
    store.run_id = run_id
    store.write_part([_row("a")])
    assert store.read()["run_id"].tolist() == [run_id]


def test_manifest_roundtrip(store):
    store.write_manifest({"n_cells": 3, "grid": {"name": "x"}})
    assert store.read_manifest() == {"n_cells": 3, "grid": {"name": "x"}}


def test_bad_format_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="format.*'xlsx'"):
        ResultStore(tmp_path, format="xlsx")
