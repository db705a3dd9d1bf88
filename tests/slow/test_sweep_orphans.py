"""A sweep killed with SIGKILL leaves no process behind; two sweeps on one folder split it.

The driver runs in its own session; once it has written a few part files it gets SIGKILL
(the driver alone, as ``kill -9 PID`` does, and, for the local pool, its whole process
group). Ten seconds later none of the processes it had started may be alive: pool
workers, multiprocessing's resource tracker, Dask nannies and workers, Ray's raylet,
agents and workers. Two sweeps started together on one directory must split the cells
(each runs some, none runs a cell twice) and both end with the whole table.
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

from lpserve.sweep import ResultStore
from lpserve.sweep.reaper import descendants, process_table
from tests.unit.sweep._grids import sim_grid

pytestmark = pytest.mark.slow

GRID = sim_grid(head=150, policies=("vllm", "sarathi"), loads=(1.0, 2.0, 4.0, 8.0),
                replications=5, name="orphans")  # 40 cells
SCRIPT = """
import json, sys
from lpserve.sweep import run_sweep
if __name__ == "__main__":
    r = run_sweep(json.loads(sys.argv[1]), sys.argv[2], backend=sys.argv[3], workers=2,
                  batch_size=1)
    print(json.dumps({"n_run": r.n_run, "n_elsewhere": r.n_elsewhere, "rows": len(r.table)}))
"""


def _start(tmp_path: Path, out: Path, backend: str) -> subprocess.Popen:
    script = tmp_path / "sweep_script.py"
    script.write_text(SCRIPT)
    return subprocess.Popen([sys.executable, str(script), json.dumps(GRID), str(out), backend],
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _parts(out: Path) -> int:
    d = out / "parts"
    return len(list(d.glob("part-*"))) if d.exists() else 0


@pytest.mark.parametrize("backend, group", [("local", False), ("local", True),
                                            ("dask", False), ("ray", False)])
def test_sigkill_leaves_no_orphan(tmp_path, backend, group):
    if backend == "dask":
        pytest.importorskip("distributed")
    if backend == "ray":
        pytest.importorskip("ray")
    out = tmp_path / "sweep"
    proc = _start(tmp_path, out, backend)
    deadline = time.monotonic() + 240
    kids: dict[int, int] = {}
    try:
        while _parts(out) < 2:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the sweep wrote no parts in 240 s"
            time.sleep(0.05)
        kids = descendants(proc.pid)
        assert kids, "the sweep started no processes"
    finally:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    time.sleep(10)
    table = process_table()
    alive = [p for p, start in kids.items() if p in table and table[p][1] == start
             and not _zombie(p)]
    for p in alive:  # leave the machine clean whatever the outcome
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    assert not alive, f"{len(alive)} of {len(kids)} processes outlived the killed sweep " \
        f"by 10 s: {[_cmd(p) for p in alive]}"


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()[:100]
    except OSError:
        return "?"


def test_two_sweeps_on_one_folder_split_the_cells(tmp_path):
    out = tmp_path / "sweep"
    procs = [_start(tmp_path, out, "local") for _ in range(2)]
    reports = []
    for p in procs:
        o, e = p.communicate(timeout=600)
        assert p.returncode == 0, e[-2000:]
        reports.append(json.loads(o.strip().splitlines()[-1]))
    assert all(r["rows"] == 40 for r in reports)           # both end with the whole table
    assert sum(r["n_run"] for r in reports) == 40           # no cell run twice
    assert all(r["n_run"] > 0 for r in reports)             # and the work was shared
    raw = ResultStore(out).read_raw()
    assert len(raw) == 40 and raw["cell"].is_unique
