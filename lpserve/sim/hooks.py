"""The Python side of the compiled replica's pauses for an evictor, a preemption decider, a
budget controller or a speculation decider written in Python (:mod:`lpserve.sim._evict_kernels`,
:mod:`lpserve.sim._swap_kernels`, :mod:`lpserve.sim._step_kernels`).

A :class:`~lpserve.sim.compiled.CompiledReplica` whose policy has such a role without a
compiled twin registers itself here (:func:`register`) and stores the key it gets in its
configuration (``C_HOOK``). Its kernels then call :func:`evict` and :func:`observe` for
its evictor, :func:`preemption_mode` for its preemption decider, :func:`budget`,
:func:`observe_iteration`, :func:`decode_limit` and :func:`observe_decode_run` for its
budget controller, and :func:`spec_choose` and :func:`spec_observe` for its speculation
decider, with the replica's arrays; each builds the role's view
(:mod:`lpserve.sim.views`) with the compiled pool's int64 prefix keys and checks the
answer with the contract's checks (:mod:`lpserve.policy.checks`). A replica is held
weakly: it leaves the registry with its run.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any

import numpy as np

from lpserve.arrays import readonly
from lpserve.policy import EvictorView, RequestEvent, StepResult
from lpserve.policy.checks import check_arm, check_evictions, check_preemption_choice
from lpserve.sim import _pool as P
from lpserve.sim import views as V
from lpserve.sim.speculative import step_context

__all__ = ["ask_evictor", "budget", "decode_limit", "evict", "log_iteration", "observe",
           "observe_decode_run", "observe_iteration", "preemption_mode", "register",
           "spec_choose", "spec_observe"]

#: preemption modes by their kernel codes (``_state_kernels.PRE_*``)
_MODE_CODES = {"recompute": 0, "swap": 1, "compress-swap": 2}

_REPLICAS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_KEYS = itertools.count(1)


def register(replica: Any) -> int:
    """A new key (> 0) under which the kernels find ``replica`` (a ``CompiledReplica``)."""
    key = next(_KEYS)
    _REPLICAS[key] = replica
    return key


def ask_evictor(evictor: Any, view: EvictorView, need: int, who: str) -> np.ndarray:
    """Positions into ``view.block`` of the ``need`` blocks ``evictor`` gives up, checked
    (distinct, in range, exactly ``need``: a :class:`~lpserve.policy.PolicyError` naming
    ``who`` otherwise); int64 ``(need,)``."""
    return check_evictions(evictor.evict(view, int(need)), int(need), int(view.block.size),
                           who)


def evict(key: int, need: int, now_s: float, slots: np.ndarray, parent: np.ndarray,
          children: np.ndarray, queued: np.ndarray) -> np.ndarray:
    """Slots (int64 ``(need,)``) of the ``need`` evictable blocks that the evictor of
    replica ``key`` gives up at ``now_s`` (s).

    ``slots``: the evictable blocks in ascending slot order; ``parent``: each one's
    position among them of its cached parent (-1: none evictable); ``children``: its cached
    children; ``queued``: slots the first waiting requests would hit (read only when the
    evictor ``reads_queue``). A wrong answer raises the contract's
    :class:`~lpserve.policy.PolicyError`."""
    rep = _REPLICAS[key]
    ev = rep.ctx.policy.evictor
    pool = rep.pool
    si, sf = pool.si, pool.sf
    view = EvictorView(
        now_s=float(now_s), replica=rep.index, block=readonly(slots),
        last_access_s=readonly(sf[P.F_LAST, slots]), hits=readonly(si[P.S_HITS, slots]),
        depth=readonly(si[P.S_DEPTH, slots]), created_s=readonly(sf[P.F_CREATED, slots]),
        children=readonly(children),
        parent=readonly(parent) if getattr(ev, "reads_tree", True) else None,
        turn_gap_s=readonly(sf[P.F_GAP, slots]),
        queued=(readonly(np.isin(slots, queued)) if getattr(ev, "reads_queue", False)
                else None),
        thread=readonly(si[P.S_THREAD, slots]), wait_kind=readonly(si[P.S_WAIT, slots]),
        block_tokens=rep.bt,
        key=tuple(si[P.S_KEY, slots].tolist()) if getattr(ev, "reads_keys", False) else None)
    return slots[ask_evictor(ev, view, need, rep.ctx.who("evictor"))]


def observe(key: int, kind: int, i: int, now_s: float, keys: np.ndarray) -> None:
    """Tell the evictor of replica ``key`` that request ``i`` arrived there (``kind`` 0)
    or finished (1) at ``now_s`` (s); ``keys``: at a finish, its full prompt blocks'
    content keys."""
    rep = _REPLICAS[key]
    S, fin = rep.S, kind == 1
    p = int(S.prompt[i])
    rep.ctx.policy.evictor.observe(RequestEvent(
        "finish" if fin else "arrive", float(now_s), rep.index, int(i), int(S.thread[i]),
        int(S.wait[i]) if fin else -1, p, p + int(S.gen[i]) if fin else p, rep.bt,
        int(rep.pool.ist[P.P_TOTAL]), tuple(keys.tolist()) if fin else ()))


def preemption_mode(key: int, v: int, held: int) -> int:
    """The kernel code of the mode that the preemption decider of replica ``key`` chooses
    for victim ``v`` holding ``held`` blocks (its answer checked by the contract)."""
    rep = _REPLICAS[key]
    view = V.preemption_view(
        now_s=rep.now, replica=rep.index, request=int(v),
        context_tokens=int(rep.S.computed[v]), held_blocks=int(held), block_tokens=rep.bt,
        host_free_blocks=rep.host_free, eng=rep.eng, cost=rep.cost, params=rep.params)
    mode = rep.eng.preemption_decider.decide(view)
    return _MODE_CODES[check_preemption_choice(mode, rep.ctx.who("preemption_decider"))]


# ------------------------------------------------------------ a budget controller in Python
_RUN_VIEWS: dict[int, Any] = {}  # the decode-run view of each replica's run in progress


def budget(key: int, decodes: np.ndarray, cap: int) -> int:
    """The prefill token budget that the controller of replica ``key`` sets for its next
    decode-first iteration with ``decodes`` (int64 request ids) and at most ``cap``
    prefill tokens (the scheduler's ranks of this step are in the request arrays)."""
    rep = _REPLICAS[key]
    return int(rep.ctx.policy.engine.budget_controller.budget(
        V.budget_view(rep, decodes.tolist(), int(cap))))


def observe_iteration(key: int, dt_s: float, chunk_tokens: np.ndarray,
                      chunk_cached: np.ndarray, decode_context: np.ndarray,
                      produced: np.ndarray) -> None:
    """Tell the controller of replica ``key`` of the iteration it just ran (``dt_s``
    seconds; the prefill chunks' tokens and cached tokens, the decodes' contexts before it,
    the requests that produce a token in it)."""
    rep = _REPLICAS[key]
    rep.ctx.policy.engine.budget_controller.observe(V.iteration_view(
        rep, float(dt_s), chunk_tokens, chunk_cached, decode_context, produced.tolist()))


def decode_limit(key: int, request: np.ndarray, context: np.ndarray, held: np.ndarray,
                 max_iters: int) -> int:
    """Most iterations of the decode run of ``request`` (their contexts and held blocks)
    that replica ``key`` starts now, as its controller allows (at most ``max_iters``)."""
    rep = _REPLICAS[key]
    view = _RUN_VIEWS[key] = V.decode_run_view(rep, request, context, held, int(max_iters))
    return int(rep.ctx.policy.engine.budget_controller.decode_limit(view))


def observe_decode_run(key: int, n_iters: int) -> None:
    """Tell the controller of replica ``key`` that its decode run ran ``n_iters``."""
    rep = _REPLICAS[key]
    rep.ctx.policy.engine.budget_controller.observe_decode_run(_RUN_VIEWS.pop(key),
                                                              int(n_iters))


# ------------------------------------------------------ a speculation decider in Python
_STEP_CONTEXTS: dict[int, Any] = {}  # the StepContext of each replica's speculative step


def spec_choose(key: int, request: np.ndarray, context: np.ndarray, lag: np.ndarray) -> int:
    """The arm the speculation decider of replica ``key`` plays at a speculative step of
    the decode batch ``request`` (int64 ids; their contexts and draft lags), from the
    :class:`~lpserve.policy.StepContext` of the step, checked by the contract's check."""
    rep = _REPLICAS[key]
    run = rep.ctx.spec
    ctx = _STEP_CONTEXTS[key] = step_context(run, rep.key, rep.ctx.state.tenant, request,
                                             context, lag)
    return check_arm(run.decider.choose(ctx), len(run.decider.arms), run.who)


def spec_observe(key: int, arm: int, k: int, accepted: np.ndarray, emitted: int,
                 dt_s: float) -> None:
    """Tell a learning speculation decider of replica ``key`` what its step did: the arm
    played, the drafts drawn ``k``, the accepted drafts per sequence, and the reward of
    eq. (10) from the tokens ``emitted`` in ``dt_s`` seconds."""
    rep = _REPLICAS[key]
    ctx = _STEP_CONTEXTS.pop(key)
    dec = rep.ctx.spec.decider
    if dec.learns:
        reward = min(1.0, float(emitted) / float(dt_s) / ctx.reward_bound)
        dec.observe(ctx, StepResult(arm=int(arm), k=int(k), accepted=readonly(accepted),
                                    reward=reward))


# ------------------------------------------------------------- the reference mode's log
def log_iteration(key: int, t0_s: float, dt_s: float, chunk_request: np.ndarray,
                  chunk_tokens: np.ndarray, chunk_context: np.ndarray,
                  decodes: np.ndarray) -> None:
    """Append an iteration of replica ``key`` to its run's ``iteration_log``, read before
    its tokens are counted: ``(replica key, t0_s, t1_s, chunks, decodes)`` with ``chunks``
    ``(request, tokens, context before the chunk, generated before)`` and ``decodes``
    ``(request, context, generated before)``."""
    rep = _REPLICAS[key]
    S = rep.S
    chunks = [(int(i), int(c), int(h), int(S.gen[i]))
              for i, c, h in zip(chunk_request, chunk_tokens, chunk_context)]
    dec = [(int(i), int(S.computed[i]), int(S.gen[i])) for i in decodes]
    rep.ctx.iteration_log.append((rep.key, float(t0_s), float(t0_s + dt_s), chunks, dec))
