"""Program-level schedulers for agentic workloads: Autellix PLAS and ATLAS, and a
two-level PLAS × MLFQ.

A program is the set of calls sharing ``program_id`` (a trace without program ids makes
every request its own program). Service is measured in seconds of running time: the time between two
decisions on a replica is credited to the candidates running at the second one.

* **PLAS** (program-level attained service): a new call inherits its program's attained
  service so far.
* **ATLAS** (critical path): a program keeps one scalar, the longest (inherited + own
  service) over its finished calls; a new call inherits it, so parallel siblings share a
  priority. On a chain it equals PLAS.

Autellix's discretized queues (Algorithm 1): queue ``k`` holds priorities
``[base (2^k - 1), base (2^(k+1) - 1))`` and has quantum ``base 2^k``; a call enters the
queue that holds its inherited priority, runs FCFS within it and drops one queue when its
service there reaches the quantum. Anti-starvation: a call whose (program + call) waiting
over (program + call) service reaches ``beta`` goes to queue 0 and its own counters reset.

**PLAS × MLFQ** (``two_level=True``): the program's level (queue of its total attained
service) orders first, and within a program level the call's own MLFQ level (entered at
0, demoted by quanta) orders second.

:func:`program_toy` runs any scheduler on Autellix's toy model (unit decode steps, fixed
batch size, a program's next call issued when its previous call finishes).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from lpserve.arrays import readonly
from lpserve.policies.schedulers import TickCached
from lpserve.policy import Claim, Meta, Scheduler, SchedulerView

_SCALE = 1.0e7


def queue_of(priority_s: float, base_s: float) -> int:
    """Queue ``k`` with ``base (2^k - 1) <= priority < base (2^(k+1) - 1)``."""
    return int(math.floor(math.log2(priority_s / base_s + 1.0) + 1e-12))


class ProgramScheduler(TickCached):
    """PLAS / ATLAS / PLAS × MLFQ (see the module docstring).

    Args:
        mode: ``"plas"`` or ``"atlas"``.
        base_quantum_s: quantum of queue 0 (s); also the queue boundaries' unit.
        beta: anti-starvation ratio (waiting / service); ``None`` disables it.
        two_level: program level first, then the call's own MLFQ level.
    """

    meta = Meta(claims=(Claim(
        "with single-call programs PLAS is request-level MLFQ; a call never enters a queue "
        "above its program's attained-service queue except by anti-starvation",
        "proofs/sched-plas-atlas.md",
        "tests/unit/policies/test_schedulers.py::test_plas_single_call_programs_equal_mlfq"),))

    def __init__(self, mode: str = "plas", base_quantum_s: float = 0.05,
                 beta: float | None = None, two_level: bool = False) -> None:
        if mode not in ("plas", "atlas"):
            raise ValueError(f"program scheduler: mode must be 'plas' or 'atlas', got {mode!r}")
        if not base_quantum_s > 0:
            raise ValueError(f"program scheduler: base_quantum_s must be > 0, got "
                             f"{base_quantum_s!r}")
        if beta is not None and not beta > 0:
            raise ValueError(f"program scheduler: beta must be > 0 or None, got {beta!r}")
        self.mode, self.base = mode, float(base_quantum_s)
        self.quantum_s = self.base
        self.beta = beta
        self.two_level = bool(two_level)
        self.name = ("plas-mlfq" if two_level else mode)
        self._reset_state()

    def _reset_state(self) -> None:
        self._call: dict[int, list[float]] = {}
        self._prog: dict[Any, list[float]] = {}   # [service, critical path, wait, serv.]
        self._seen: dict[int, set[int]] = {}
        self._last: dict[int, float] = {}
        self._pid: dict[int, Any] = {}

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget the service, critical path and waiting time recorded per call and per
        program."""
        super().reset(cluster, rng)
        self._reset_state()

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        return "program", [self.quantum_s, self.base, -1.0 if self.beta is None else self.beta], \
            [int(self.mode == "atlas"), int(self.two_level)]

    def _finish(self, i: int) -> None:
        c = self._call.pop(i, None)
        if c is None:
            return
        p = self._prog[self._pid.pop(i)]
        p[1] = max(p[1], c[6] + c[7])
        p[2] += c[4]
        p[3] += c[5]

    def _rank(self, view: SchedulerView) -> np.ndarray:
        now, rep = view.now_s, view.replica
        dt = max(now - self._last.get(rep, now), 0.0)
        self._last[rep] = now
        req = view.request.tolist()
        cur = set(req)
        for gone in sorted(self._seen.get(rep, set()) - cur):  # in request order
            self._finish(gone)
        self._seen[rep] = cur
        run = view.running.tolist()
        pids = view.program_id.tolist() if view.program_id is not None else None
        out = np.empty(len(req), np.float64)
        for k, i in enumerate(req):
            pid = ("r", i) if pids is None or pids[k] < 0 else pids[k]
            prog = self._prog.setdefault(pid, [0.0, 0.0, 0.0, 0.0])
            c = self._call.get(i)
            if c is None:
                # [queue, used in queue, entered, (unused), wait, service, inherited,
                #  total own service]
                inh = prog[0] if self.mode == "plas" else prog[1]
                q = 0 if self.two_level else queue_of(inh, self.base)
                c = self._call[i] = [q, 0.0, float(view.arrival_s[k]), 0.0, 0.0, 0.0, inh,
                                     0.0]
                self._pid[i] = pid
            if run[k]:  # running now = admitted at or before the previous decision
                c[1] += dt
                c[5] += dt
                c[7] += dt
                prog[0] += dt
                while c[1] >= self.base * 2 ** c[0] - 1e-12:
                    c[1] = 0.0
                    c[0] += 1
                    c[2] = now
            else:
                c[4] += dt
            if self.beta is not None and c[0] > 0:
                w, s = prog[2] + c[4], prog[3] + c[5]
                if w >= self.beta * max(s, self.base):
                    c[0], c[1], c[2], c[4], c[5] = 0, 0.0, now, 0.0, 0.0
            level = c[0]
            if self.two_level:
                level = min(queue_of(prog[0], self.base), 63) * 64 + min(c[0], 63)
            out[k] = level * _SCALE + c[2]
        return out


