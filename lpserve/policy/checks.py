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

from typing import Any

import numpy as np

from lpserve.policy.hooks import PREEMPTION_CHOICES, Prediction
from lpserve.policy.roles import PolicyError

__all__ = ["check_arm", "check_evictions", "check_migrations", "check_prediction",
           "check_preemption_choice", "check_ranks", "check_routes"]


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
