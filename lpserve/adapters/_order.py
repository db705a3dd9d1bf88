"""Engine-independent core of the engine adapters: policy resolution, view building from
plain request records, ordering by rank, error wrapping and view recording.

Nothing here imports an engine, so the logic every adapter relies on is tested without
vLLM or Vidur installed (``tests/unit/adapters``). An adapter turns the engine's request
objects into :class:`RequestRecord` rows, calls :func:`rank_order`, and applies the
returned order to the engine's queues.

Ordering rule (the same in every adapter): candidates are sorted by rank, lowest first,
with ties kept in the order the engine listed them (a stable sort, so equal ranks keep
the engine's own FCFS order). A waiting candidate ranked ``+inf`` is held back: it stays
queued but is not offered to the engine at this step.
"""
from __future__ import annotations

import importlib
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

import numpy as np

from lpserve.policy import (
    Policy,
    PolicyError,
    RoundRobin,
    Router,
    RouterView,
    Scheduler,
    SchedulerView,
)

CONFIG_POLICY_KEY = "lpserve_policy"
CONFIG_PARAMS_KEY = "lpserve_params"
ENV_POLICY = "LPSERVE_POLICY"
ENV_PARAMS = "LPSERVE_POLICY_PARAMS"
ENV_RECORD = "LPSERVE_RECORD_VIEWS"


class AdapterError(ValueError):
    """The adapter was configured with something unusable; the message names the key and
    the value."""


# ================================================================================ records
@dataclass(frozen=True)
class RequestRecord:
    """One scheduling candidate as an engine describes it (plain values, no engine types).

    Attributes:
        request: integer id of the request (stable for the request's lifetime).
        arrival_s: arrival time (s, engine clock).
        prompt_tokens: prompt length (tokens).
        generated_tokens: output tokens produced so far.
        computed_tokens: tokens whose KV is computed now.
        cached_tokens: prompt tokens expected from the prefix cache at admission.
        running: in the running batch (True) or waiting (False).
        preemptions: times preempted so far.
        first_scheduled_s: when it first ran (NaN if never).
        swapped: KV in host memory.
        tenant, session_id: ids or -1.
    """

    request: int
    arrival_s: float
    prompt_tokens: int
    generated_tokens: int = 0
    computed_tokens: int = 0
    cached_tokens: int = 0
    running: bool = False
    preemptions: int = 0
    first_scheduled_s: float = math.nan
    swapped: bool = False
    tenant: int = -1
    session_id: int = -1

    def __post_init__(self) -> None:
        for k in ("prompt_tokens", "generated_tokens", "computed_tokens", "cached_tokens",
                  "preemptions"):
            v = getattr(self, k)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise AdapterError(f"RequestRecord.{k} must be a non-negative integer, "
                                   f"got {v!r} (request {self.request!r})")
        if not math.isfinite(float(self.arrival_s)):
            raise AdapterError(f"RequestRecord.arrival_s must be finite, got "
                               f"{self.arrival_s!r} (request {self.request!r})")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["first_scheduled_s"] = None if math.isnan(self.first_scheduled_s) else \
            self.first_scheduled_s
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RequestRecord":
        known = {f.name for f in fields(cls)}
        bad = sorted(set(d) - known)
        if bad:
            raise AdapterError(f"RequestRecord: unknown field(s) {bad}; known: {sorted(known)}")
        d = dict(d)
        if d.get("first_scheduled_s") is None:
            d["first_scheduled_s"] = math.nan
        return cls(**d)


def build_view(records: Sequence[RequestRecord], *, now_s: float, replica: int = 0,
               free_blocks: int = 0, total_blocks: int = 0,
               block_tokens: int = 16) -> SchedulerView:
    """A non-clairvoyant :class:`SchedulerView` of ``records`` (in the given order)."""
    return view_from_columns(
        {name: [getattr(r, name) for r in records] for name in VIEW_COLUMNS},
        now_s=now_s, replica=replica, free_blocks=free_blocks, total_blocks=total_blocks,
        block_tokens=block_tokens)


#: per-candidate columns of a view built by an adapter, with their dtypes
VIEW_COLUMNS: dict[str, Any] = {
    "request": np.int64, "arrival_s": np.float64, "prompt_tokens": np.int64,
    "generated_tokens": np.int64, "computed_tokens": np.int64, "cached_tokens": np.int64,
    "running": bool, "swapped": bool, "preemptions": np.int64,
    "first_scheduled_s": np.float64, "tenant": np.int64, "session_id": np.int64}
_DEFAULTS = {"cached_tokens": 0, "swapped": False, "tenant": -1, "session_id": -1}


