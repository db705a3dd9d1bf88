"""The one check of what each role and hook returns, used by the simulator and by the
engine adapters alike.

Each ``check_*`` takes the raw value a policy returned, the size it must have and ``who``
(the text that names the policy and role in the error, e.g. ``"policy 'las' (scheduler
'las')"``), and returns the value as a clean array or raises :class:`PolicyError`.

Ranks: lower runs first; ``+inf`` holds a candidate back; ``-inf`` is an ordinary rank
that runs before every finite one (ties, at any value, keep queue order); NaN and
non-numeric values are refused.
"""
from __future__ import annotations

import linecache
import re
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np

from lpserve.policy.hooks import PREEMPTION_CHOICES, Prediction
from lpserve.policy.roles import PolicyError, Role
from lpserve.policy.views import EvictorView, RouterView, SchedulerView

__all__ = ["HIDDEN_FIELDS", "check_arm", "check_evictions", "check_migrations",
           "check_prediction", "check_preemption_choice", "check_ranks", "check_routes",
           "explain_policy_error"]


def check_ranks(raw: Any, n: int, who: str, request: np.ndarray | None = None) -> np.ndarray:
    """``rank()``'s result as float64 ``(n,)``: numbers, no NaN (``±inf`` allowed).

    ``request`` (the view's request ids) lets the error name the offending request.
    """
    r = np.asarray(raw)
    if r.shape != (n,):
        raise PolicyError(f"{who}: rank() returned shape {r.shape}, expected ({n},) "
                          "(one value per candidate)")
    if r.dtype.kind not in "iuf":
        raise PolicyError(f"{who}: rank() returned non-numeric values (dtype {r.dtype})")
    r = r.astype(np.float64, copy=False)
    nan = np.isnan(r)
    if nan.any():
        k = int(np.flatnonzero(nan)[0])
        at = f"request {int(request[k])}" if request is not None else f"candidate {k}"
        raise PolicyError(f"{who}: rank() returned NaN for {at}")
    return r


def check_routes(raw: Any, n: int, n_replicas: int, who: str) -> np.ndarray:
    """``route()``'s result as int64 ``(n,)`` replica indices in ``[0, n_replicas)``
    (integral floats are accepted)."""
    out = raw if isinstance(raw, np.ndarray) else np.asarray(raw)
    if out.shape != (n,):
        raise PolicyError(f"{who}: route() returned shape {out.shape}, expected ({n},)")
    if out.dtype.kind == "f":
        if np.isnan(out).any() or np.any(out != np.round(out)):
            raise PolicyError(f"{who}: route() returned NaN or non-integer replicas "
                              f"{out.tolist()}")
    elif out.dtype.kind not in "iu":
        raise PolicyError(f"{who}: route() returned dtype {out.dtype}, expected integers")
    out = out.astype(np.int64, copy=False)
    bad = out[(out < 0) | (out >= n_replicas)]
    if bad.size:
        raise PolicyError(f"{who}: route() returned replica {int(bad[0])} outside "
                          f"[0, {n_replicas})")
    return out


def check_evictions(raw: Any, need: int, n_candidates: int, who: str) -> np.ndarray:
    """``evict()``'s result as int64 ``(need,)`` distinct positions into the candidates."""
    pos = np.asarray(raw)
    if pos.shape != (need,) or (pos.size and pos.dtype.kind not in "iu"):
        raise PolicyError(f"{who}: evict() returned shape {pos.shape} dtype {pos.dtype}, "
                          f"expected ({need},) integer positions")
    pos = pos.astype(np.int64, copy=False)
    if pos.size and (pos.min() < 0 or pos.max() >= n_candidates
                     or np.unique(pos).size != pos.size):
        raise PolicyError(f"{who}: evict() returned out-of-range or repeated positions "
                          f"(candidates: {n_candidates})")
    return pos


def check_migrations(raw: Any, request: np.ndarray, replica: np.ndarray, n_requests: int,
                     n_replicas: int, who: str, status_of: Any = None) -> list[tuple[int, int]]:
    """``migrate()``'s result as ``(request, destination)`` pairs.

    ``request``/``replica`` are the view's candidates (running decodes) and their source
    replicas; ``status_of(i)`` (optional) names the status of a request that may not move.
    ``None`` or an empty array means no move.
    """
    if raw is None:
        return []
    a = np.asarray(raw)
    if a.size == 0:
        return []
    if a.ndim != 2 or a.shape[1] != 2 or a.dtype.kind not in "iu":
        raise PolicyError(f"{who}: migrate() returned shape {a.shape} dtype {a.dtype}, "
                          "expected (n_moves, 2) integer rows (request, destination)")
    where = dict(zip(np.asarray(request).tolist(), np.asarray(replica).tolist()))
    seen: set[int] = set()
    moves = []
    for i, d in a.tolist():
        if not 0 <= i < n_requests:
            raise PolicyError(f"{who}: migrate() named unknown request {i} (trace has "
                              f"{n_requests})")
        if i not in where:
            st = f" (status {status_of(i)})" if status_of is not None else ""
            raise PolicyError(f"{who}: request {i} is not a running decoding request{st}; "
                              "only those may migrate")
        if not 0 <= d < n_replicas:
            raise PolicyError(f"{who}: destination {d} of request {i} outside "
                              f"[0, {n_replicas})")
        if d == where[i]:
            raise PolicyError(f"{who}: request {i} is already on destination {d}")
        if i in seen:
            raise PolicyError(f"{who}: request {i} migrates twice in one decision")
        seen.add(i)
        moves.append((int(i), int(d)))
    return moves


