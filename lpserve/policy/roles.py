"""The three roles of the policy contract and what a policy declares about itself.

* :class:`Router` -- ``route(view) -> int64 (n_arriving,)`` replica index per arriving
  request;
* :class:`Scheduler` -- ``rank(view) -> float64 (n_candidates,)``; lower runs first,
  ``+inf`` holds a candidate back (``-inf`` is a valid rank: it runs before every finite
  one; NaN is refused, see :mod:`lpserve.policy.checks`);
* :class:`Evictor` -- ``evict(view, need_blocks) -> int64 (need_blocks,)`` distinct
  positions (into the view's candidate arrays) of the cached blocks to give up.

Every role (and every optional hook of :mod:`lpserve.policy.hooks`) derives from
:class:`Role`: a ``name``, a :class:`Meta` and ``reset(cluster, rng)``, called once per
simulation before the first decision. Plain functions can be lifted into a role with
:func:`as_router`, :func:`as_scheduler` and :func:`as_evictor`. The default roles are
:class:`RoundRobin`, :class:`FCFS` and :class:`LRU`.
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from lpserve.policy.views import EvictorView, RouterView, SchedulerView

__all__ = ["ENGINES", "Claim", "Evictor", "FCFS", "LRU", "Meta", "PolicyError", "Role",
           "RoundRobin", "Router", "Scheduler", "as_evictor", "as_router", "as_scheduler",
           "next_tick_s", "tick_index"]

ENGINES = ("lpserve", "vidur", "vllm")


class PolicyError(ValueError):
    """A policy returned something unusable; the message names the policy and the value."""


@dataclass(frozen=True)
class Claim:
    """A bound a policy claims, backed by a proof file.

    Attributes:
        statement: the claim in one sentence (e.g. "2-competitive for total flow time").
        proof: path of the proof file under ``proofs/`` (e.g. ``"proofs/srpt-wspt-classical.md"``).
        test: the test that checks it (``"tests/properties/test_x.py::test_y"``).
    """

    statement: str
    proof: str
    test: str = ""

    def __post_init__(self) -> None:
        if not self.proof.startswith("proofs/"):
            raise ValueError(f"Claim.proof must point into proofs/, got {self.proof!r}")


@dataclass(frozen=True)
class Meta:
    """What a policy declares about itself.

    Attributes:
        online: decides using only the past (True) or sees the whole instance (False).
        clairvoyant: receives true output lengths (``view.output_tokens``).
        stochastic: uses the ``rng`` given to ``reset``.
        engines: engines the policy can run in (``"lpserve"``, ``"vidur"``, ``"vllm"``).
        claims: :class:`Claim` objects.
    """

    online: bool = True
    clairvoyant: bool = False
    stochastic: bool = False
    engines: tuple[str, ...] = ("lpserve", "vidur", "vllm")
    claims: tuple[Claim, ...] = ()

    def __post_init__(self) -> None:
        bad = [e for e in self.engines if e not in ENGINES]
        if bad:
            raise ValueError(f"Meta.engines has unknown engine(s) {bad}; known: {ENGINES}")
        for c in self.claims:
            if not isinstance(c, Claim):
                raise ValueError(f"Meta.claims must hold Claim objects, got {c!r}")


class Role(abc.ABC):
    """Common base of every role and hook: a ``name``, a :class:`Meta`, and ``reset``.

    ``reads_predictions = True`` declares that the role decides on predicted output
    lengths (``view.predicted_lo/hi``): ``lp.simulate`` then refuses to run it on a trace
    without predictions unless a predictor is given (``predictor="none"`` runs the role's
    documented fallback on purpose).
    """

    name: str = "role"
    meta: Meta = Meta()
    reads_predictions: bool = False

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Prepare for a new run on ``cluster``; ``rng`` is the only randomness allowed."""

    def bind(self, cluster: Any, slo: Any, tiers: tuple = ()) -> None:
        """Take the parameters that mirror the instance from it: called once per run,
        before :meth:`reset`, with the cluster, the instance's SLO (an
        :class:`~lpserve.instance.SLO`) and its service tiers (:class:`~lpserve.instance.Tier`,
        each an SLO for some tenants). A role whose parameter mirrors the instance (an
        SLO target) and that the user left unset (``None``) fills it here; one set by
        the user is kept. The default does nothing. The vLLM and Vidur adapters have no
        instance and do not call it."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Router(Role):
    """Chooses a replica for each arriving request."""

    @abc.abstractmethod
    def route(self, view: RouterView) -> np.ndarray:
        """Replica index (int64) for each arriving request of ``view``."""


class Scheduler(Role):
    """Ranks the candidates of one replica; lower runs first, ``+inf`` holds back.

    ``quantum_s``: if set, the simulator asks again at least every ``quantum_s`` seconds
    of simulated time (a time-sliced policy); ``None`` asks only at events.
    ``rank_key``: a declaration that ``rank(view)`` always equals ``view.<rank_key>``
    (``"arrival_s"`` or ``"prompt_tokens"``), a fixed per-request key, or ``"static"``: rank
    always equals ``keys[view.request]`` for the scheduler's own float64 array ``keys`` (one
    entry per request, checked by its ``check_size(n)``); engines may then order by the key
    without calling ``rank``. ``None`` (default) promises nothing.
    """

    quantum_s: float | None = None
    rank_key: str | None = None

    @abc.abstractmethod
    def rank(self, view: SchedulerView) -> np.ndarray:
        """One float per candidate of ``view``: lower runs first, ``+inf`` holds back.
        The view is empty (shape (0,)) when a swapped-in request is about to join a
        replica that holds no candidate: the call tells a scheduler that keeps a clock
        that nothing ran since its last decision."""


def tick_index(now_s: float, quantum_s: float) -> int:
    """Index ``k`` of the quantum tick that holds ``now_s`` (s): the one ``k`` with
    ``k * quantum_s <= now_s < (k + 1) * quantum_s``, both products taken in float64.

    The one tick arithmetic of the package: every quantum-driven scheduler and the
    simulator's decode-run boundary (:func:`next_tick_s`) use it, so a run stopped at a
    boundary always finds a new tick there. The boundaries are the float64 products
    ``k * quantum_s`` themselves, with no tolerance: ``floor(now_s / quantum_s)`` alone is
    off by one where the division rounds (``8.1 / 0.05 = 161.99999999999997`` although
    ``162 * 0.05 == 8.1``), and is corrected here. ``quantum_s`` must be > 0 and finite,
    ``now_s`` finite.
    """
    k = math.floor(now_s / quantum_s)
    for _ in range(4):  # the quotient is off by at most one; two steps always suffice
        if (k + 1) * quantum_s <= now_s:
            k += 1
        elif k * quantum_s > now_s:
            k -= 1
        else:
            return int(k)
    raise ValueError(f"tick_index: quantum_s={quantum_s!r} is too small for now_s={now_s!r} "
                     "in float64 (consecutive ticks round to the same time)")


def next_tick_s(now_s: float, quantum_s: float) -> float:
    """Start (s) of the quantum tick after the one holding ``now_s``; always strictly
    greater than ``now_s``, and ``tick_index(next_tick_s(t, q), q) == tick_index(t, q) + 1``
    (see :func:`tick_index`)."""
    return (tick_index(now_s, quantum_s) + 1) * quantum_s


class Evictor(Role):
    """Chooses which evictable cached blocks to drop.

    ``reads_queue = True`` asks the simulator to fill ``EvictorView.queued`` (the blocks the
    waiting requests would hit), which costs a cache lookup per queued block.
    ``reads_keys = True`` asks it to fill ``EvictorView.key`` (each evictable block's
    prefix-cache key), which costs a list lookup per evictable block.
    ``reads_tree = False`` tells it that the evictor never reads ``EvictorView.parent``
    (each block's cached parent among the candidates, a binary search per evictable
    block), which is then None.
    ``observes_requests = True`` asks it to call :meth:`observe` with a
    :class:`~lpserve.policy.views.RequestEvent` when a request arrives at a replica and
    when it finishes there (what an evictor learns return gaps from).
    """

    reads_queue: bool = False
    reads_keys: bool = False
    reads_tree: bool = True
    observes_requests: bool = False

    def observe(self, event: Any) -> None:
        """A request arrived or finished (only called when ``observes_requests``)."""

    @abc.abstractmethod
    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        """``need_blocks`` distinct positions into ``view``'s candidates to give up."""


