"""WAIT: fluid-guided threshold admission with known output lengths (Ao, Luo,
Simchi-Levi, Wang, arXiv 2504.11320; ``models/wait-fluid.md``).

Requests are typed by ``(prompt tokens, output tokens)``. Type ``j`` has a threshold
``n_j`` (:func:`lpserve.opt.fluid.wait_thresholds` turns the fluid optimum into them):
while fewer than ``n_j`` requests of the type wait, all of them are held; once ``n_j`` wait,
the ``n_j`` oldest are released together. The next cohort is released at the next
decision (the running set changed), i.e. at most one cohort per type per iteration, so
the batch tracks the fluid equilibrium and, with ``sum_j n_j g_j <= M``, never outgrows
the KV memory. Running requests are never preempted by rank.

WAIT needs output lengths to type requests, so it is clairvoyant. Types without a
threshold use ``default_threshold``. ``flush_after_s`` (optional, not in the paper)
releases a partial cohort whose oldest request waited that long, so a type whose arrivals
stop does not hold its last requests forever. Run it with ``batching="mixed"`` (new
requests join the running batch in the same iteration, as in the paper's round model).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from lpserve.policies.schedulers import TickCached
from lpserve.policy import Claim, Meta, SchedulerView, tick_index

__all__ = ["WAIT"]

_RUNNING_RANK = -1.0e18


class WAIT(TickCached):
    """WAIT (see the module docstring).

    Args:
        thresholds: ``{(prompt_tokens, output_tokens): n}`` with ``n >= 0`` (0: never
            admit the type).
        default_threshold: threshold of unlisted types (1: admit as soon as it waits).
        flush_after_s: release a partial cohort whose oldest request waited this long
            (seconds); ``None`` (default) is the paper's WAIT.
    """

    name = "wait"
    meta = Meta(clairvoyant=True, claims=(Claim(
        "with thresholds from the fluid optimum WAIT never exceeds the KV memory, and its "
        "throughput over the fluid optimum tends to 1 as rates and memory scale together",
        "proofs/wait-fluid.md",
        "tests/properties/test_wait_fluid.py::test_wait_approaches_the_fluid_optimum"),))

    def __init__(self, thresholds: Mapping[tuple[int, int], int] | None = None,
                 default_threshold: int = 1, flush_after_s: float | None = None) -> None:
        self.thresholds: dict[tuple[int, int], int] = {}
        for key, n in dict(thresholds or {}).items():
            if not (isinstance(key, tuple) and len(key) == 2
                    and all(isinstance(k, (int, np.integer)) and k >= 1 for k in key)):
                raise ValueError(f"wait: thresholds keys must be (prompt_tokens, "
                                 f"output_tokens) pairs of positive integers, got {key!r}")
            self.thresholds[(int(key[0]), int(key[1]))] = self._count(f"thresholds[{key}]", n)
        self.default_threshold = self._count("default_threshold", default_threshold)
        if flush_after_s is not None and not (math.isfinite(flush_after_s)
                                              and flush_after_s > 0):
            raise ValueError(f"wait: flush_after_s must be > 0 or None, got {flush_after_s!r}")
        self.flush_after_s = flush_after_s
        self.quantum_s = None if flush_after_s is None else flush_after_s / 4.0

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (``lpserve/sim/_ranks.py`` ``_wait``;
        see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        flat = [v for (p, o), n in sorted(self.thresholds.items()) for v in (p, o, n)]
        return "wait", [self.quantum_s or 0.0, math.inf if self.flush_after_s is None
                        else float(self.flush_after_s), float(self.default_threshold)], \
            [len(self.thresholds), *flat]

    @staticmethod
    def _count(field: str, n: Any) -> int:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"wait: {field} must be an integer >= 0, got {n!r}")
        return int(n)

    def _rank(self, view: SchedulerView) -> np.ndarray:
        out = np.full(len(view), _RUNNING_RANK)
        waiting = np.flatnonzero(~view.running)
        out[waiting] = math.inf
        if waiting.size == 0:
            return out
        prompt, output = view.prompt_tokens, view.output_tokens
        arr, req = view.arrival_s, view.request
        groups: dict[tuple[int, int], list[int]] = {}
        for k in waiting.tolist():
            groups.setdefault((int(prompt[k]), int(output[k])), []).append(k)
        for key, members in groups.items():
            n = self.thresholds.get(key, self.default_threshold)
            if n == 0:
                continue
            members.sort(key=lambda k: (float(arr[k]), int(req[k])))
            due = len(members) >= n
            if not due and self.flush_after_s is not None:
                q = self.quantum_s  # the tick's start, whenever in it the engine asks
                tick_s = tick_index(view.now_s, q) * q
                due = tick_s - float(arr[members[0]]) >= self.flush_after_s
            if due:
                for k in members[:n]:
                    out[k] = float(arr[k])
        return out
