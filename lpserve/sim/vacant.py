"""Replicas built when a request first reaches them.

A cluster of many replicas and few requests (a capacity question asked of 10,000 replicas)
would otherwise hold every replica's KV block pool and state from the start, most of them
never used. :class:`Vacant` stands in for a replica no request has reached: it answers
what the event loop, the routers and the run's statistics read of a replica that holds
nothing (the values of a replica built at the start and never used, taken from the pool's
first replica), and builds the replica in its pool slot when a request is enqueued, or
when anything else is asked of it. A replica built late is the replica built early: it
has done nothing meanwhile (an empty replica's ``advance`` changes nothing), and its
state depends on nothing but its index and role.

Only for runs whose replicas are alike and independent of the order they are built in
(:func:`lazy_ok`): not a heterogeneous cluster, not speculative decoding (each replica
spawns its acceptance generator in build order), not a rebalancer (it may move requests
to any replica at once).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

from lpserve.sim.memory import check_replicas

__all__ = ["FRESH_FIELDS", "Vacant", "lazy_ok", "replica_pool", "vacant_pool"]

#: replica attributes read of every replica by the event loop, the routers and the run's
#: statistics; a vacant replica answers them with the values of a fresh one
FRESH_FIELDS = ("now", "outstanding", "n_waiting", "n_running", "wm_blocks", "bt",
                "reserve_blocks", "n_iters", "n_decode_iters", "n_swaps", "n_compressed_swaps",
                "n_recomputes", "compressed_tokens", "swap_wait_s", "busy_s", "used_block_s")
#: block-pool counters of a fresh replica (``replica.bm``)
_BM_FIELDS = ("total", "used", "plain_free", "evictable", "anon_used", "hashed_used",
              "available")


def lazy_ok(policy: Any, heterogeneous: bool) -> bool:
    """Whether a run of ``policy`` may build its replicas when first reached."""
    return not heterogeneous and policy.engine.speculation is None and \
        policy.rebalancer is None


class _Slot:
    __slots__ = ("_make", "_pool", "_k", "_role", "_fresh", "_bm", "_real", "index", "role",
                 "key")


class Vacant(_Slot):
    """Replica ``k`` of ``pool`` (role ``role``), not built yet: ``make(k, role)`` builds
    it. Reads of :data:`FRESH_FIELDS`, ``bm`` counters, ``running``/``waiting``/
    ``releases``/``loading`` (empty), ``link`` and ``offload`` (None) cost nothing;
    ``advance`` and ``step`` do nothing (as on an empty replica);
    ``cached_prefix_tokens`` is 0. Anything else builds the replica, puts it in
    ``pool[k]`` and forwards to it from then on."""

    __slots__ = ()
    vacant = True
    running = waiting = releases = loading = ()
    link = offload = None

    def __init__(self, make: Callable[[int, str], Any], pool: list, k: int, role: str,
                 fresh: dict[str, Any], bm: SimpleNamespace) -> None:
        self._make, self._pool, self._k, self._role = make, pool, k, role
        self._fresh, self._bm, self._real = fresh, bm, None
        self.index, self.role, self.key = k, role, (role, k)

    @property
    def bm(self) -> SimpleNamespace:
        """The block-pool counters of an empty replica."""
        return self._bm

    def advance(self, t: float) -> None:
        """Nothing to run (an empty replica)."""

    def step(self, stop: float) -> bool:
        """Nothing to run: False."""
        return False

    def cached_prefix_tokens(self, i: int) -> int:
        """0: nothing is cached on a replica that has held nothing."""
        return 0

    def enqueue(self, i: int, t: float) -> None:
        """Build the replica and enqueue request ``i`` at ``t`` on it."""
        self.build().enqueue(i, t)

    def build(self) -> Any:
        """The replica, built now into its pool slot (this object forwards to it)."""
        real = self._make(self._k, self._role)
        self._pool[self._k] = real
        self._real = real
        self.__class__ = _Built
        return real

    def __getattr__(self, name: str) -> Any:
        fresh = self._fresh
        if name in fresh:
            return fresh[name]
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.build(), name)


class _Built(_Slot):
    """A :class:`Vacant` whose replica is built: every attribute is the replica's."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def vacant_pool(first: Any, make: Callable[[int, str], Any], role: str,
                count: int) -> list:
    """``[first]`` and ``count - 1`` :class:`Vacant` replicas answering as ``first`` does
    while it is fresh (call before any request reaches ``first``)."""
    fresh = {k: getattr(first, k) for k in FRESH_FIELDS if hasattr(first, k)}
    bm = SimpleNamespace(**{k: getattr(first.bm, k) for k in _BM_FIELDS})
    pool: list = [first]
    pool += [Vacant(make, pool, k, role, fresh, bm) for k in range(1, count)]
    return pool


def replica_pool(make: Callable[[int, str], Any], role: str, count: int,
                 lazy_up_to: int | None, scale: float = 1.0) -> list[Any]:
    """``count`` replicas of ``role`` (``make(k, role)`` builds replica ``k``), refused up
    front (:mod:`lpserve.sim.memory`) when the machine cannot hold them. With
    ``lazy_up_to`` (the most replicas requests can reach: the run's request count) every
    replica but the first is built when a request first reaches it (:class:`Vacant`), and
    the check counts at most that many. ``scale``: the largest replica's KV blocks over
    the first's (a heterogeneous cluster)."""
    if count < 1:
        return []
    first = make(0, role)
    check_replicas(first, count if lazy_up_to is None else min(count, lazy_up_to), role,
                   scale=scale)
    if lazy_up_to is not None:
        return vacant_pool(first, make, role, count)
    return [first] + [make(k, role) for k in range(1, count)]