class RoundRobin(Router):
    """Replica ``k mod R`` for the ``k``-th routed request."""

    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Start again at replica 0."""
        self._next = 0

    def kernel_spec(self) -> tuple[str, tuple]:
        """``(kind, params)`` of this router's twin in the simulator: its routes read no
        state, so the event loop may route the ``k``-th request to ``k mod R`` itself and
        hand each compiled replica its arrivals at once (``lpserve.sim.engine``)."""
        return "round-robin", ()

    def route(self, view: RouterView) -> np.ndarray:
        """Replica ``(k + j) mod n_replicas`` for the ``j``-th arriving request, int64
        ``(n_arriving,)``, where ``k`` counts the requests routed before (mod ``n_replicas``)."""
        n = len(view)
        if n == 1:
            k = self._next
            self._next = (k + 1) % view.n_replicas
            return np.array([k % view.n_replicas], np.int64)
        out = (self._next + np.arange(n, dtype=np.int64)) % view.n_replicas
        self._next = int((self._next + n) % view.n_replicas)
        return out


class FCFS(Scheduler):
    """First come, first served: rank = arrival time (ties by queue position)."""

    name = "fcfs"
    rank_key = "arrival_s"

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """``(kind, float params, int params)`` of this scheduler's compiled twin in the
        simulator (``lpserve/sim/_ranks.py``); a subclass without its own
        ``kernel_spec`` is ranked in Python."""
        return "fcfs", [0.0], [0]

    def rank(self, view: SchedulerView) -> np.ndarray:
        """Each candidate's ``arrival_s`` (a float64 copy, shape ``(n,)``): the earliest
        arrival runs first."""
        return np.asarray(view.arrival_s, dtype=np.float64).copy()


class LRU(Evictor):
    """Least recently used first; among equal times the deepest block of a chain first."""

    name = "lru"
    reads_tree = False

    def kernel_spec(self) -> tuple[str, tuple[float, ...]]:
        """``(kind, params)`` of this evictor's compiled twin in the simulator's prefix
        cache (``lpserve/sim/_pool.py``)."""
        return "lru", (0.0, 0.0, 1.0, 1.0)

    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        """``need_blocks`` positions into ``view``, int64, oldest ``last_access_s`` first and
        the deeper block of a chain first among equal times; an empty array when
        ``need_blocks <= 0``, all ``n`` positions (in that order) when it is ``>= n``."""
        last = view.last_access_s
        n = int(last.shape[0])
        if need_blocks <= 0:
            return np.zeros(0, np.int64)
        if need_blocks >= n:
            return np.lexsort((-view.depth, last)).astype(np.int64)[:need_blocks]
        kth = np.partition(last, need_blocks - 1)[need_blocks - 1]
        cand = np.flatnonzero(last <= kth)  # every block that can be among the oldest
        sub = np.lexsort((-view.depth[cand], last[cand]))
        return cand[sub[:need_blocks]].astype(np.int64)


class _FnRouter(Router):
    def __init__(self, fn: Callable[[RouterView], Any], name: str, meta: Meta):
        self.fn, self.name, self.meta = fn, name, meta

    def route(self, view: RouterView) -> np.ndarray:
        return np.asarray(self.fn(view))


class _FnScheduler(Scheduler):
    def __init__(self, fn: Callable[[SchedulerView], Any], name: str, meta: Meta):
        self.fn, self.name, self.meta = fn, name, meta

    def rank(self, view: SchedulerView) -> np.ndarray:
        return np.asarray(self.fn(view), dtype=np.float64)


class _FnEvictor(Evictor):
    def __init__(self, fn: Callable[[EvictorView, int], Any], name: str, meta: Meta):
        self.fn, self.name, self.meta = fn, name, meta

    def evict(self, view: EvictorView, need_blocks: int) -> np.ndarray:
        return np.asarray(self.fn(view, need_blocks))


def as_router(fn: Callable[[RouterView], Any] | Router, *, name: str | None = None,
              meta: Meta = Meta()) -> Router:
    """Lift ``fn(view) -> replica per request`` into a :class:`Router` (a module-level
    function keeps the router picklable)."""
    return fn if isinstance(fn, Router) else _FnRouter(fn, name or fn.__name__, meta)


def as_scheduler(fn: Callable[[SchedulerView], Any] | Scheduler, *, name: str | None = None,
                 meta: Meta = Meta()) -> Scheduler:
    """Lift ``fn(view) -> rank per candidate`` into a :class:`Scheduler`."""
    return fn if isinstance(fn, Scheduler) else _FnScheduler(fn, name or fn.__name__, meta)


def as_evictor(fn: Callable[[EvictorView, int], Any] | Evictor, *, name: str | None = None,
               meta: Meta = Meta()) -> Evictor:
    """Lift ``fn(view, need_blocks) -> positions`` into an :class:`Evictor`."""
    return fn if isinstance(fn, Evictor) else _FnEvictor(fn, name or fn.__name__, meta)
