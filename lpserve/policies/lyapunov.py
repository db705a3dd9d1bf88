"""Drift-plus-penalty (DPP) control of prefill and decode on one engine.

The controller (``models/lyapunov-pd.md``) treats each iteration as a slot. It keeps

* ``Q_c`` — waiting prefill tokens per class (real queues, eq. (3));
* ``Z_TBT`` — a virtual queue of token gaps slower than the time-between-tokens SLO,
  eq. (5), so that at most a fraction ``eps`` of gaps exceeds ``S_TBT`` (a percentile
  target: ``eps = 0.01`` enforces P99 TBT <= ``S_TBT``);
* ``Z_KV`` — a virtual queue of KV occupancy above ``theta``, eq. (6);

and before every decode-first iteration picks the prefill tokens ``u`` from the menu
``{0, grain, 2 grain, ...}`` that minimizes drift + V x penalty, eq. (9). The penalty
(eq. (7)) is the decode stall the prefill chunk adds: ``n_dec * (T(u) - T(0))`` seconds,
i.e. the sum over running decodes of the extra delay of their next token.

:class:`DPPController` is the engine hook (:class:`lpserve.policy.hooks.BudgetController`);
:class:`TBTRecorder` observes token gaps without deciding (to measure baselines);
:func:`constants` computes the proved constants (``proofs/lyapunov-dpp.md``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from lpserve.cost import iteration_time
from lpserve.kernels import dpp as K
from lpserve.policy import (
    LRU,
    BudgetController,
    BudgetView,
    Claim,
    DecodeRunView,
    EngineConfig,
    IterationView,
    Meta,
    Policy,
    RoundRobin,
    Scheduler,
    SchedulerView,
)

_PROOF = "proofs/lyapunov-dpp.md"
CLAIMS = (
    Claim("time-average stall penalty <= p* + B/V (slotted model, i.i.d. arrivals)", _PROOF,
          "tests/properties/test_lyapunov_dpp.py::test_penalty_and_backlog_within_bounds"),
    Claim("time-average backlog <= (B + V (p_max - p_min)) / epsilon", _PROOF,
          "tests/properties/test_lyapunov_dpp.py::test_penalty_and_backlog_within_bounds"),
    Claim("throughput-optimal (Li-Dai-Peng): stable when lambda (m_p + m_d) < b / t_b",
          _PROOF, "tests/slow/test_lyapunov_stability.py::test_knife_edge"),
)


class _RunState:
    """Controller state of one replica in one run."""

    def __init__(self, cp: np.ndarray, n_classes: int) -> None:
        self.st = np.zeros(K.N_ST, np.float64)
        self.last_tok = np.zeros(0)  # per request id (grown on demand; NaN: no token yet)
        self.q_class = np.zeros(n_classes, np.float64)
        self.q_tokens = 0.0
        self.u = 0
        self.cap = 0
        self.resumable = False
        self.plan_tokens = np.zeros(0, np.int64)
        self.plan_cached = np.zeros(0, np.int64)
        self.cp = cp
        self.params: np.ndarray | None = None  # the replica's cost parameters (writable copy)

    def last_tokens(self, ids: np.ndarray) -> np.ndarray:
        """Time of each request's last token (NaN if none), growing the table as needed."""
        if ids.size and int(ids.max()) >= self.last_tok.size:
            grown = np.full(max(int(ids.max()) + 1, 2 * self.last_tok.size), np.nan)
            grown[:self.last_tok.size] = self.last_tok
            self.last_tok = grown
        return self.last_tok[ids]

    def cost_params(self, view: Any) -> np.ndarray:
        if self.params is None:
            self.params = np.array(view.cost_params, np.float64)
        return self.params


