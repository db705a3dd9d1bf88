"""Claim files: sweeps that share one directory split its cells instead of each running all.

Before a batch is handed to a backend, the driver claims each of its cells by creating
``OUT/claims/<cell>.claim`` with ``O_CREAT | O_EXCL`` (atomic on POSIX and on NFSv3+), a
small JSON record of the claiming run (``run_id``, host, pid, the pid's start time). A
cell already claimed by a live run is left to it. A run is live while its lease file
``OUT/claims/run-<run_id>.lease`` is touched (every :data:`HEARTBEAT_S` seconds by a
daemon thread) and, on the same host, while its pid is the same process; a claim of a
dead run (killed, crashed, machine gone for :data:`LEASE_S`) is stale and is taken over
by renaming it away first (two runs that both judge one claim stale at the same instant
may both run the cell: wasted work, but the store keeps one row per cell). Claim files
stay after a run stops (its lease goes, so they read as stale): a later run that meets a
stale claim checks the store before taking it over, so a stored cell is not run again.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterable

HEARTBEAT_S = 2.0
#: a run whose lease was not touched for this long is dead (seconds)
LEASE_S = 30.0


def _pid_start(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start is None or _pid_start(pid) in (None, start)


class Claims:
    """The claims of one run (``run_id``) in sweep directory ``out_dir``."""

    def __init__(self, out_dir: str | os.PathLike, run_id: str) -> None:
        self.dir = Path(out_dir) / "claims"
        self.run_id = run_id
        self.me = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                   "pid_start": _pid_start(os.getpid())}
        self.mine: set[str] = set()
        self.stale_taken: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lease(self) -> Path:
        """This run's lease file."""
        return self.dir / f"run-{self.run_id}.lease"

    # ------------------------------------------------------------------ lifetime
    def start(self) -> "Claims":
        """Create the folder and the lease; start the heartbeat."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lease.write_text(json.dumps(self.me))
        self._thread = threading.Thread(target=self._beat, name="lpserve-claims", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.lease)
            except OSError:
                pass

    def stop(self) -> None:
        """Stop the heartbeat and remove the lease: this run's claims become stale."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_S + 1)
        self.lease.unlink(missing_ok=True)

    def __enter__(self) -> "Claims":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ claims
    def _path(self, cell: str) -> Path:
        return self.dir / f"{cell}.claim"

    def owner(self, cell: str) -> dict | None:
        """The record of the run holding ``cell`` (None when unclaimed or unreadable)."""
        try:
            return json.loads(self._path(cell).read_text())
        except (OSError, ValueError):
            return None

    def live(self, rec: dict | None) -> bool:
        """Whether the run of claim record ``rec`` is alive (see the module docstring)."""
        if not rec:
            return False
        if rec.get("run_id") == self.run_id:
            return True
        lease = self.dir / f"run-{rec.get('run_id')}.lease"
        try:
            age = time.time() - lease.stat().st_mtime
        except OSError:
            return False
        if age > LEASE_S:
            return False
        if rec.get("host") == self.me["host"]:
            return _alive(int(rec.get("pid", -1)), rec.get("pid_start"))
        return True

    def take(self, cells: Iterable[str]) -> list[str]:
        """Claim what can be claimed of ``cells`` (free or stale); returns those, in order."""
        got = []
        body = json.dumps(self.me).encode()
        for c in cells:
            if c in self.mine:
                got.append(c)
                continue
            p = self._path(c)
            stale = False
            for _ in range(2):
                try:
                    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    rec = self.owner(c)
                    if rec is None and p.exists() and time.time() - p.stat().st_mtime < 2.0:
                        break  # being written right now by its owner
                    if self.live(rec):
                        break
                    try:  # stale: move it away; only one run succeeds
                        os.replace(p, self.dir / f".stale-{c}-{self.run_id}")
                        (self.dir / f".stale-{c}-{self.run_id}").unlink(missing_ok=True)
                    except FileNotFoundError:
                        pass
                    stale = True
                    continue
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                self.mine.add(c)
                if stale:
                    self.stale_taken.add(c)
                got.append(c)
                break
        return got

    def took_over(self, cell: str) -> bool:
        """Whether this run's claim of ``cell`` replaced a stale one (the cell may have
        been stored by the run that died or stopped)."""
        return cell in self.stale_taken

    def held_elsewhere(self, cells: Iterable[str]) -> list[str]:
        """Those of ``cells`` claimed by another live run."""
        out = []
        for c in cells:
            if c in self.mine:
                continue
            rec = self.owner(c)
            if rec is not None and self.live(rec):
                out.append(c)
        return out

    def release(self, cells: Iterable[str]) -> None:
        """Remove this run's claims of ``cells``."""
        for c in cells:
            if c in self.mine:
                rec = self.owner(c)
                if rec is None or rec.get("run_id") == self.run_id:
                    self._path(c).unlink(missing_ok=True)
                self.mine.discard(c)
