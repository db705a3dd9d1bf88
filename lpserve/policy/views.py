"""Read-only views the policy roles decide on (layer 3 of the policy contract).

Each view holds numpy arrays aligned with the candidates of one decision, all read-only;
fields a policy may not see (true output lengths for a non-clairvoyant policy) are
``None``. The roles themselves are in :mod:`lpserve.policy.roles`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from lpserve.arrays import readonly


@dataclass(frozen=True, eq=False)
class SchedulerView:
    """Candidates of one replica at one scheduling point (all arrays shape ``(n,)``).

    Attributes:
        now_s: simulated time of the decision (s).
        replica: replica index.
        request: request index in the trace (int64).
        arrival_s: arrival time (s).
        prompt_tokens: prompt length (tokens).
        generated_tokens: output tokens produced so far.
        computed_tokens: tokens whose KV is currently computed on this replica.
        cached_tokens: prompt tokens found in this replica's prefix cache (admission
            estimate; computed for the first 256 waiting candidates, 0 for the others).
        running: True for requests in the running batch, False for waiting ones.
        swapped: True for requests whose KV sits in host memory.
        preemptions: times the request was preempted so far.
        first_scheduled_s: when the request first ran (NaN if never).
        tenant, session_id: trace ids or -1; predicted_lo, predicted_hi: predicted output
            interval (tokens) or ``None`` if the trace has none.
        output_tokens: true output lengths, only for clairvoyant policies (else ``None``).
        free_blocks, total_blocks, block_tokens: the replica's KV state (blocks; tokens per block).
        program_id, parent: agentic program id and parent call (trace index, -1 for a root)
            of each candidate, or ``None`` if the trace has none.
    """

    now_s: float
    replica: int
    request: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    generated_tokens: np.ndarray
    computed_tokens: np.ndarray
    cached_tokens: np.ndarray
    running: np.ndarray
    swapped: np.ndarray
    preemptions: np.ndarray
    first_scheduled_s: np.ndarray
    tenant: np.ndarray
    session_id: np.ndarray
    predicted_lo: np.ndarray | None
    predicted_hi: np.ndarray | None
    output_tokens: np.ndarray | None
    free_blocks: int
    total_blocks: int
    block_tokens: int
    program_id: np.ndarray | None = None
    parent: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.request.shape[0])


@dataclass(frozen=True, eq=False)
class EvictorView:
    """Evictable cached KV blocks of one replica (all arrays shape ``(n,)``).

    Attributes:
        now_s: simulated time (s); replica: replica index.
        block: physical block slot ids (int64).
        last_access_s: last time the block was used by a request (s).
        hits: times the block was found in the cache.
        depth: position of the block in its prefix chain (0 = first block of a prompt).
        created_s: when the block was filled (s).
        children: cached blocks that extend this one's prefix by one block, in use or not
            (int64; 0 = a radix-tree leaf).
        parent: position in this view of the block's cached parent, -1 if the parent is
            not evictable or not cached (int64).
        turn_gap_s: for blocks last touched by a returning session (a request that hit at
            least ``SESSION_MIN_HIT_TOKENS`` cached tokens), the time between that turn and
            the previous touch of its deepest hit block (s); 0 otherwise.
        queued: True where a waiting request on this replica (the first
            ``PREFIX_ESTIMATE_MAX`` of the queue) would hit the block; filled only for
            evictors whose ``reads_queue`` attribute is True (matching the queue against
            the cache costs a lookup per queued block), else None.
        thread: the conversation of the request that last released the block (the trace's
            ``program_id`` where it has one, else ``session_id``; -1 none) (int64).
        wait_kind: why that request's client waits (``Trace.wait_kind``; -1 when unknown
            or when the request was preempted, not finished) (int64).
        block_tokens: tokens per block of the replica (0 when not given).
        key: the blocks' prefix-cache keys (the hash-chain keys of
            ``RequestEvent.block_keys``), filled only for evictors whose ``reads_keys``
            attribute is True (a Python tuple, one key per block), else None.

    The simulator fills the other fields; views built by hand may leave the last seven None.
    """

    now_s: float
    replica: int
    block: np.ndarray
    last_access_s: np.ndarray
    hits: np.ndarray
    depth: np.ndarray
    created_s: np.ndarray
    children: np.ndarray | None = None
    parent: np.ndarray | None = None
    turn_gap_s: np.ndarray | None = None
    queued: np.ndarray | None = None
    thread: np.ndarray | None = None
    wait_kind: np.ndarray | None = None
    block_tokens: int = 0
    key: tuple | None = None

    def __len__(self) -> int:
        return int(self.block.shape[0])


@dataclass(frozen=True)
class RequestEvent:
    """A request that arrived at a replica (``kind == "arrive"``) or finished there
    (``"finish"``), as an evictor with ``observes_requests`` sees it.

    Attributes:
        kind, now_s, replica, request: what, when (s), where, which (trace index).
        thread: its conversation (``program_id``, else ``session_id``; -1 none).
        wait_kind: at a finish, why its client now waits (``Trace.wait_kind``); -1 at an
            arrival (the response is not known yet).
        prompt_tokens: its prompt; context_tokens: at a finish, prompt plus generated
            tokens (the KV its conversation holds), at an arrival the prompt.
        block_tokens: tokens per KV block of the replica; total_blocks: its KV blocks.
        block_keys: at a finish, the content keys of the request's full prompt blocks
            (those two requests share exactly for a common leading run), else ``()``.
    """

    kind: str
    now_s: float
    replica: int
    request: int
    thread: int
    wait_kind: int
    prompt_tokens: int
    context_tokens: int
    block_tokens: int
    total_blocks: int = 0
    block_keys: tuple = ()


class RouterView:
    """Requests arriving now and the replicas they can go to.

    Request arrays have shape ``(n_arriving,)``: ``request``, ``arrival_s``,
    ``prompt_tokens``, ``tenant``, ``session_id``, ``program_id`` (``None`` when the trace
    has no programs), ``predicted_lo``/``predicted_hi`` (or ``None``), ``output_tokens``
    (clairvoyant policies only, else ``None``), and
    ``block_keys`` (a tuple of int64 arrays: chained content hashes of each prompt's
    prefix blocks; empty without block ids). ``block_tokens`` is the replicas' KV block
    size (tokens). ``phase`` is ``"prefill"`` (or
    ``"colocated"``) at arrival and ``"decode"`` when a disaggregated request's KV is ready.

    Replica arrays have shape ``(n_replicas,)`` and are computed on first access (the
    simulator brings every replica up to ``now_s`` for them): ``outstanding`` (requests
    routed and not finished), ``waiting``, ``running``, ``used_blocks``, ``total_blocks``,
    and ``max_prompt_tokens``, the longest prompt each replica can hold (its KV blocks
    less the engine's watermark; ``total_blocks x block_tokens - 1`` when the caller
    gives no such field). ``key_tokens`` is the tokens per block of ``block_keys`` (the
    trace's block size; 0 without block ids).

    What a KV-aware router learns from the engines' KV events and its own bookkeeping,
    each computed on first access and ``None`` where the caller did not provide it:

    * ``cached_tokens`` ``(n_arriving, n_replicas)``: prompt tokens of each arriving request
      whose KV blocks sit in each replica's prefix cache (the longest cached prefix, in
      whole blocks), as KV events report it; the cost is one lookup per block of the
      arriving prompts, never a scan of the cache.
    * ``prefill_tokens`` ``(n_replicas,)``: prompt tokens still to prefill over the
      requests routed to each replica (a waiting request counts its prompt minus the
      cached tokens it had there when routed, if the router read them).
    * ``prefill_square_tokens`` ``(n_replicas,)``: over the same prefills, the sum of
      ``end^2 - start^2`` (tokens^2; ``start`` the first token still to prefill, ``end``
      the context length), what their attention costs beyond the linear part.
    * ``cached_blocks`` ``(n_replicas,)``: blocks in each replica's prefix cache (in use
      or evictable).
    * ``completions``: the requests that finished since the router's previous call (at or
      before ``now_s``), a dict of arrays ``request``, ``replica``, ``ttft_s``, ``tpot_s``
      (NaN for one output token), ``output_tokens``; filled only for routers whose
      ``reads_completions`` attribute is True (responses pass through the router).
    """

    _REPLICA_FIELDS = ("outstanding", "waiting", "running", "used_blocks", "total_blocks")
    _LOAD_FIELDS = ("prefill_tokens", "prefill_square_tokens", "cached_blocks")

    def __init__(self, *, now_s: float, n_replicas: int, phase: str, request: np.ndarray,
                 arrival_s: np.ndarray, prompt_tokens: np.ndarray, tenant: np.ndarray,
                 session_id: np.ndarray, predicted_lo: np.ndarray | None,
                 predicted_hi: np.ndarray | None, output_tokens: np.ndarray | None,
                 block_keys: tuple[np.ndarray, ...] | Callable[[], tuple[np.ndarray, ...]],
                 replica_state: Callable[[], dict[str, np.ndarray]] | dict[str, np.ndarray],
                 block_tokens: int = 16,
                 cached_tokens: Callable[[], np.ndarray] | np.ndarray | None = None,
                 load_state: Callable[[], dict[str, np.ndarray]] | dict[str, np.ndarray]
                 | None = None,
                 completions: Callable[[], dict[str, np.ndarray]] | dict[str, np.ndarray]
                 | None = None, key_tokens: int = 0,
                 program_id: np.ndarray | None = None):
        self.now_s = float(now_s)
        self.block_tokens = int(block_tokens)
        self.key_tokens = int(key_tokens)
        self.n_replicas = int(n_replicas)
        self.phase = phase
        # request arrays are wrapped read-only on first access (most routers read few)
        self._src = {"request": request, "arrival_s": arrival_s,
                     "prompt_tokens": prompt_tokens, "tenant": tenant,
                     "session_id": session_id, "predicted_lo": predicted_lo,
                     "predicted_hi": predicted_hi, "output_tokens": output_tokens,
                     "program_id": program_id}
        self._n = int(len(request))
        self._keys = block_keys
        self._state_fn = replica_state
        self._state: dict[str, np.ndarray] | None = None
        self._cached_src = cached_tokens
        self._load_src = load_state
        self._done_src = completions

    @property
    def block_keys(self) -> tuple[np.ndarray, ...]:
        """Per arriving request, the chained hashes of its prefix blocks (int64 arrays)."""
        if callable(self._keys):
            self._keys = tuple(readonly(k, np.int64) for k in self._keys())
        return self._keys

    _DTYPES = {"request": np.int64, "arrival_s": np.float64, "prompt_tokens": np.int64,
               "tenant": np.int64, "session_id": np.int64, "predicted_lo": np.int64,
               "predicted_hi": np.int64, "output_tokens": np.int64, "program_id": np.int64}

    def __getattr__(self, name: str) -> Any:
        src = self.__dict__.get("_src")
        if src is None or name not in src:
            raise AttributeError(f"RouterView has no field {name!r}")
        v = src[name]
        v = None if v is None else readonly(v, self._DTYPES[name])
        self.__dict__[name] = v
        return v

    def __len__(self) -> int:
        return self._n

    def none_fields(self) -> list[str]:
        """The request fields that are ``None`` in this view (not shown to the policy)."""
        return [k for k, v in self._src.items() if v is None]

    def _replica(self, name: str) -> np.ndarray:
        """One replica field, converted on its first access (a router reads few)."""
        state = self._state
        if state is None:
            raw = self._state_fn() if callable(self._state_fn) else self._state_fn
            missing = [k for k in self._REPLICA_FIELDS if k not in raw]
            if missing:
                raise ValueError(f"RouterView.replica_state lacks the fields {missing}")
            self._raw = raw
            self._state = state = {}
            self._state_fn = None  # never keep the simulator alive through a stored view
        v = state.get(name)
        if v is None:
            raw = self._raw
            if name == "max_prompt_tokens":
                mp = raw.get("max_prompt_tokens")
                v = readonly(self._replica("total_blocks") * self.block_tokens - 1
                             if mp is None else mp, np.int64)
            else:
                v = readonly(raw[name], np.int64)
            state[name] = v
        return v

    def _lazy(self, key: str, per_entry: bool = False) -> Any:
        """The provided value of ``key`` (a callable is called once), made read-only
        (a dict's entries at once, or with ``per_entry`` on their first read)."""
        done = self.__dict__.setdefault("_resolved", {})
        if key not in done:
            src = getattr(self, key)
            raw = src() if callable(src) else src
            setattr(self, key, None)  # never keep the simulator alive through a view
            if raw is None:
                val = None
            elif isinstance(raw, dict):
                val = dict(raw) if per_entry else {k: readonly(v) for k, v in raw.items()}
            else:
                val = readonly(raw, np.int64)
            done[key] = val
        return done[key]

    @property
    def cached_tokens(self) -> np.ndarray | None:
        """``(n_arriving, n_replicas)`` int64: cached prompt tokens of each arriving request
        on each replica (None if not provided)."""
        v = self._lazy("_cached_src")
        if v is not None and v.shape != (self._n, self.n_replicas):
            raise ValueError(f"RouterView.cached_tokens must have shape "
                             f"({self._n}, {self.n_replicas}), got {v.shape}")
        return v

    def _load(self, name: str) -> np.ndarray | None:
        """Load field ``name``, read-only int64 on its first read (None if not given)."""
        done = self.__dict__.setdefault("_loaded", {})
        if name not in done:
            v = self._lazy("_load_src", per_entry=True)
            done[name] = None if v is None or name not in v else readonly(v[name], np.int64)
        return done[name]

    prefill_tokens = property(lambda self: self._load("prefill_tokens"),
                              doc="(n_replicas,) int64 prompt tokens still to prefill, or None")
    prefill_square_tokens = property(
        lambda self: self._load("prefill_square_tokens"),
        doc="(n_replicas,) int64 sum of end^2 - start^2 over the prefills still to run, or None")
    cached_blocks = property(lambda self: self._load("cached_blocks"),
                             doc="(n_replicas,) int64 blocks in each prefix cache, or None")

    @property
    def completions(self) -> dict[str, np.ndarray] | None:
        """Requests finished since the previous call (``request``, ``replica``, ``ttft_s``,
        ``tpot_s``, ``output_tokens`` arrays of one length), or None if not provided."""
        return self._lazy("_done_src")

    outstanding = property(lambda self: self._replica("outstanding"))
    waiting = property(lambda self: self._replica("waiting"))
    running = property(lambda self: self._replica("running"))
    used_blocks = property(lambda self: self._replica("used_blocks"))
    total_blocks = property(lambda self: self._replica("total_blocks"))
    max_prompt_tokens = property(lambda self: self._replica("max_prompt_tokens"))

    def fits(self) -> np.ndarray:
        """``(n_arriving, n_replicas)`` bool: whether each replica can hold each arriving
        prompt (``prompt_tokens <= max_prompt_tokens``)."""
        return self.prompt_tokens[:, None] <= self.max_prompt_tokens[None, :]

