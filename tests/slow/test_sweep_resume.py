"""Crash and resume: a sweep killed with SIGKILL midway loses nothing and duplicates nothing.

The sweep runs in its own process group (driver and pool workers); once some part files
exist, the whole group gets SIGKILL. The re-run must skip every cell that had a part file,
run exactly the others, and leave one row per cell.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lpserve.sweep import ResultStore, run_sweep
from tests.unit.sweep._grids import comparable, sim_grid

pytestmark = pytest.mark.slow

GRID = sim_grid(head=150, policies=("vllm", "sarathi"), loads=(1.0, 2.0, 4.0, 8.0),
                replications=5, name="crash")  # 40 cells
N_CELLS = 40
SCRIPT = """
import json, sys
from lpserve.sweep import run_sweep
if __name__ == "__main__":
    run_sweep(json.loads(sys.argv[1]), sys.argv[2], backend="local", workers=2, batch_size=1)
"""


def _parts(out: Path) -> list[Path]:
    d = out / "parts"
    return sorted(d.glob("part-*")) if d.exists() else []


def test_sigkill_midway_then_resume(tmp_path):
    out = tmp_path / "sweep"
    script = tmp_path / "run_sweep.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(GRID), str(out)],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while len(_parts(out)) < 5:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the sweep wrote no parts in 120 s"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # driver and its pool workers
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    store = ResultStore(out)
    before = store.read_raw()
    n_before = len(before)
    assert 5 <= n_before < N_CELLS, f"kill came too late: {n_before} of {N_CELLS} cells done"
    assert before["cell"].is_unique
    owner = dict(zip(before["cell"], zip(before["run_id"], before["part"])))

    report = run_sweep(GRID, out, backend="local", workers=2)
    assert report.n_cells == N_CELLS
    assert report.n_skipped == n_before
    assert report.n_run == N_CELLS - n_before
    assert report.n_failed == 0

    after = ResultStore(out).read_raw()
    assert len(after) == N_CELLS and after["cell"].is_unique  # nothing lost or duplicated
    assert not list((out / "parts").glob(".tmp-*"))
    for cell, run_id, part in zip(after["cell"], after["run_id"], after["part"]):
        if cell in owner:  # finished before the kill: not recomputed
            assert (run_id, part) == owner[cell]
        else:
            assert run_id != before["run_id"].iloc[0]

    # and the resumed sweep holds exactly what an uninterrupted one computes
    clean = run_sweep(GRID, tmp_path / "clean", backend="serial")
    assert comparable(report.table).equals(comparable(clean.table))
