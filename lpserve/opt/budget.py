"""Time budgets that cover build and solve, and HiGHS runs that end when the budget does.

:class:`Deadline` is one wall-clock budget (``time.monotonic``) shared by a
formulation's ``build`` and ``solve``: pure-Python build steps call
:meth:`Deadline.check` in their loops and raise :class:`TimeLimitReached` (with what they
had found so far) once it has passed. :func:`run_highs` solves a HiGHS model within a
deadline. HiGHS's own ``time_limit`` is not a hard bound: some of its phases (the
feasibility-jump heuristic, the analytic centre of the MIP root, the first simplex
factorization of a large model) do not look at the clock, and were measured running
seconds past the limit. So a model above :data:`IN_PROCESS_NONZEROS` with a deadline runs
in a child process (``python lpserve/opt/highs_proc.py``) that is killed at the
deadline plus a grace of ``5 % + 0.5 s``, and the caller falls back on the incumbent and
bound it had before the solver. Small models and runs without a deadline stay in-process.
"""
from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lpserve.opt.solution import HighsRun, highs_model, highs_run_of

#: models with more constraint-matrix nonzeros than this run in a killable child process
#: when they have a deadline (below it HiGHS ran at most 0.25 s past its limit, measured)
IN_PROCESS_NONZEROS = 50_000
#: seconds the parent waits past the deadline before it kills the child, as a share of
#: the budget plus a constant (the child needs the time to hand back its solution)
GRACE_SHARE, GRACE_S = 0.05, 0.5


class TimeLimitReached(Exception):
    """The budget ran out in a build step; ``stage`` names the step and ``partial`` holds
    what it had found so far (e.g. ``{"incumbent": start rounds}``)."""

    def __init__(self, stage: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(f"time limit reached while {stage}")
        self.stage = stage
        self.partial = dict(partial or {})


class Deadline:
    """A wall-clock budget of ``time_limit_s`` seconds from now (``None``: unlimited).

    ``at_s`` is the ``time.monotonic()`` instant it ends (``inf`` when unlimited), shared
    by processes on one machine.
    """

    def __init__(self, time_limit_s: float | None = None) -> None:
        if time_limit_s is not None and not (
                isinstance(time_limit_s, (int, float)) and not isinstance(time_limit_s, bool)
                and time_limit_s > 0 and math.isfinite(time_limit_s)):
            raise ValueError(f"time_limit_s must be a positive number of seconds or None, "
                             f"got {time_limit_s!r}")
        self.time_limit_s = None if time_limit_s is None else float(time_limit_s)
        self.at_s = math.inf if time_limit_s is None else time.monotonic() + float(time_limit_s)

    @property
    def limited(self) -> bool:
        """True when there is a limit."""
        return self.time_limit_s is not None

    def remaining_s(self) -> float:
        """Seconds left (``inf`` when unlimited; may be negative once past)."""
        return self.at_s - time.monotonic()

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return time.monotonic() >= self.at_s

    def check(self, stage: str, partial: dict[str, Any] | None = None) -> None:
        """Raise :class:`TimeLimitReached` (naming ``stage``, carrying ``partial``) once
        the deadline has passed."""
        if time.monotonic() >= self.at_s:
            raise TimeLimitReached(stage, partial)

    def grace_s(self) -> float:
        """How long past the deadline a killable solver may still hand back its answer."""
        return GRACE_SHARE * (self.time_limit_s or 0.0) + GRACE_S


def as_deadline(deadline: Deadline | None, time_limit_s: float | None) -> Deadline:
    """``deadline`` when given (it then wins over ``time_limit_s``), else a new one."""
    return deadline if deadline is not None else Deadline(time_limit_s)


def run_highs(model: dict[str, Any], *, deadline: Deadline, start: np.ndarray | None = None,
              seed: int = 0, options: dict[str, Any] | None = None,
              in_process: bool | None = None) -> HighsRun:
    """Solve the HiGHS model ``model`` (the keyword arguments of
    :func:`lpserve.opt.solution.highs_model` but ``time_limit_s``/``seed``/``options``)
    within ``deadline``.

    ``start``: a primal starting point, shape (n_col,) (a MIP incumbent). ``in_process``:
    ``None`` chooses (in-process without a limit or below :data:`IN_PROCESS_NONZEROS`),
    ``True``/``False`` forces it. HiGHS gets the time left (at least 1 ms); a child that
    has not answered by ``deadline.at_s + deadline.grace_s()`` is killed and the run
    reports ``killed=True``.
    """
    nnz = int(np.asarray(model["a_index"]).size) + int(np.asarray(model["col_cost"]).size)
    if in_process is None:
        in_process = not deadline.limited or nnz <= IN_PROCESS_NONZEROS
    if in_process:
        return _run_here(model, deadline, start, seed, options)
    return _run_child(model, deadline, start, seed, options)


def _time_left(deadline: Deadline) -> float | None:
    if not deadline.limited:
        return None
    return max(deadline.remaining_s(), 1e-3)


def _run_here(model: dict[str, Any], deadline: Deadline, start: np.ndarray | None, seed: int,
              options: dict[str, Any] | None) -> HighsRun:
    h = highs_model(**model, time_limit_s=_time_left(deadline), seed=seed, options=options)
    if start is not None:
        set_start(h, start)
    h.run()
    return highs_run_of(h)


def set_start(h: Any, x: np.ndarray) -> None:
    """Give ``h`` the primal point ``x`` (shape (n_col,)) as a starting solution."""
    import highspy

    sol = highspy.HighsSolution()
    sol.col_value = np.asarray(x, np.float64).tolist()
    sol.value_valid = True
    h.setSolution(sol)


def _child_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "")
                                                  .split(os.pathsep) if p])
    return env


