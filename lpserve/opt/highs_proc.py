"""The child process of :func:`lpserve.opt.budget.run_highs`: one HiGHS solve.

Run as ``python lpserve/opt/highs_proc.py REQUEST``; maps the request file written by
:func:`lpserve.opt.budget.write_request` (the model arrays, a start point, seed, options,
the ``time.monotonic()`` deadline and the parent's pid), unlinks it, and writes the
pickled fields of a :class:`~lpserve.opt.budget.HighsRun` on stdout.
HiGHS gets the time left to the deadline. The child dies with its parent (Linux
``PR_SET_PDEATHSIG``, and a watcher thread that sees the parent change elsewhere), so a
killed caller leaves no solver behind.
"""
from __future__ import annotations

import os
import pickle
import sys
import threading
import time


def watch_parent(parent_pid: int, period_s: float = 0.5) -> None:
    """Exit this process when ``parent_pid`` is no longer its parent (the parent died)."""
    try:  # Linux: the kernel kills us with the parent
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(3)

    def loop() -> None:
        while True:
            time.sleep(period_s)
            if os.getppid() != parent_pid:
                os._exit(3)

    threading.Thread(target=loop, name="watch-parent", daemon=True).start()


def main(path: str) -> int:
    """Serve the request in file ``path``; exit code 0 when an answer was written."""
    from dataclasses import asdict

    from lpserve.opt.budget import read_request, set_start
    from lpserve.opt.solution import highs_model, highs_run_of

    request = read_request(path)
    watch_parent(int(request["parent"]))
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    out = os.fdopen(os.dup(1), "wb")
    with open(os.devnull, "w") as null:  # HiGHS prints its banner on fd 1 from C++
        os.dup2(null.fileno(), 1)

    left = max(float(request["deadline_at_s"]) - time.monotonic(), 1e-3)
    h = highs_model(**request["model"], time_limit_s=left, seed=int(request["seed"]),
                    options=request["options"])
    if request["start"] is not None:
        set_start(h, request["start"])
    h.run()
    res = asdict(highs_run_of(h, in_process=False))
    res.pop("in_process")
    out.write(pickle.dumps(res, protocol=pickle.HIGHEST_PROTOCOL))
    out.flush()
    return 0


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # this folder's modules are lpserve.opt's, not top-level ones
    sys.exit(main(sys.argv[1]))