def view_from_columns(cols: Mapping[str, Sequence[Any]], *, now_s: float, replica: int = 0,
                      free_blocks: int = 0, total_blocks: int = 0,
                      block_tokens: int = 16) -> SchedulerView:
    """A non-clairvoyant :class:`SchedulerView` from per-candidate columns (the fast path
    an adapter takes every engine step). Columns in :data:`VIEW_COLUMNS`;
    ``cached_tokens``, ``swapped``, ``tenant`` and ``session_id`` may be left out."""
    bad = sorted(set(cols) - set(VIEW_COLUMNS))
    if bad:
        raise AdapterError(f"view columns: unknown {bad}; known: {list(VIEW_COLUMNS)}")
    n = len(cols["request"])
    arrays = {}
    for name, dtype in VIEW_COLUMNS.items():
        if name in cols:
            a = np.array(cols[name], dtype=dtype)
            if a.shape != (n,):
                raise AdapterError(f"view column {name!r} has {a.shape[0] if a.ndim else 0} "
                                   f"values, expected {n}")
        elif name in _DEFAULTS:
            a = np.full(n, _DEFAULTS[name], dtype=dtype)
        else:
            raise AdapterError(f"view column {name!r} is missing")
        a.setflags(write=False)
        arrays[name] = a
    return SchedulerView(
        now_s=float(now_s), replica=int(replica), **arrays,
        predicted_lo=None, predicted_hi=None, output_tokens=None,
        free_blocks=int(free_blocks), total_blocks=int(total_blocks),
        block_tokens=int(block_tokens))


def records_from_view(view: SchedulerView) -> list[RequestRecord]:
    """The candidates of ``view`` as :class:`RequestRecord` rows (for recording)."""
    return [RequestRecord(request=int(view.request[k]), arrival_s=float(view.arrival_s[k]),
                          prompt_tokens=int(view.prompt_tokens[k]),
                          generated_tokens=int(view.generated_tokens[k]),
                          computed_tokens=int(view.computed_tokens[k]),
                          cached_tokens=int(view.cached_tokens[k]),
                          running=bool(view.running[k]), preemptions=int(view.preemptions[k]),
                          first_scheduled_s=float(view.first_scheduled_s[k]),
                          swapped=bool(view.swapped[k]), tenant=int(view.tenant[k]),
                          session_id=int(view.session_id[k]))
            for k in range(len(view))]


# ================================================================================ ranking
def checked_ranks(scheduler: Scheduler, view: SchedulerView, policy_name: str) -> np.ndarray:
    """``scheduler.rank(view)`` as float64, or :class:`PolicyError` naming the policy.

    An exception raised inside the policy is re-raised as :class:`PolicyError` (chained to
    the original) so the engine stops with the policy's name; nothing falls back to
    another order.
    """
    try:
        raw = scheduler.rank(view)
    except Exception as exc:
        raise PolicyError(f"lpserve policy {policy_name!r}: rank() raised "
                          f"{type(exc).__name__}: {exc}") from exc
    r = np.asarray(raw)
    n = len(view)
    if r.shape != (n,):
        raise PolicyError(f"lpserve policy {policy_name!r}: rank() returned shape {r.shape}, "
                          f"expected ({n},) (one value per candidate)")
    if r.dtype.kind not in "iuf":
        raise PolicyError(f"lpserve policy {policy_name!r}: rank() returned non-numeric "
                          f"dtype {r.dtype}")
    r = r.astype(np.float64)
    if np.isnan(r).any():
        bad = int(np.flatnonzero(np.isnan(r))[0])
        raise PolicyError(f"lpserve policy {policy_name!r}: rank() returned NaN for request "
                          f"{int(view.request[bad])}")
    if np.isneginf(r).any():
        bad = int(np.flatnonzero(np.isneginf(r))[0])
        raise PolicyError(f"lpserve policy {policy_name!r}: rank() returned -inf for request "
                          f"{int(view.request[bad])}; use a finite value (+inf holds back)")
    return r


def order_by_rank(ranks: np.ndarray) -> np.ndarray:
    """Positions sorted by rank, lowest first; ties keep their given order (stable)."""
    return np.argsort(np.asarray(ranks, dtype=np.float64), kind="stable").astype(np.int64)


@dataclass(frozen=True)
class Decision:
    """Result of one ranking: ``ranks`` aligned with the records given; ``waiting`` and
    ``running`` are positions into those records in the order to apply; ``held`` are
    waiting positions ranked ``+inf`` (held back this step)."""

    ranks: np.ndarray
    waiting: np.ndarray
    running: np.ndarray
    held: np.ndarray


