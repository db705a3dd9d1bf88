"""Processes a sweep starts die with it, even when it is killed with SIGKILL.

A killed driver runs no clean-up code, so its process-pool workers, multiprocessing's
resource tracker and Ray's agents (measured alive more than 10 s after the driver) would
outlive it. Two guards:

* :func:`watch_parent` -- a thread in each local pool worker that exits the worker once
  its parent is gone (it is reparented);
* :class:`Reaper` -- a small watchdog process (this file, run as a script: standard
  library only, in its own session so that a kill of the driver's process group spares it)
  to which the driver reports its descendants every :data:`REPORT_S` seconds, as
  ``(pid, start time)`` pairs read from ``/proc``. When the driver's pipe closes without
  the word ``done`` (the driver died), the reaper kills every reported process that is
  still the same process (same start time) and their descendants, then exits.

Linux only (``/proc``); elsewhere :meth:`Reaper.start` returns a reaper that does nothing.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

REPORT_S = 0.5
#: seconds a worker's watcher sleeps between two looks at its parent
WATCH_S = 0.5


def watch_parent(parent_pid: int | None = None, period_s: float = WATCH_S) -> None:
    """Exit this process (``os._exit(3)``) once ``parent_pid`` (default: the current
    parent) is no longer its parent, checked every ``period_s`` by a daemon thread."""
    parent = os.getppid() if parent_pid is None else int(parent_pid)

    def loop() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(period_s)

    threading.Thread(target=loop, name="lpserve-watch-parent", daemon=True).start()


def process_table() -> dict[int, tuple[int, int]]:
    """``pid -> (parent pid, start time in clock ticks)`` of every process in ``/proc``."""
    out: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for d in names:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(d)] = (int(fields[1]), int(fields[19]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(root: int, table: dict[int, tuple[int, int]] | None = None
                ) -> dict[int, int]:
    """``pid -> start time`` of every live descendant of ``root``."""
    table = process_table() if table is None else table
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out: dict[int, int] = {}
    stack = list(kids.get(root, []))
    while stack:
        p = stack.pop()
        if p in out or p not in table:
            continue
        out[p] = table[p][1]
        stack.extend(kids.get(p, []))
    return out


class Reaper:
    """The driver's side of the watchdog (see the module docstring).

    ``Reaper.start()`` launches the watchdog and a daemon thread that reports this
    process's descendants to it; :meth:`stop` (normal end) tells it to exit without
    killing anything. Usable as a context manager.
    """

    def __init__(self, proc: subprocess.Popen | None) -> None:
        self.proc = proc
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls) -> "Reaper":
        """A running reaper (a no-op one where ``/proc`` is missing)."""
        if not os.path.isdir("/proc/self"):
            return cls(None)
        env = dict(os.environ)
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        r = cls(proc)
        r._thread = threading.Thread(target=r._report_loop, name="lpserve-reaper-report",
                                     daemon=True)
        r._thread.start()
        return r

    def report(self) -> None:
        """Send the current descendants (all but the reaper itself) now."""
        if self.proc is None or self.proc.stdin is None:
            return
        kids = descendants(os.getpid())
        kids.pop(self.proc.pid, None)
        line = json.dumps(sorted(kids.items())) + "\n"
        with self._lock:
            if self.proc.stdin.closed:
                return
            try:
                self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass

    def _report_loop(self) -> None:
        while not self._stop.wait(REPORT_S):
            self.report()

    def stop(self) -> None:
        """Normal end: the reaper exits and kills nothing."""
        self._stop.set()
        if self.proc is None:
            return
        with self._lock:
            try:
                if self.proc.stdin is not None and not self.proc.stdin.closed:
                    self.proc.stdin.write(b"done\n")
                    self.proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Reaper":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kill_all(known: dict[int, int], rounds: int = 3) -> int:
    """SIGKILL every process of ``known`` (pid -> start time) that is still the same
    process, and all descendants of those; repeated ``rounds`` times (children spawned
    meanwhile). Returns how many kills were sent."""
    sent = 0
    for _ in range(rounds):
        table = process_table()
        targets: dict[int, int] = {}
        for pid, start in known.items():
            if pid in table and table[pid][1] == start:
                targets[pid] = start
                targets.update(descendants(pid, table))
        if not targets:
            break
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
                sent += 1
            except OSError:
                pass
        known = {**known, **targets}
        time.sleep(0.2)
    return sent


def main(driver_pid: int) -> int:
    """The watchdog: follow the driver's reports on stdin; kill them when it dies."""
    known: dict[int, int] = {}
    for line in sys.stdin.buffer:
        text = line.decode(errors="replace").strip()
        if text == "done":
            return 0
        try:  # every process ever reported (one that left the tree is still ours)
            known.update({int(p): int(s) for p, s in json.loads(text)})
        except (ValueError, TypeError):
            continue
    kill_all(known)  # the pipe closed without "done": the driver is gone
    return 0


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    sys.exit(main(int(sys.argv[1])))