class TBTRecorder(BudgetController):
    """Observes every iteration: token gaps (TBT samples) and the iteration statistics.

    Leaves the engine's budget unchanged. After a run, :meth:`report` summarizes the
    last run over all replicas. ``tbt_slo_s`` is the gap above which a sample counts as
    a violation; ``None`` (the default) takes the instance's TPOT SLO (``SLO.tpot_s``)
    when the run starts (:meth:`bind`), and a run on an instance without one is refused.
    ``tbt_slo_s`` after :meth:`bind` is the target in effect.
    """

    name = "tbt-recorder"
    decides = False

    def __init__(self, tbt_slo_s: float | None = None) -> None:
        if tbt_slo_s is not None and not tbt_slo_s > 0:
            raise ValueError(f"{type(self).__name__}: tbt_slo_s must be > 0 or None (the "
                             f"instance's TPOT SLO), got {tbt_slo_s}")
        #: the user's setting (None: the instance's TPOT SLO) and the target in effect
        self.tbt_target_s = None if tbt_slo_s is None else float(tbt_slo_s)
        self.tbt_slo_s = self.tbt_target_s
        self.states: dict[tuple[str, int], _RunState] = {}
        self._block_tokens = 16

    def bind(self, cluster: Any, slo: Any, tiers: tuple = ()) -> None:
        """Take the TBT target from ``slo.tpot_s`` unless the user set ``tbt_slo_s``."""
        self._slo = slo
        if self.tbt_target_s is None:
            t = float(getattr(slo, "tpot_s", math.inf))
            self.tbt_slo_s = t if math.isfinite(t) else None

    def reset(self, cluster: Any, rng: np.random.Generator) -> None:
        """Forget the last run's replicas."""
        if self.tbt_slo_s is None:
            raise ValueError(
                f"{self.name}: no TBT target: tbt_slo_s is not set and the instance's SLO "
                f"has no finite tpot_s ({getattr(self, '_slo', 'no SLO given')}); give the "
                "instance lp.SLO(tpot_s=...) or set tbt_slo_s=")
        self.states = {}
        self._block_tokens = int(cluster.block_tokens)

    def cparams(self, block_tokens: int) -> np.ndarray:
        """The ``cp`` array of :mod:`lpserve.kernels.dpp`."""
        cp = np.zeros(K.N_CP, np.float64)
        cp[K.CP_S_TBT] = self.tbt_slo_s
        cp[K.CP_ETA] = 1.0
        cp[K.CP_THETA] = 1.0
        cp[K.CP_GRAIN] = 1.0
        cp[K.CP_BT] = float(block_tokens)
        return cp

    def kernel_spec(self) -> tuple[str, tuple[float, ...]]:
        """``(kind, class weights)`` of this controller's compiled twin in the simulator
        (:mod:`lpserve.kernels.dpp`); its state comes back through :meth:`restore`."""
        return "tbt-recorder", (1.0,)

    def restore(self, replica: tuple[str, int], st: np.ndarray) -> None:
        """The controller state ``st`` (layout ``ST_*`` of :mod:`lpserve.kernels.dpp`) a
        compiled replica kept for ``replica``, so :meth:`report` covers it."""
        self._state(replica).st[:] = st

    def _state(self, replica: tuple[str, int]) -> _RunState:
        s = self.states.get(replica)
        if s is None:
            s = self.states[replica] = _RunState(self.cparams(block_tokens=self._block_tokens),
                                                 len(self._weights()))
        return s

    def observe(self, view: IterationView) -> None:
        """Account one iteration of ``view.replica``: the token gaps (s) of the requests
        that produced a token after an earlier one, the stall penalty of eq. (7) (only when the
        controller decides), and the virtual-queue updates of eqs. (5)-(6) and the slot
        statistics of :meth:`report`."""
        state = self._state(view.replica)
        ids = view.produced_request
        lt = state.last_tokens(ids)
        has = (view.produced_generated >= 1) & np.isfinite(lt)
        gaps = view.now_s - lt[has]
        state.last_tok[ids] = view.now_s
        st = state.st
        st[K.ST_LAST_PEN] = self._penalty(state, view) if self.decides else 0.0
        K.dpp_observe(state.cp, st, float(view.dt_s), int(view.decode_context.size),
                      float(view.used_blocks), float(view.total_blocks), state.q_tokens,
                      gaps.astype(np.float64))
        state.q_tokens = 0.0

    def _penalty(self, state: _RunState, view: IterationView) -> float:
        """Stall penalty of the iteration just run, eq. (7) (decode contexts before it)."""
        if not view.decode_context.size or not view.chunk_tokens.size:
            return 0.0
        params = state.cost_params(view)
        ctx = np.array(view.decode_context, np.int64)
        e = np.zeros(0, np.int64)
        t0 = iteration_time(params, e, e, ctx)
        t = iteration_time(params, np.array(view.chunk_tokens, np.int64),
                           np.array(view.chunk_cached, np.int64), ctx)
        return ctx.size * (t - t0)

    def observe_decode_run(self, view: DecodeRunView, n_iters: int) -> None:
        """Account a run of ``n_iters`` pure-decode iterations at once in the compiled
        kernel (gaps, virtual queues, statistics) and move each request's last-token time to the
        run's end; no per-iteration Python work."""
        state = self._state(view.replica)
        idx = np.array(view.request, np.int64)
        lt = state.last_tokens(idx)
        first = np.where(np.isfinite(lt), view.now_s - lt, 0.0)
        _, end = K.dpp_decode_run(state.cost_params(view), state.cp, state.st,
                                  np.array(view.context, np.int64),
                                  np.array(view.held_blocks, np.int64), first,
                                  float(view.used_blocks), float(view.total_blocks),
                                  state.q_tokens, state.q_class, self._weights(),
                                  state.plan_tokens, state.plan_cached, 0, 0, int(n_iters),
                                  False, float(view.now_s))
        state.last_tok[idx] = end

    def _weights(self) -> np.ndarray:
        return np.ones(1, np.float64)

    # ------------------------------------------------------------------ results
    def report(self) -> dict[str, float]:
        """Statistics of the last run summed over replicas.

        Keys: ``tbt_samples``, ``tbt_violation_fraction`` (gaps > ``tbt_slo_s``),
        ``tbt_p50_s``/``tbt_p99_s`` (from a log histogram, 40 bins per decade; the bin's
        upper edge), ``iterations``, ``mean_penalty_s`` (per iteration), ``mean_backlog_tokens``
        (per decided iteration), ``max_backlog_tokens``, ``mean_z_tbt``, ``mean_z_kv``,
        ``iteration_violation_fraction`` (decode-weighted share of iterations > S_TBT).
        """
        if not self.states:
            raise RuntimeError(f"{self.name}: report() before any run")
        st = np.sum([s.st for s in self.states.values()], axis=0)
        slots = max(st[K.ST_SLOTS], 1.0)
        hist = st[K.HIST_START:K.HIST_START + K.HIST_BINS]
        return {
            "tbt_samples": float(st[K.ST_GAPS]),
            "tbt_violation_fraction": float(st[K.ST_VIOL] / max(st[K.ST_GAPS], 1.0)),
            "tbt_p50_s": _hist_quantile(hist, 0.50),
            "tbt_p99_s": _hist_quantile(hist, 0.99),
            "iterations": float(st[K.ST_SLOTS]),
            "mean_penalty_s": float(st[K.ST_PEN] / slots),
            "mean_backlog_tokens": float(st[K.ST_Q] / slots),
            "max_backlog_tokens": float(max(s.st[K.ST_MAX_Q] for s in self.states.values())),
            "mean_z_tbt": float(st[K.ST_ZT_SUM] / slots),
            "mean_z_kv": float(st[K.ST_ZM_SUM] / slots),
            "iteration_violation_fraction": float(st[K.ST_SLOT_VIOL] /
                                                  max(st[K.ST_SLOT_DEC], 1.0)),
        }