def check_preemption_choice(choice: Any, who: str) -> str:
    """``decide()``'s result: one of :data:`~lpserve.policy.hooks.PREEMPTION_CHOICES`."""
    if not isinstance(choice, str) or choice not in PREEMPTION_CHOICES:
        raise PolicyError(f"{who}: decide() returned {choice!r}, expected one of "
                          f"{PREEMPTION_CHOICES}")
    return choice


def check_arm(j: Any, n_arms: int, who: str) -> int:
    """``choose()``'s result: an arm index in ``[0, n_arms)``."""
    if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 0 <= j < n_arms:
        raise PolicyError(f"{who}: choose() returned {j!r}, expected an arm index in "
                          f"[0, {n_arms})")
    return int(j)


def check_prediction(p: Any, n: int, who: str) -> tuple[np.ndarray, np.ndarray]:
    """``predict()``'s result as int64 ``(lo, hi)`` with ``1 <= lo <= hi``, shape ``(n,)``."""
    if not isinstance(p, Prediction):
        raise PolicyError(f"{who}: predict() returned {type(p).__name__}, expected a "
                          "Prediction")
    lo, hi = np.asarray(p.lo), np.asarray(p.hi)
    if lo.shape != (n,) or hi.shape != (n,) or lo.dtype.kind not in "iu" or \
            hi.dtype.kind not in "iu" or np.any(lo < 1) or np.any(hi < lo):
        raise PolicyError(f"{who}: predictions must be integer intervals 1 <= lo <= hi of "
                          f"shape ({n},), got lo={lo[:4]} hi={hi[:4]}")
    return lo.astype(np.int64, copy=False), hi.astype(np.int64, copy=False)


#: view fields that may be ``None`` and why a policy then cannot read them
HIDDEN_FIELDS = {
    "output_tokens": "true output lengths are shown only to clairvoyant policies (Meta("
                     "clairvoyant=True)); a non-clairvoyant policy never sees them: decide on "
                     "view.predicted_lo/hi (with a predictor) instead",
    "predicted_lo": "the trace carries no predicted output intervals and no predictor was "
                    "given (pass predictor=..., e.g. 'history', or use a trace with "
                    "predicted_lo/hi)",
    "predicted_hi": "the trace carries no predicted output intervals and no predictor was "
                    "given (pass predictor=..., e.g. 'history', or use a trace with "
                    "predicted_lo/hi)",
    "program_id": "the trace has no agentic programs (program_id)",
    "parent": "the trace has no parent calls (or, in an EvictorView, the view was built by "
              "hand without them, or the evictor's reads_tree is False)",
    "queued": "EvictorView.queued is filled only for evictors whose reads_queue is True",
    "key": "EvictorView.key is filled only for evictors whose reads_keys is True",
    "children": "the EvictorView was built by hand without it",
    "turn_gap_s": "the EvictorView was built by hand without it",
}
_VIEWS = (SchedulerView, RouterView, EvictorView)


def _none_fields(view: Any) -> list[str]:
    if isinstance(view, RouterView):
        return view.none_fields()
    if is_dataclass(view):
        return [f.name for f in fields(view) if getattr(view, f.name) is None]
    return []


def explain_policy_error(exc: BaseException) -> PolicyError | None:
    """A :class:`PolicyError` that says what a policy did wrong when ``exc`` was raised
    inside one of its decisions, or ``None`` when it was not.

    Two mistakes are recognized from the traceback: writing into a view (views are
    read-only numpy arrays: numpy raises "assignment destination is read-only") and using
    a view field that is ``None`` for this policy (``output_tokens`` for a non-clairvoyant
    policy, predictions on a trace without them; :data:`HIDDEN_FIELDS`). The message
    names the role, the field, the line and why.
    """
    if isinstance(exc, PolicyError) or not isinstance(exc, (ValueError, TypeError,
                                                            AttributeError)):
        return None
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    role = view = None
    for t in reversed(frames):
        loc = t.tb_frame.f_locals
        if role is None and isinstance(loc.get("self"), Role):
            role = loc["self"]
        if view is None:
            view = next((v for v in loc.values() if isinstance(v, _VIEWS)), None)
        if role is not None and view is not None:
            break
    if role is None or view is None:
        return None
    last = frames[-1]
    code = last.tb_frame.f_code
    line = linecache.getline(code.co_filename, last.tb_lineno).strip()
    at = f"{type(role).__name__} {role.name!r}, line {last.tb_lineno} of " \
         f"{code.co_filename.rsplit('/', 1)[-1]}: {line!r}"
    named = re.findall(r"\.([A-Za-z_]\w*)", line)
    text = str(exc)
    if isinstance(exc, ValueError) and "read-only" in text:
        field = next((f for f in named if hasattr(view, f)), None)
        what = f"view field {field!r}" if field else "a view array"
        return PolicyError(
            f"{at}: the policy wrote into {what} of its {type(view).__name__}: views are "
            "read-only numpy arrays that share the simulator's state; copy before changing "
            f"(x = np.array(view.{field or 'field'}))")
    if "NoneType" not in text:
        return None
    hidden = _none_fields(view)
    used = [f for f in named if f in hidden]
    if used:
        f = used[0]
        return PolicyError(f"{at}: view.{f} is None for this policy: "
                           f"{HIDDEN_FIELDS.get(f, 'the simulator did not fill it')}")
    if not hidden:
        return None
    why = "; ".join(f"{f}: {HIDDEN_FIELDS.get(f, 'not filled')}" for f in hidden)
    return PolicyError(f"{at}: {type(exc).__name__}: {text}; the {type(view).__name__} "
                       f"fields that are None for this policy: {why}")