def rank_order(scheduler: Scheduler, records: Sequence[RequestRecord], policy_name: str,
               **view_kw: Any) -> Decision:
    """Rank ``records`` (waiting and running together, one view) and split the order."""
    return decide(scheduler, build_view(records, **view_kw), policy_name)


def decide(scheduler: Scheduler, view: SchedulerView, policy_name: str) -> Decision:
    """Rank ``view`` and split the stable rank order into waiting, running and held."""
    ranks = checked_ranks(scheduler, view, policy_name)
    order = order_by_rank(ranks)
    running = view.running[order]
    finite = np.isfinite(ranks[order])
    return Decision(ranks=ranks, waiting=order[~running & finite],
                    running=order[running], held=order[~running & ~finite])


# ================================================================================ policies
def _policy_names() -> list[str]:
    from lpserve.registry import policy_names

    return policy_names()


def resolve_policy(spec: Any, params: Mapping[str, Any] | None = None) -> Any:
    """The object named by ``spec``: a :class:`Policy`, :class:`Scheduler` or
    :class:`Router`.

    ``spec`` is a registered policy name (``lpserve.registry``; ``params`` go to its
    factory), or ``"module:attr"`` where ``attr`` is a Policy, Scheduler or Router
    instance, or a factory returning one (called with ``params``).
    """
    params = dict(params or {})
    if not isinstance(spec, str) or not spec.strip():
        raise AdapterError(f"{CONFIG_POLICY_KEY} must be a policy name or 'module:attr', "
                           f"got {spec!r}")
    spec = spec.strip()
    if ":" not in spec:
        from lpserve.registry import POLICIES, make_policy

        if spec not in POLICIES:
            raise AdapterError(f"unknown lpserve policy {spec!r}; registered: "
                               f"{', '.join(_policy_names())} (or give 'module:attr')")
        try:
            return make_policy(spec, **params)
        except (TypeError, ValueError, KeyError) as exc:
            raise AdapterError(f"lpserve policy {spec!r}: bad {CONFIG_PARAMS_KEY} "
                               f"{params!r}: {exc}") from exc
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise AdapterError(f"lpserve policy {spec!r}: cannot import module "
                           f"{mod_name!r}: {exc}") from exc
    if not hasattr(mod, attr):
        raise AdapterError(f"lpserve policy {spec!r}: module {mod_name!r} has no "
                           f"attribute {attr!r}")
    obj = getattr(mod, attr)
    if isinstance(obj, (Scheduler, Policy, Router)):
        if params:
            raise AdapterError(f"lpserve policy {spec!r} is an instance and takes no "
                               f"{CONFIG_PARAMS_KEY}, got {params!r}")
        return obj
    if not callable(obj):
        raise AdapterError(f"lpserve policy {spec!r} is {obj!r}, not a Policy, Scheduler, "
                           "Router or factory")
    try:
        out = obj(**params)
    except (TypeError, ValueError, KeyError) as exc:
        raise AdapterError(f"lpserve policy {spec!r}: factory rejected "
                           f"{CONFIG_PARAMS_KEY} {params!r}: {exc}") from exc
    if not isinstance(out, (Scheduler, Policy, Router)):
        raise AdapterError(f"lpserve policy {spec!r}: factory returned {out!r}, not a "
                           "Policy, Scheduler or Router")
    return out


def resolve_scheduler(spec: Any, params: Mapping[str, Any] | None = None) -> Scheduler:
    """The :class:`Scheduler` of the policy named by ``spec`` (see :func:`resolve_policy`);
    clairvoyant schedulers are refused (an engine cannot know output lengths)."""
    obj = resolve_policy(spec, params)
    sched = obj.scheduler if isinstance(obj, Policy) else obj
    if not isinstance(sched, Scheduler):
        raise AdapterError(f"lpserve policy {spec!r} gave {sched!r}, not a Scheduler or Policy")
    if sched.meta.clairvoyant:
        raise AdapterError(f"lpserve policy {spec!r} is clairvoyant (needs true output "
                           "lengths), which a serving engine cannot provide")
    return sched


def resolve_router(spec: Any, params: Mapping[str, Any] | None = None) -> Router:
    """The :class:`Router` of the policy named by ``spec`` (a Policy's router, a Router,
    or — for a bare Scheduler — round robin)."""
    obj = resolve_policy(spec, params)
    if isinstance(obj, Policy):
        router = obj.router
    elif isinstance(obj, Scheduler):
        router = RoundRobin()
    else:
        router = obj
    if router.meta.clairvoyant:
        raise AdapterError(f"lpserve policy {spec!r} has a clairvoyant router (needs true "
                           "output lengths), which a serving engine cannot provide")
    return router