def write_request(path: str, request: dict[str, Any]) -> None:
    """Write ``request`` to ``path`` as a pickle (protocol 5) whose numpy buffers follow it
    out of band, so the arrays are written from their own memory, not copied first."""
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(request, protocol=5, buffer_callback=bufs.append)
    with open(path, "wb") as f:
        views = [b.raw() for b in bufs]
        f.write(np.asarray([len(head), len(views)] + [v.nbytes for v in views],
                           np.int64).tobytes())
        f.write(head)
        for v in views:
            f.write(v)


def read_request(path: str) -> dict[str, Any]:
    """Read what :func:`write_request` wrote, mapping the arrays from the file (the file
    may be unlinked right after)."""
    import mmap

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n_head, n_buf = (int(x) for x in np.frombuffer(mm, np.int64, 2))
    sizes = np.frombuffer(mm, np.int64, n_buf, 16).tolist()
    pos = 16 + 8 * n_buf
    head = mm[pos:pos + n_head]
    pos += n_head
    bufs = []
    for size in sizes:
        bufs.append(memoryview(mm)[pos:pos + size])
        pos += size
    return pickle.loads(head, buffers=bufs)


def _run_child(model: dict[str, Any], deadline: Deadline, start: np.ndarray | None, seed: int,
               options: dict[str, Any] | None) -> HighsRun:
    import tempfile

    fd, path = tempfile.mkstemp(prefix="lpserve-highs-", suffix=".bin",
                                dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.close(fd)
    try:
        write_request(path, {"model": model, "start": start, "seed": seed,
                             "options": options or {}, "deadline_at_s": deadline.at_s,
                             "parent": os.getpid()})
        script = Path(__file__).with_name("highs_proc.py")
        proc = subprocess.Popen([sys.executable, str(script), path], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_child_env())
        wait_s = max(deadline.remaining_s() + deadline.grace_s(), 0.05)
        try:
            out, err = proc.communicate(timeout=wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return HighsRun("killed", f"stopped at the time limit ({deadline.time_limit_s:g} "
                            "s) before HiGHS handed back a solution", killed=True,
                            in_process=False)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if proc.returncode != 0 or not out:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        return HighsRun("error", f"HiGHS child process failed (exit code {proc.returncode}): "
                        + " | ".join(tail), in_process=False)
    return HighsRun(**pickle.loads(out), in_process=False)