# ============================================================================ toy model
def program_toy(scheduler: Scheduler, programs: Sequence[Sequence[int]],
                batch: int = 2) -> dict[str, Any]:
    """Autellix's toy model: every program starts at 0 with its first call; call ``j`` of
    a program needs ``programs[p][j]`` unit decode steps and is issued when call ``j - 1``
    finishes. Each step the ``batch`` best-ranked issued calls (ties by program order,
    then call order) advance one step. Returns ``total_wait`` (sum over calls of first
    start minus issue time), ``makespan`` and per-program ``finish`` times."""
    calls = [(p, j, int(d)) for p, prog in enumerate(programs) for j, d in enumerate(prog)]
    n = len(calls)
    idx = {(p, j): k for k, (p, j, _) in enumerate(calls)}
    need = np.array([d for *_, d in calls], np.int64)
    pid = np.array([p for p, _, _ in calls], np.int64)
    parent = np.array([idx.get((p, j - 1), -1) for p, j, _ in calls], np.int64)
    issue = np.where(parent < 0, 0.0, np.nan)
    start = np.full(n, np.nan)
    done = np.full(n, np.nan)
    gen = np.zeros(n, np.int64)
    running = np.zeros(n, bool)
    scheduler.reset(None, np.random.default_rng(0))
    t = 0.0
    while np.isnan(done).any():
        alive = np.flatnonzero(np.isnan(done) & ~np.isnan(issue) & (issue <= t))
        r = np.asarray(scheduler.rank(_view(t, alive, issue, need, gen, running, start,
                                            pid, parent)), np.float64)
        ok = np.flatnonzero(np.isfinite(r))
        pick = alive[ok[np.lexsort((alive[ok], r[ok]))][:batch]]
        running[:] = False
        running[pick] = True
        start[pick] = np.where(np.isnan(start[pick]), t, start[pick])
        t += 1.0
        gen[pick] += 1
        for k in pick[gen[pick] >= need[pick]].tolist():
            done[k] = t
            running[k] = False
            nxt = np.flatnonzero(parent == k)
            issue[nxt] = t
    finish = [float(done[pid == p].max()) for p in range(len(programs))]
    return {"total_wait": float(np.sum(start - issue)), "makespan": float(done.max()),
            "finish": finish}


def _view(t, alive, issue, need, gen, running, start, pid, parent) -> SchedulerView:
    m = alive.size
    return SchedulerView(
        now_s=t, replica=0, request=readonly(alive.astype(np.int64)), arrival_s=readonly(issue[alive]),
        prompt_tokens=readonly(np.ones(m, np.int64)), generated_tokens=readonly(gen[alive]),
        computed_tokens=readonly(gen[alive]), cached_tokens=readonly(np.zeros(m, np.int64)),
        running=readonly(running[alive]), swapped=readonly(np.zeros(m, bool)),
        preemptions=readonly(np.zeros(m, np.int64)), first_scheduled_s=readonly(start[alive]),
        tenant=readonly(np.full(m, -1, np.int64)), session_id=readonly(np.full(m, -1, np.int64)),
        predicted_lo=None, predicted_hi=None, output_tokens=None,
        free_blocks=1 << 30, total_blocks=1 << 30, block_tokens=1,
        program_id=readonly(pid[alive]), parent=readonly(parent[alive]))
