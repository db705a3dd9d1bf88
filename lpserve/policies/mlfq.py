"""Multi-level feedback queues: naive MLFQ and FastServe's skip-join MLFQ.

Queue ``k`` has quantum ``base_quantum_s * 2**k``. A request enters queue 0 (naive), the
first queue whose quantum covers its prefill time (skip-join, FastServe), or the first
whose quantum covers its predicted total service (``entry="predicted"``). Service in the
current queue accumulates while the request runs (the time between two decisions is
credited to the requests running at the second, i.e. admitted by the first); once it reaches the quantum
(``demote_on=">="``) or exceeds it (``">"``, FastServe's code) the request moves to the
back of the next queue. Within a queue requests run in the order they entered it (a
running request stays at the front). A request not served for ``starvation_s`` returns to
the back of queue 0, checked once per ``starvation_period_s`` (FastServe: every 1000
iterations); ``adaptive_starvation=True`` scales the threshold by the load (the number of
candidates per running request), so promotions stay rare when the queue is long.

Proactive KV swapping is delegated to the engine: the factories in
:mod:`lpserve.registry` pair MLFQ with ``priority_preemption`` and ``preemption="swap"``,
so lower-priority running requests are swapped to host memory when better-ranked ones
need their place; by default (``EngineConfig.transfers="serial"``) a swap is priced in
the next iteration, and ``fastserve`` / ``fastserve-adaptive`` run the copies on the
replica's host link, overlapping compute (``transfers="overlap"``), with FastServe's
proactive swapping (``proactive_swap``: victims keep their KV on the GPU until the
free-block target needs it; ``models/simulator.md`` (26)-(32)).
``preemption="compress-swap"`` or a ``preemption_decider`` quantizes the swapped KV first
(models/kv-compression-swap.md; ``benchmarks/swap_tipping_point.py`` finds the PCIe
bandwidth below which this swapping loses to recompute).

:func:`iteration_toy` runs any scheduler on FastServe's toy model (batch size 1, the first
iteration of job ``j`` takes ``first_iter_s[j]``, later ones 1 s).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from lpserve.arrays import readonly
from lpserve.policies.schedulers import TickCached
from lpserve.policy import Claim, Meta, Scheduler, SchedulerView, tick_index

_LEVEL_SCALE = 1.0e7  # rank = level * scale + time entered the level (s); < 115 days


def entry_level(service_s: float, base_quantum_s: float) -> int:
    """Smallest ``k`` with ``base * 2**k >= service_s`` (FastServe's skip-join queue)."""
    if service_s <= base_quantum_s:
        return 0
    return int(math.ceil(math.log2(service_s / base_quantum_s) - 1e-12))


class MLFQ(TickCached):
    """MLFQ over requests (see the module docstring).

    Args:
        entry: ``"first"`` (naive MLFQ), ``"prefill"`` (skip-join) or ``"predicted"``
            (skip-join on prefill + predicted decode time).
        base_quantum_s: quantum of queue 0; ``None`` (default) takes one decode
            iteration of the cluster's cost model. FastServe's code uses 10 ms, untuned and
            meant for smaller models: far below one iteration of a large model, it demotes
            a running request on every decision and swaps constantly.
        starvation_s: promotion threshold (s) without service; ``None`` disables it.
        adaptive_starvation: scale the threshold by candidates / running.
        starvation_period_s: time between starvation checks; ``None`` means 1000 decode
            iterations (FastServe's code).
        demote_on: ``">="`` or ``">"`` (see module docstring).
        prefill_s_per_token, decode_iteration_s: service estimates; ``None`` takes them
            from the cluster's cost model at ``reset``.
        default_tokens: predicted output when the view has no predictions.
    """

    meta = Meta(claims=(Claim(
        "skip-join MLFQ with strict demotion never demotes a request right after its "
        "prefill, and demotes no more often than naive MLFQ on FastServe's toy model",
        "proofs/sched-mlfq-skip-join.md",
        "tests/unit/policies/test_schedulers.py::test_fastserve_toy_instances"),))

    def __init__(self, entry: str = "prefill", base_quantum_s: float | None = None,
                 starvation_s: float | None = 3.0, adaptive_starvation: bool = False,
                 demote_on: str = ">", prefill_s_per_token: float | None = None,
                 decode_iteration_s: float | None = None, default_tokens: int = 256,
                 starvation_period_s: float | None = None) -> None:
        if entry not in ("first", "prefill", "predicted"):
            raise ValueError(f"mlfq: entry must be 'first', 'prefill' or 'predicted', got "
                             f"{entry!r}")
        if demote_on not in (">=", ">"):
            raise ValueError(f"mlfq: demote_on must be '>=' or '>', got {demote_on!r}")
        if base_quantum_s is not None and not base_quantum_s > 0:
            raise ValueError(f"mlfq: base_quantum_s must be > 0 or None, got "
                             f"{base_quantum_s!r}")
        if starvation_s is not None and not starvation_s > 0:
            raise ValueError(f"mlfq: starvation_s must be > 0 or None, got {starvation_s!r}")
        self.entry, self.base_quantum_s = entry, base_quantum_s
        self.reads_predictions = entry == "predicted"
        # the engine re-ranks every quantum_s; level quanta are multiples of self._base
        self.quantum_s = base_quantum_s if base_quantum_s is not None else 0.01
        self._base = self.quantum_s
        self.starvation_s = starvation_s
        self.adaptive_starvation = bool(adaptive_starvation)
        self.demote_on = demote_on
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_iteration_s = decode_iteration_s
        self.default_tokens = int(default_tokens)
        if starvation_period_s is not None and not starvation_period_s > 0:
            raise ValueError(f"mlfq: starvation_period_s must be > 0 or None, got "
                             f"{starvation_period_s!r}")
        self.starvation_period_s = starvation_period_s
        self._check_tick: dict[int, int] = {}
        self.name = {"first": "mlfq", "prefill": "fastserve", "predicted": "mlfq-predicted"}[
            entry] + ("-adaptive" if adaptive_starvation else "")
        self._state: dict[int, list[float]] = {}
        self._last_now: dict[int, float] = {}
        self._pf = prefill_s_per_token or 0.0
        self._dec = decode_iteration_s or 0.0
        self.demotions = 0

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget every request's queue level and service and the demotion count; fill in
        the prefill seconds per token and the decode-iteration seconds from ``cluster``'s
        cost model (at 1024 tokens) where they were not given, and set the base quantum (s)
        from them."""
        super().reset(cluster, rng)
        self._state = {}
        self._last_now = {}
        self._check_tick = {}
        self.demotions = 0
        self._pf = self.prefill_s_per_token
        self._dec = self.decode_iteration_s
        if self._pf is None or self._dec is None:
            from lpserve.cost import cost_models_for

            # a heterogeneous cluster: the mean over its replicas (levels classify service)
            costs = cost_models_for(cluster)

            def mean(f):
                vals = [float(f(c)) for c in costs]
                return vals[0] if len(set(vals)) == 1 else float(np.mean(vals))

            if self._pf is None:
                self._pf = mean(lambda c: c.batch_time_s(prefill_tokens=[1024])) / 1024.0
            if self._dec is None:
                self._dec = mean(lambda c: c.batch_time_s(decode_context=[1024]))
        self._base = float(self._dec if self.base_quantum_s is None else self.base_quantum_s)

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters after :meth:`reset` (see
        :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        period = self.starvation_period_s or 1000.0 * max(self._dec, 1e-9)
        return "mlfq", [self.quantum_s, self._base, self._pf, self._dec,
                        -1.0 if self.starvation_s is None else self.starvation_s, period,
                        float(self.default_tokens)], \
            [("first", "prefill", "predicted").index(self.entry),
             int(self.adaptive_starvation), int(self.demote_on == ">")]

    def _entry_service_s(self, view: SchedulerView, k: int) -> float:
        if self.entry == "first":
            return 0.0
        s = float(view.prompt_tokens[k]) * self._pf
        if self.entry == "predicted":
            hi = view.predicted_hi
            tokens = float(self.default_tokens if hi is None else hi[k])
            s += max(tokens - 1.0, 0.0) * self._dec
        return s

    def _exhausted(self, used: float, quantum: float) -> bool:
        return used >= quantum - 1e-12 if self.demote_on == ">=" else used > quantum + 1e-12

    def _rank(self, view: SchedulerView) -> np.ndarray:
        now, rep = view.now_s, view.replica
        dt = max(now - self._last_now.get(rep, now), 0.0)  # replicas keep their own clocks
        self._last_now[rep] = now
        req = view.request.tolist()
        run = view.running.tolist()
        n_run = max(sum(run), 1)
        thr = self.starvation_s
        period = self.starvation_period_s or 1000.0 * max(self._dec, 1e-9)
        tick = tick_index(now, period)
        if thr is not None and tick <= self._check_tick.get(rep, 0):
            thr = None  # not a starvation check time
        elif thr is not None:
            self._check_tick[rep] = tick
        if thr is not None and self.adaptive_starvation:
            thr = thr * max(1.0, len(req) / n_run)
        out = np.empty(len(req), np.float64)
        for k, i in enumerate(req):
            st = self._state.get(i)
            if st is None:  # [level, used in level (s), entered level (s), last served (s)]
                lvl = entry_level(self._entry_service_s(view, k), self._base)
                st = self._state[i] = [lvl, 0.0, float(view.arrival_s[k]), now]
            if run[k]:  # running now = admitted at or before the previous decision
                st[1] += dt
                while self._exhausted(st[1], self._base * 2 ** st[0]):
                    st[1] = 0.0
                    st[0] += 1
                    st[2] = now
                    self.demotions += 1
            if run[k]:
                st[3] = now
            elif thr is not None and now - st[3] >= thr and st[0] > 0:
                st[0], st[1], st[2], st[3] = 0, 0.0, now, now
            out[k] = st[0] * _LEVEL_SCALE + st[2]
        return out


# ============================================================================ toy model
def iteration_toy(scheduler: Scheduler, first_iter_s: Any, tokens: Any,
                  arrival_s: Any = None, batch: int = 1) -> np.ndarray:
    """Completion times of jobs on FastServe's toy model under ``scheduler``.

    Job ``j`` needs ``tokens[j]`` iterations; its first takes ``first_iter_s[j]`` seconds
    (the prompt length given to the scheduler is ``first_iter_s[j]`` tokens), later ones
    1 s; an iteration lasts as long as its slowest member. Before each iteration the
    scheduler ranks every arrived, unfinished job and the ``batch`` best (ties by index)
    run; preemption is free at iteration boundaries. ``scheduler.reset`` is called with
    ``cluster=None``, so an MLFQ needs ``prefill_s_per_token`` and ``decode_iteration_s``.
    """
    f = np.asarray(first_iter_s, np.float64)
    o = np.asarray(tokens, np.int64)
    a = np.zeros(f.size) if arrival_s is None else np.asarray(arrival_s, np.float64)
    n = f.size
    scheduler.reset(None, np.random.default_rng(0))
    gen = np.zeros(n, np.int64)
    done = np.full(n, np.nan)
    running = np.zeros(n, bool)
    first = np.full(n, np.nan)
    t = 0.0
    while np.isnan(done).any():
        alive = np.flatnonzero(np.isnan(done) & (a <= t + 1e-12))
        if alive.size == 0:
            t = float(a[np.isnan(done)].min())
            continue
        view = _toy_view(t, alive, a, f, o, gen, running, first)
        r = np.asarray(scheduler.rank(view), np.float64)
        ok = np.flatnonzero(np.isfinite(r))
        pick = alive[ok[np.lexsort((alive[ok], r[ok]))][:batch]]
        running[:] = False
        running[pick] = True
        first[pick] = np.where(np.isnan(first[pick]), t, first[pick])
        t += float(np.max(np.where(gen[pick] == 0, f[pick], 1.0)))
        gen[pick] += 1
        fin = pick[gen[pick] >= o[pick]]
        done[fin] = t
        running[fin] = False
    return done


def _toy_view(t, alive, a, f, o, gen, running, first) -> SchedulerView:
    m = alive.size
    return SchedulerView(
        now_s=t, replica=0, request=readonly(alive.astype(np.int64)), arrival_s=readonly(a[alive]),
        prompt_tokens=readonly(f[alive].astype(np.int64)), generated_tokens=readonly(gen[alive]),
        computed_tokens=readonly(gen[alive]), cached_tokens=readonly(np.zeros(m, np.int64)),
        running=readonly(running[alive]), swapped=readonly(np.zeros(m, bool)),
        preemptions=readonly(np.zeros(m, np.int64)), first_scheduled_s=readonly(first[alive]),
        tenant=readonly(np.full(m, -1, np.int64)), session_id=readonly(np.full(m, -1, np.int64)),
        predicted_lo=readonly(o[alive]), predicted_hi=readonly(o[alive]), output_tokens=readonly(o[alive]),
        free_blocks=1 << 30, total_blocks=1 << 30, block_tokens=1)