def checked_routes(router: Router, view: RouterView, policy_name: str) -> np.ndarray:
    """``router.route(view)`` as int64 replica indices in ``[0, n_replicas)``, or
    :class:`PolicyError` naming the policy (exceptions inside the router included)."""
    try:
        raw = router.route(view)
    except Exception as exc:
        raise PolicyError(f"lpserve policy {policy_name!r}: route() raised "
                          f"{type(exc).__name__}: {exc}") from exc
    out = np.asarray(raw)
    n = len(view)
    if out.shape != (n,):
        raise PolicyError(f"lpserve policy {policy_name!r}: route() returned shape "
                          f"{out.shape}, expected ({n},)")
    if out.dtype.kind == "f":
        if np.isnan(out).any() or np.any(out != np.round(out)):
            raise PolicyError(f"lpserve policy {policy_name!r}: route() returned NaN or "
                              f"non-integer replicas {out.tolist()}")
    elif out.dtype.kind not in "iu":
        raise PolicyError(f"lpserve policy {policy_name!r}: route() returned dtype "
                          f"{out.dtype}, expected integers")
    out = out.astype(np.int64)
    bad = out[(out < 0) | (out >= view.n_replicas)]
    if bad.size:
        raise PolicyError(f"lpserve policy {policy_name!r}: route() returned replica "
                          f"{int(bad[0])} outside [0, {view.n_replicas})")
    return out


def _params(raw: Any, where: str) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise AdapterError(f"{where} must be a JSON object, got {raw!r}: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise AdapterError(f"{where} must be a JSON object (dict), got {raw!r}")
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        raise AdapterError(f"{where} keys must be strings, got {bad!r}")
    return dict(raw)


def policy_spec(config: Mapping[str, Any] | None,
                environ: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """``(policy, params)`` from an engine's free-form config dict, else the environment.

    ``config[CONFIG_POLICY_KEY]`` / ``config[CONFIG_PARAMS_KEY]`` win over
    ``$LPSERVE_POLICY`` / ``$LPSERVE_POLICY_PARAMS`` (JSON). Neither set is an error: the
    adapter never guesses a policy.
    """
    env = os.environ if environ is None else environ
    config = dict(config or {})
    if config.get(CONFIG_POLICY_KEY):
        return config[CONFIG_POLICY_KEY], _params(config.get(CONFIG_PARAMS_KEY),
                                                 f"additional_config[{CONFIG_PARAMS_KEY!r}]")
    if CONFIG_PARAMS_KEY in config:
        raise AdapterError(f"additional_config has {CONFIG_PARAMS_KEY!r} but no "
                           f"{CONFIG_POLICY_KEY!r}")
    if env.get(ENV_POLICY):
        return env[ENV_POLICY], _params(env.get(ENV_PARAMS), f"${ENV_PARAMS}")
    raise AdapterError(f"no lpserve policy configured: set additional_config "
                       f'{{"{CONFIG_POLICY_KEY}": NAME, "{CONFIG_PARAMS_KEY}": {{...}}}} or '
                       f"${ENV_POLICY} (and ${ENV_PARAMS} as JSON); registered policies: "
                       f"{', '.join(_policy_names())}")


# ================================================================================ recording
class ViewRecorder:
    """Appends every ranking (records, scalars, ranks, applied order) to a JSON-lines file,
    for replay in parity tests. ``path=None`` records nothing."""

    def __init__(self, path: str | os.PathLike[str] | None, *, engine: str, policy: str,
                 params: Mapping[str, Any]):
        self.path = None if path in (None, "") else os.fspath(path)
        self.head = {"engine": engine, "policy": policy, "params": dict(params)}

    def record(self, records: Sequence[RequestRecord], view_kw: Mapping[str, Any],
               decision: Decision, applied: Mapping[str, Any] | None = None) -> None:
        """Append one ranking; ``applied`` holds what the adapter read back from the
        engine's queues after reordering (request ids, in queue order)."""
        if self.path is None:
            return
        row = {**self.head, "view": dict(view_kw),
               "records": [r.to_json() for r in records],
               "ranks": [x if math.isfinite(x) else None for x in decision.ranks.tolist()],
               "waiting_order": decision.waiting.tolist(),
               "running_order": decision.running.tolist(), "held": decision.held.tolist()}
        if applied is not None:
            row["applied"] = dict(applied)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")


def load_recorded(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows written by :class:`ViewRecorder` (``ranks`` with ``None`` read as ``+inf``)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                row["ranks"] = [math.inf if x is None else x for x in row["ranks"]]
                row["records"] = [RequestRecord.from_json(r) for r in row["records"]]
                rows.append(row)
    return rows