def _hist_quantile(hist: np.ndarray, q: float) -> float:
    total = hist.sum()
    if total <= 0:
        return float("nan")
    k = int(np.searchsorted(np.cumsum(hist), q * total))
    return float(10 ** (K.HIST_LO_LOG10 + (k + 1) / K.HIST_BINS_PER_DECADE))


class DPPController(TBTRecorder):
    """The DPP budget controller, eq. (9) (see the module docstring).

    Args:
        V: penalty weight (>= 0); ``V = 0`` is max-weight (fill the budget).
        tbt_slo_s: ``S_TBT`` (s); ``None`` (default): the instance's TPOT SLO
            (``Instance.slo.tpot_s``, taken by :meth:`bind` when a run starts).
        eps: allowed fraction of token gaps above it.
        eta_tokens: token unit of the backlog in the Lyapunov function.
        theta: KV occupancy target in (0, 1]. grain_tokens: step of the chunk menu.
        class_weights: weight per prefill class (class = trace tenant id, clipped to the
            number of weights; one weight: one class).
    """

    name = "dpp"
    decides = True

    def __init__(self, V: float = 1.0, tbt_slo_s: float | None = None, eps: float = 0.01,
                 eta_tokens: float = 512.0, theta: float = 0.9, grain_tokens: int = 64,
                 class_weights: tuple[float, ...] = (1.0,)) -> None:
        super().__init__(tbt_slo_s)
        checks = {"V": V >= 0, "eps": 0 <= eps < 1, "eta_tokens": eta_tokens > 0,
                  "theta": 0 < theta <= 1, "grain_tokens": int(grain_tokens) >= 1,
                  "class_weights": len(class_weights) >= 1 and min(class_weights) >= 0}
        for k, ok in checks.items():
            if not ok:
                raise ValueError(f"DPPController: bad {k}={locals()[k]!r}")
        self.V, self.eps, self.eta_tokens, self.theta = float(V), float(eps), \
            float(eta_tokens), float(theta)
        self.grain_tokens = int(grain_tokens)
        self.class_weights = tuple(float(w) for w in class_weights)

    def cparams(self, block_tokens: int = 16) -> np.ndarray:
        """The ``cp`` array of :mod:`lpserve.kernels.dpp`."""
        cp = np.zeros(K.N_CP, np.float64)
        cp[K.CP_V] = self.V
        cp[K.CP_S_TBT] = self.tbt_slo_s
        cp[K.CP_EPS] = self.eps
        cp[K.CP_ETA] = self.eta_tokens
        cp[K.CP_THETA] = self.theta
        cp[K.CP_GRAIN] = self.grain_tokens
        cp[K.CP_BT] = float(block_tokens)
        return cp

    def _weights(self) -> np.ndarray:
        return np.asarray(self.class_weights, np.float64)

    def kernel_spec(self) -> tuple[str, tuple[float, ...]]:
        """``(kind, class weights)`` of this controller's compiled twin (see
        :meth:`TBTRecorder.kernel_spec`)."""
        return "dpp", self.class_weights

    def _backlog(self, state: _RunState, view: BudgetView) -> None:
        """Prefill tokens per class: waiting requests to (re)compute and partial prefills."""
        q = state.q_class
        q[:] = 0.0
        n = view.request.size
        if n:
            waiting = view.waiting
            left = np.where(view.resumable, 0, view.left_tokens)
            left = np.where(left > 1, left, np.where(waiting, left, 0))
            cls = np.clip(view.tenant, 0, q.size - 1) if q.size > 1 else np.zeros(n, np.int64)
            np.add.at(q, cls, left.astype(np.float64))
            state.resumable = bool(np.any(view.resumable & waiting))
            state.plan_tokens, state.plan_cached = self._plan(view, left)
        else:
            state.resumable = False
            state.plan_tokens = state.plan_cached = np.zeros(0, np.int64)
        state.q_tokens = float(q.sum())

    @staticmethod
    def _plan(view: BudgetView, left: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prefill candidates in the order the engine fills a budget (partial prefills by
        rank, then waiting requests by rank), cut once they cover the cap."""
        rank, waiting = view.rank, view.waiting
        nw = int(waiting.sum())
        part = [(float(rank[nw + k]), 0, k, nw + k) for k in range(view.request.size - nw)
                if left[nw + k] > 0]
        wait = [(float(rank[k]), 1, k, k) for k in range(nw)
                if left[k] > 0 and rank[k] != math.inf]
        toks, cached, total = [], [], 0
        for _, _, _, pos in sorted(part) + sorted(wait, key=lambda x: (x[0], x[2])):
            n = int(view.left_tokens[pos])
            toks.append(n)
            cached.append(int(view.computed_tokens[pos]))
            total += n
            if total >= view.cap_tokens:
                break
        return np.array(toks, np.int64), np.array(cached, np.int64)

    def budget(self, view: BudgetView) -> int:
        """Prefill tokens ``u`` of this iteration (``<= view.cap_tokens``): the menu entry
        ``{0, grain, 2 grain, ...}`` that minimizes drift + ``V`` x penalty, eq. (9), over the
        per-class backlog of ``view``. Returns 1 instead of 0 when a request whose KV is ready
        (swapped out or transferred) waits, so the engine can admit it."""
        state = self._state(view.replica)
        cap = int(view.cap_tokens)
        self._backlog(state, view)
        state.u = int(K.dpp_decide(state.cost_params(view), state.cp, state.st, state.q_class,
                                   self._weights(), state.plan_tokens, state.plan_cached,
                                   np.array(view.decode_context, np.int64),
                                   float(view.used_blocks), float(view.total_blocks), cap))
        state.cap = cap
        if state.u == 0 and cap > 0 and state.resumable:
            # a request whose KV is ready (swapped out, or transferred from a prefill
            # replica) needs no prefill; the engine admits it only with a positive budget
            return 1
        return state.u

    def decode_limit(self, view: DecodeRunView) -> int:
        """Iterations of the pure-decode run before eq. (9) could choose a positive
        budget again (at least 1); ``view.max_iters`` when there is no backlog."""
        state = self._state(view.replica)
        if state.q_tokens <= 0 or view.max_iters <= 1:
            return int(view.max_iters)
        idx = np.array(view.request, np.int64)
        lt = state.last_tokens(idx)
        first = np.where(np.isfinite(lt), view.now_s - lt, 0.0)
        k, _ = K.dpp_decode_run(state.cost_params(view), state.cp, state.st,
                                np.array(view.context, np.int64),
                                np.array(view.held_blocks, np.int64), first,
                                float(view.used_blocks), float(view.total_blocks),
                                state.q_tokens, state.q_class, self._weights(),
                                state.plan_tokens, state.plan_cached, state.cap, state.u,
                                int(view.max_iters), True, float(view.now_s))
        return max(int(k), 1)


class DPPScheduler(Scheduler):
    """Rank of the DPP policy: classes by weighted backlog ``w_c Q_c`` (largest first, the
    greedy order of eq. (10)), first come first served within a class."""

    name = "dpp-classes"

    def __init__(self, class_weights: tuple[float, ...] = (1.0,)) -> None:
        self.class_weights = tuple(float(w) for w in class_weights)

    def kernel_spec(self) -> tuple[str, list[float], list[int]]:
        """The compiled twin's kind and parameters (see :meth:`lpserve.policy.FCFS.kernel_spec`)."""
        return "dpp-classes", list(self.class_weights), [len(self.class_weights)]

    def rank(self, view: SchedulerView) -> np.ndarray:
        """Float64 ``(n,)``: classes (tenant, clipped to the number of weights) ordered by
        weighted prefill backlog ``w_c Q_c`` largest first, arrival order within a class
        (ranks of one class lie in a band wider than the arrival span); ``arrival_s`` with one
        class."""
        arr = np.asarray(view.arrival_s, np.float64)
        n_cls = len(self.class_weights)
        if n_cls == 1 or len(view) == 0:
            return arr.copy()
        cls = np.clip(view.tenant, 0, n_cls - 1)
        left = np.maximum(view.prompt_tokens - view.computed_tokens, 0).astype(np.float64)
        q = np.bincount(cls, weights=left, minlength=n_cls)
        score = np.asarray(self.class_weights) * q
        order = np.argsort(-score, kind="stable")
        pos = np.empty(n_cls, np.float64)
        pos[order] = np.arange(n_cls)
        span = float(arr.max() - arr.min()) + 1.0
        return pos[cls] * span + (arr - arr.min())


def lyapunov(V: float = 1.0, tbt_slo_s: float | None = None, eps: float = 0.01,
             eta_tokens: float = 512.0, theta: float = 0.9, grain_tokens: int = 64,
             class_weights: tuple[float, ...] = (1.0,), max_num_batched_tokens: int = 2048,
             max_num_seqs: int = 256, prefix_caching: bool = True, router: Any = None,
             name: str = "lyapunov") -> Policy:
    """The DPP policy: decode-first chunked prefill whose per-iteration prefill budget
    (at most ``max_num_batched_tokens``) is set by :class:`DPPController`. Its TBT target
    ``tbt_slo_s`` is the instance's TPOT SLO unless set here."""
    ctl = DPPController(V=V, tbt_slo_s=tbt_slo_s, eps=eps, eta_tokens=eta_tokens,
                        theta=theta, grain_tokens=grain_tokens, class_weights=class_weights)
    eng = EngineConfig(batching="decode-first", chunked_prefill=True,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       preemption="recompute", watermark=0.01, prefix_caching=prefix_caching,
                       budget_controller=ctl)
    sched = DPPScheduler(class_weights)
    sched.meta = Meta(engines=("lpserve",), claims=CLAIMS)
    return Policy(router=router or RoundRobin(), scheduler=sched, evictor=LRU(), engine=eng,
                  name=name)


def with_recorder(policy: Policy, tbt_slo_s: float) -> Policy:
    """``policy`` with a :class:`TBTRecorder` attached (its budgets unchanged), so that
    ``policy.engine.budget_controller.report()`` gives token-gap statistics after a run.
    A policy that already has a controller is returned unchanged."""
    if policy.engine.budget_controller is not None:
        return policy
    return policy.with_(engine={"budget_controller": TBTRecorder(tbt_slo_s)})


# =====================================================================================
# constants of the theorem and capacities
# =====================================================================================
def _t(cost: Any, prefill: int, ctx: np.ndarray) -> float:
    p = np.array([prefill], np.int64) if prefill > 0 else np.zeros(0, np.int64)
    return float(iteration_time(np.ascontiguousarray(cost.params, np.float64), p,
                                np.zeros(p.size, np.int64), np.asarray(ctx, np.int64)))


def constants(cost_model: Any, *, budget_tokens: int = 2048, max_decodes: int = 256,
              context_tokens: int = 1024, max_arrival_tokens: float = 4096.0,
              eta_tokens: float = 512.0, eps: float = 0.01, theta: float = 0.9,
              mean_prompt_tokens: float | None = None,
              mean_output_tokens: float | None = None) -> dict[str, float]:
    """Constants of ``proofs/lyapunov-dpp.md`` for the controller on ``cost_model``.

    ``B`` bounds half the conditional second moment of the queue increments, eq. (12):
    ``B = (A^2 + b^2) / (2 eta^2) + N^2 max(eps, 1-eps)^2 / 2 + max(theta, 1-theta)^2 / 2``
    with ``A = max_arrival_tokens`` per slot, ``b = budget_tokens`` and ``N =
    max_decodes``; ``C = b^2 / (4 eta^2)`` is the additive error of serving at most the
    backlog, eq. (13). ``p_max`` is the largest stall penalty of one iteration,
    ``max_n n (T(b - n) - T(0))`` with decodes of ``context_tokens`` (``p_min = 0``).
    ``t_b_s`` is the time of a full batch and ``capacity_tokens_per_s = b / t_b`` the
    Li-Dai-Peng service rate; with mean lengths given, the full batch mixes decodes and
    prefill in the workload's proportion ``m_d / (m_p + m_d)`` (contexts ``m_p + m_d/2``)
    and ``capacity_rps = b / (t_b (m_p + m_d))``.
    """
    b, N = int(budget_tokens), int(max_decodes)
    if b < 1 or N < 0 or eta_tokens <= 0:
        raise ValueError(f"constants: need budget_tokens >= 1, max_decodes >= 0, "
                         f"eta_tokens > 0; got {b}, {N}, {eta_tokens}")
    B = ((max_arrival_tokens ** 2 + b ** 2) / (2 * eta_tokens ** 2)
         + 0.5 * (N * max(eps, 1 - eps)) ** 2 + 0.5 * max(theta, 1 - theta) ** 2)
    C = b ** 2 / (4 * eta_tokens ** 2)  # serving at most the backlog, eq. (13)
    p_max = 0.0
    for n in sorted({min(N, b - 1), max(N // 2, 1), max(N // 4, 1), 1}):
        if 0 < n < b:
            ctx = np.full(n, context_tokens, np.int64)
            p_max = max(p_max, n * (_t(cost_model, b - n, ctx) - _t(cost_model, 0, ctx)))
    out = {"B": float(B), "C": float(C), "p_max": float(p_max), "p_min": 0.0}
    if mean_prompt_tokens is not None and mean_output_tokens is not None:
        mp, md = float(mean_prompt_tokens), float(mean_output_tokens)
        n_d = int(round(b * md / (mp + md)))
        ctx = np.full(n_d, int(round(mp + md / 2)), np.int64)
        t_b = _t(cost_model, b - n_d, ctx)
        out.update(t_b_s=t_b, capacity_tokens_per_s=b / t_b, capacity_rps=b / (t_b * (mp + md)))
    else:
        t_b = _t(cost_model, b, np.zeros(0, np.int64))
        out.update(t_b_s=t_b, capacity_tokens_per_s=b / t_b)
    return out


def prefill_first_capacity_rps(cost_model: Any, *, budget_tokens: int, prompt_tokens: int,
                               output_tokens: int, max_num_seqs: int) -> float:
    """Fluid capacity of vLLM-style prefill-first batching with fixed lengths ``(P, D)``.

    At saturation the batch holds ``N = max_num_seqs`` requests; each completion admits
    one prompt in a prefill-only iteration of ``k = floor(b / P)`` prompts (decodes
    paused), and decodes run in iterations of ``N`` sequences whose contexts spread
    evenly over ``[P, P + D)``. Time per request:
    ``t(k P) / k + D t_dec(N) / N`` (``models/lyapunov-pd.md`` eq. (15); a fluid estimate
    with its assumptions in ``proofs/prefill-first-capacity.md``).
    """
    P, D, N, b = int(prompt_tokens), int(output_tokens), int(max_num_seqs), int(budget_tokens)
    if P > b:
        return 0.0  # a prompt above the budget is never scheduled without chunking
    k = max(1, min(b // P, N))
    ctx = (P + (np.arange(N) * D) // N).astype(np.int64)
    t_pre = float(cost_model.batch_time_s(prefill_tokens=[P] * k, prefill_cached=[0] * k,
                                          decode_context=[]))
    per_req = t_pre / k + D * _t(cost_model, 0, ctx) / N
    return 1.0 / per_req


def slotted_optimum(cost_model: Any, *, decodes: Any, decode_probs: Any,
                    mean_arrival_tokens: float, context_tokens: int, budget_tokens: int,
                    tbt_slo_s: float, eps: float, grain_tokens: int = 64,
                    eta_tokens: float = 512.0) -> dict[str, float]:
    """The best omega-only (stationary randomized) policy of the slotted model, by LP.

    Decision variables ``x[n, k]``: probability that a slot has ``n`` decodes and serves
    ``u_k`` prefill tokens (``u_k`` on the controller's menu up to ``budget - n``).
    Returns ``p_star`` (least time-average stall penalty that serves the mean arrivals
    with at most ``eps`` of token gaps above ``tbt_slo_s``, eq. (17)) and ``slack``
    (the Slater margin: the largest ``delta`` with mean service
    ``>= mean arrivals + delta * eta`` and mean ``y_TBT <= -delta``, eq. (18)); the LP
    statuses are in ``status``.
    """
    import highspy

    ns = np.asarray(decodes, np.int64)
    pi = np.asarray(decode_probs, np.float64)
    if ns.shape != pi.shape or abs(pi.sum() - 1) > 1e-9 or np.any(ns >= budget_tokens):
        raise ValueError("slotted_optimum: decodes and decode_probs must align, sum to 1, "
                         "and every decode count must be < budget_tokens")
    cols = []  # (n index, u, penalty, y_tbt)
    for i, n in enumerate(ns.tolist()):
        ctx = np.full(n, context_tokens, np.int64)
        t0 = _t(cost_model, 0, ctx) if n else 0.0
        cap = int(budget_tokens - n)
        for u in sorted(set(range(0, cap + 1, grain_tokens)) | {cap}):
            t = _t(cost_model, u, ctx) if (u or n) else 0.0
            cols.append((i, u, n * (t - t0), n * ((1.0 if (n and t > tbt_slo_s) else 0.0) - eps)))

    def solve(maximize_slack: bool) -> tuple[str, float, float]:
        h = highspy.Highs()
        h.silent()
        inf = highspy.kHighsInf
        nv = len(cols) + 1  # last variable: delta (fixed at 0 for p*)
        for j, (_, _, p, _) in enumerate(cols):
            h.addVar(0.0, inf)
            h.changeColCost(j, 0.0 if maximize_slack else p)
        h.addVar(0.0 if maximize_slack else 0.0, inf if maximize_slack else 0.0)
        h.changeColCost(nv - 1, -1.0 if maximize_slack else 0.0)
        for i, prob in enumerate(pi.tolist()):
            idx = [j for j, c in enumerate(cols) if c[0] == i]
            h.addRow(prob, prob, len(idx), np.array(idx, np.int32), np.ones(len(idx)))
        idx = np.arange(nv, dtype=np.int32)
        serve = np.array([c[1] / eta_tokens for c in cols] + [-1.0])
        h.addRow(mean_arrival_tokens / eta_tokens, inf, nv, idx, serve)
        tbt = np.array([c[3] for c in cols] + [1.0])
        h.addRow(-inf, 0.0, nv, idx, tbt)
        h.run()
        status = h.modelStatusToString(h.getModelStatus())
        sol = np.asarray(h.getSolution().col_value)
        return status, float(sum(c[2] * x for c, x in zip(cols, sol))), float(sol[-1])

    st1, p_star, _ = solve(False)
    st2, _, slack = solve(True)
    return {"p_star": p_star, "slack": slack, "status": f"{st1}/{st2}"}


def simulate_slotted(cost_model: Any, *, V: float, decodes: Any, decode_probs: Any,
                     arrival_tokens: int, arrival_prob: float, context_tokens: int,
                     budget_tokens: int, tbt_slo_s: float, eps: float, slots: int,
                     eta_tokens: float = 512.0, grain_tokens: int = 64,
                     seed: int = 0) -> dict[str, float]:
    """Run the controller on the slotted model (``models/lyapunov-pd.md`` section 4).

    Each slot has ``n`` decodes drawn from ``decodes`` with ``decode_probs`` and, with
    probability ``arrival_prob``, ``arrival_tokens`` new prefill tokens (i.i.d.). Returns
    the time averages ``penalty_s``, ``backlog_eta`` (``Q / eta``), ``z_tbt`` and the
    decode-weighted share of iterations slower than ``tbt_slo_s`` (``violations``).
    """
    rng = np.random.default_rng(seed)
    ns = np.asarray(decodes, np.int64)
    a = (rng.random(int(slots)) < arrival_prob) * float(arrival_tokens)
    n = ns[rng.choice(ns.size, size=int(slots), p=np.asarray(decode_probs, np.float64))]
    cp = DPPController(V=V, tbt_slo_s=tbt_slo_s, eps=eps, eta_tokens=eta_tokens, theta=1.0,
                       grain_tokens=grain_tokens).cparams(block_tokens=16)
    params = np.ascontiguousarray(cost_model.params, np.float64)
    st, _ = K.dpp_slotted(params, cp, a, n.astype(np.int64), int(context_tokens),
                          int(budget_tokens), 1e9)
    T = st[K.ST_SLOTS]
    return {"penalty_s": float(st[K.ST_PEN] / T), "backlog_eta": float(st[K.ST_Q] / T / eta_tokens),
            "z_tbt": float(st[K.ST_ZT_SUM] / T),
            "violations": float(st[K.ST_SLOT_VIOL] / max(st[K.ST_SLOT_DEC], 1.0))}
