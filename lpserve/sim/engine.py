"""The cluster-level event loop: arrivals, dependency releases, routing, KV transfers to
the decode pool, live migration, and the replicas between them.

One loop serves every trace and policy. Replicas are advanced lazily: an event at ``t``
first brings the replicas it touches up to ``t``. A trace with parent links
(:mod:`lpserve.sim.dependencies`) can have a completion release a request before the next
known event, so there the loop advances the busy replicas conservatively, the one with
the earliest clock first, each by one planning step that stops at the earliest clock of
the others: any completion elsewhere ends an iteration that starts no earlier than that
clock, so every iteration already run started before it.
"""
from __future__ import annotations

import heapq
import math
import time
from typing import Any

import numpy as np

from lpserve.arrays import readonly
from lpserve.instance import Instance
from lpserve.policy import Policy, PolicyError, PredictorView, RouterView
from lpserve.policy.checks import check_prediction, check_routes
from lpserve.sim import compiled, twins
from lpserve.sim.dependencies import Dependencies, has_dependencies
from lpserve.sim.invariants import ReplicaChecker, check_final
from lpserve.sim.memory import kv_memory
from lpserve.sim.migration import Migrator
from lpserve.sim.state import FINISHED, PENDING, REJECTED, WAITING, Events, RunContext, State
from lpserve.sim.vacant import lazy_ok, replica_pool

__all__ = ["Simulation"]


def _has_work(r: Any) -> bool:
    """Whether replica ``r`` holds requests, outgoing copies or swap-ins in flight on its
    host link."""
    return bool(r.running or r.waiting or r.releases or r.loading)


class Simulation:
    """One run of ``policy`` on ``instance``; see :func:`lpserve.sim.simulate`.

    Randomness: one ``SeedSequence(seed)``; :meth:`Policy.reset` spawns its children 0-7
    for the policy's roles and hooks, then the predictor gets the next child and the
    speculative acceptance draws the one after (spawned again per replica).

    ``iteration_log`` (reference mode only): a list that every iteration is appended to,
    ``(replica key, t0_s, t1_s, chunks, decodes)`` (:func:`lpserve.sim.hooks.log_iteration`;
    speculative steps are not iterations of the log: a policy with speculative decoding
    refuses it).
    """

    def __init__(self, instance: Instance, policy: Policy, seed: int = 0, *,
                 reference: bool = False, check: bool = False, predictor: Any = None,
                 iteration_log: list | None = None) -> None:
        if iteration_log is not None and not (reference and policy.engine.speculation is None):
            raise ValueError(f"policy {policy.name!r}: an iteration log is kept in the "
                             "reference mode of a policy without speculative decoding only")
        self.instance = instance
        # engine fields and role parameters that mirror the instance (Policy.bind)
        policy = policy.bind(instance.cluster, instance.slo, instance.tiers)
        self.policy = policy
        self.seed = int(seed)
        self.reference = bool(reference)
        self.check = bool(check)
        tr = instance.trace
        self.state = S = State(tr)
        self.seeds = np.random.SeedSequence(self.seed)
        self.policy_rng = np.random.default_rng(self.seeds)
        policy.reset(instance.cluster, self.policy_rng)  # spawns children 0-7 of seeds
        # predicted output intervals shown to schedulers: the trace's, or the predictor's
        # (filled at arrival; the predictor observes each completion after it happens)
        self.predictor = predictor
        if predictor is None:
            pred_lo, pred_hi = tr.predicted_lo, tr.predicted_hi
        else:
            predictor.reset(instance.cluster, np.random.default_rng(self.seeds.spawn(1)[0]))
            pred_lo = np.ones(len(tr), np.int64)
            pred_hi = np.ones(len(tr), np.int64)
            self._unobserved: list[tuple[float, int]] = []  # finished after the last look
        costs = instance.replica_cost_models()
        self.cost = costs[0]
        # the serving front end's latency by replica (models/simulator.md (33))
        self.frontend_s = np.array([float(getattr(c, "frontend_latency_s", 0.0))
                                    for c in costs], np.float64)
        params = np.ascontiguousarray(self.cost.params, dtype=np.float64)
        cl = instance.cluster
        self.cluster = cl
        bt = int(cl.block_tokens)
        total, host, kv_scale, spec = kv_memory(self.cost, cl, policy, S, self.seeds)
        self.total_blocks, self.host_blocks = total, host
        # a heterogeneous cluster: each replica priced by its own cost model, with its own
        # KV blocks (replica_kw); the run context keeps the first replica's as defaults
        replica_kw = self._replica_kw(instance, policy, bt) if instance.heterogeneous else None
        self.horizon_s = math.inf if instance.horizon_s is None else float(instance.horizon_s)
        self.deps = Dependencies(tr) if has_dependencies(tr) else None
        if policy.engine.kv_offload_gib and (cl.disaggregated or
                                             policy.rebalancer is not None):
            raise ValueError(f"policy {policy.name!r}: EngineConfig.kv_offload_gib needs a "
                             "colocated cluster without a rebalancer")
        if policy.rebalancer is not None and self.deps is not None:
            raise ValueError(f"policy {policy.name!r}: a rebalancer cannot run on a trace with "
                             "parent dependencies")
        self.events = Events(track_finished=self.deps is not None)
        self.events.track_predictor = predictor is not None
        checker = (ReplicaChecker(S, host, policy.engine.compression_ratio) if self.check
                   else None)
        self.ctx = RunContext(
            state=S, policy=policy, cost=self.cost, params=params, block_tokens=bt,
            total_blocks=total, host_blocks=host, kv_scale=kv_scale, link_gbps=cl.link_gbps,
            horizon_s=self.horizon_s, reference=self.reference, pred_lo=pred_lo,
            pred_hi=pred_hi, events=self.events, check=checker, spec=spec,
            slo_ttft_s=float(instance.slo.ttft_s), slo_tpot_s=float(instance.slo.tpot_s),
            ranks_in_python=twins.rank_spec(policy.scheduler, twins.vtc_in_pauses(
                policy, cl.disaggregated))[0] == twins.RANK_EXTERNAL,
            iteration_log=iteration_log)
        self.spec = spec
        # the routing roles that read completions (RouterView.completions); a role whose
        # pool has one replica is never asked (_route), so it reads none
        choices = {"router": cl.prefill_replicas if cl.disaggregated else cl.replicas,
                   "decode_router": cl.decode_replicas}
        self._done_roles = [role for role in ("router", "decode_router")
                            if choices[role] > 1
                            and getattr(getattr(policy, role), "reads_completions", False)]
        self._build_replicas(replica_kw)
        # what KV-aware routers read (RouterView.cached_tokens / prefill_tokens /
        # completions): the cached tokens each routed request had where it went, and per
        # routing role the completions not shown yet
        self._routed_hit = np.zeros(S.n, np.int64)
        self._done_cursor: dict[str, int] = {}
        self._done_pending: dict[str, list[tuple[float, int]]] = {}
        self.events.track_router = bool(self._done_roles)
        self.migrator = None
        pool = self.back if self.back else self.front
        if policy.rebalancer is not None and len(pool) > 1:  # one replica: no move exists
            self.migrator = Migrator(self.ctx, pool)
        self._routed_s = -math.inf  # time of the last routed event (dependency releases)
        self._program = tr.program_id  # the routers' view of agentic programs

    def frontend_latency_of(self, requests: np.ndarray) -> np.ndarray:
        """Seconds the serving front end adds to each of ``requests`` (int64, shape
        ``(k,)``): that of the replica it was routed to (rule (33)); 0 for a request never
        placed."""
        rep = self.state.replica[requests]  # a disaggregated cluster is homogeneous
        return np.where(rep >= 0, self.frontend_s[np.maximum(rep, 0)], 0.0)

    @staticmethod
    def _replica_kw(instance: Instance, policy: Policy, bt: int) -> list[dict[str, Any]]:
        """Per replica of a heterogeneous cluster: its cost model, float64 parameters and
        KV blocks (``CompiledRun.replica(..., cost=, params=, total_blocks=)``)."""
        cl = instance.cluster
        for what, on in (("speculative decoding", policy.engine.speculation is not None),
                         ("a rebalancer", policy.rebalancer is not None),
                         ("disaggregated pools", cl.disaggregated)):
            if on:
                raise ValueError(f"policy {policy.name!r} on {cl.describe()}: {what} is not "
                                 "simulated on a heterogeneous cluster")
        out, made = [], {}
        for k, cost in enumerate(instance.replica_cost_models()):
            if id(cost) not in made:
                blocks = int(cost.kv_capacity_blocks(block_tokens=bt,
                                                     gpu_memory_fraction=cl.gpu_memory_fraction))
                if blocks < 1:
                    raise ValueError(f"replica {k} of {cl.describe()}: no room for KV blocks "
                                     f"(kv_capacity_blocks = {blocks})")
                made[id(cost)] = {"cost": cost, "total_blocks": blocks, "params":
                                  np.ascontiguousarray(cost.params, dtype=np.float64)}
            out.append(made[id(cost)])
        return out

    def _build_replicas(self, replica_kw: list[dict] | None) -> None:
        """Make the compiled replica pools: ``front`` (colocated, or prefill) and ``back``
        (the decode pool of a disaggregated cluster, else empty), built when first reached
        where ``lazy_ok``; ``engine_name`` says which hooks run in Python and whether the
        run is the reference mode (one iteration per step)."""
        policy, cl = self.policy, self.cluster
        self.heterogeneous = replica_kw is not None
        # a heterogeneous cluster's largest KV pool, over the first replica's
        largest = max(kw["total_blocks"] for kw in replica_kw) if replica_kw else None
        run = self.runset = compiled.CompiledRun(
            self.ctx, cl, self.deps is not None or self.predictor is not None
            or bool(self._done_roles), largest)
        self.engine_name = "+".join(
            ["compiled"] + ["python-ranks"] * self.ctx.ranks_in_python
            + ["python-evictor"] * run.python_evictor
            + ["python-decider"] * run.python_decider
            + ["python-controller"] * run.python_controller
            + ["python-speculation"] * run.python_speculation
            + ["reference"] * self.reference)

        def make(k: int, role: str) -> Any:
            return run.replica(k, role, **(replica_kw[k] if replica_kw else {}))
        lazy = self.state.n + 1 if lazy_ok(policy, replica_kw is not None) else None
        if cl.disaggregated:
            self.front = replica_pool(make, "prefill", cl.prefill_replicas, lazy)
            self.back = replica_pool(make, "decode", cl.decode_replicas, lazy)
        else:
            scale = largest / replica_kw[0]["total_blocks"] if replica_kw else 1.0
            self.front = replica_pool(make, "colocated", cl.replicas, lazy, scale)
            self.back = []

    # ------------------------------------------------------------------ routing
    def _route(self, pool: list[Any], req: list[int], t: float, phase: str) -> list[int]:
        """The replica (index into ``pool``) of each request of ``req`` arriving at ``t``:
        the policy's router (or decode router) asked through a :class:`RouterView`, unless
        the pool has one replica, where there is no choice to make and it is not asked
        (``models/simulator.md`` (17))."""
        if len(pool) == 1:
            return [0] * len(req)
        S = self.state
        role = "decode_router" if phase == "decode" else "router"
        router = getattr(self.policy, role)

        def replica_state() -> dict[str, np.ndarray]:
            for r in pool:
                r.advance(t)
            return {
                "outstanding": np.array([r.outstanding for r in pool]),
                "waiting": np.array([r.n_waiting for r in pool]),
                "running": np.array([r.n_running for r in pool]),
                "used_blocks": np.array([r.bm.used for r in pool]),
                "total_blocks": np.array([r.bm.total for r in pool]),
                # the longest prompt a replica admits (State.reject_reason: p + 1 tokens
                # within total - watermark blocks)
                "max_prompt_tokens": np.array([(r.bm.total - r.wm_blocks) * r.bt - 1
                                               for r in pool]),
            }

        hit: list[np.ndarray] = []

        def cached_tokens() -> np.ndarray:
            # the longest cached prefix of each arriving prompt on each replica (what KV
            # events report); one lookup per matched block plus one, never a cache scan
            for r in pool:  # the caches as of t
                r.advance(t)
            out = np.zeros((len(req), len(pool)), np.int64)
            for q, i in enumerate(req):
                if S.prompt[i] >= self.ctx.block_tokens:  # a full prompt block
                    for k, r in enumerate(pool):
                        out[q, k] = r.cached_prefix_tokens(i)
            hit.append(out)
            return out

        def load_state() -> dict[str, np.ndarray]:
            for r in pool:
                r.advance(t)
            left = np.array([self._prefill_left(r) for r in pool], np.int64).reshape(-1, 2)
            return {"prefill_tokens": left[:, 0], "prefill_square_tokens": left[:, 1],
                    "cached_blocks": np.array([getattr(r.bm, "evictable", 0)
                                               + getattr(r.bm, "hashed_used", 0)
                                               for r in pool], np.int64)}

        contiguous = req[-1] - req[0] == len(req) - 1
        idx = slice(req[0], req[-1] + 1) if contiguous else np.asarray(req, np.int64)
        ctx = self.ctx
        reads_done = getattr(router, "reads_completions", False)
        view = RouterView(
            now_s=t, n_replicas=len(pool), phase=phase,
            request=np.arange(req[0], req[-1] + 1) if contiguous else idx,
            arrival_s=S.arrival[idx], prompt_tokens=S.prompt[idx], tenant=S.tenant[idx],
            session_id=S.session[idx],
            program_id=None if self._program is None else self._program[idx],
            predicted_lo=None if ctx.pred_lo is None else ctx.pred_lo[idx],
            predicted_hi=None if ctx.pred_hi is None else ctx.pred_hi[idx],
            output_tokens=S.out[idx] if self.policy.meta.clairvoyant else None,
            block_keys=lambda: tuple(S.trace_keys(i) for i in req),
            replica_state=replica_state, block_tokens=ctx.block_tokens,
            key_tokens=int(S.trace.block_tokens or 0),
            cached_tokens=cached_tokens, load_state=load_state,
            completions=(lambda: self._completions(pool, t, role, phase)) if reads_done
            else None)
        out = router.route(view)
        if type(out) is np.ndarray and out.shape == (1,) and out.dtype.kind in "iu" and \
                0 <= out[0] < len(pool):  # the common case, checked without a copy
            routes = [int(out[0])]
        else:
            routes = check_routes(out, len(req), len(pool), ctx.who(role)).tolist()
        if hit:  # the router read cached_tokens: remember each request's hit where it went
            self._routed_hit[req] = hit[0][np.arange(len(req)), routes]
        return routes

    def _prefill_left(self, r: Any) -> tuple[int, int]:
        """Prompt (and recompute) tokens still to prefill on replica ``r``, and the sum of
        ``end^2 - start^2`` over them (tokens^2, what the attention of those chunks costs):
        each waiting request's uncomputed context less the cached tokens it had there when
        routed (if its router read them), each running request's unfinished prefill."""
        S = self.state
        total = square = 0
        w = r.waiting
        if w:
            wi = np.asarray(w, np.int64)
            end = S.prompt[wi] + S.gen[wi]
            start = S.computed[wi].copy()
            fresh = start == 0
            start[fresh] = np.minimum(self._routed_hit[wi[fresh]], end[fresh])
            left = end - start
            total += int(left.sum())
            square += int((end * end - start * start).sum())
        run = r.running
        if run:
            ri = np.asarray(run, np.int64)
            end = S.prompt[ri] + S.gen[ri]
            start = S.computed[ri]
            part = end - start > 1
            total += int((end - start)[part].sum())
            square += int((end[part] ** 2 - start[part] ** 2).sum())
        return total, square

    def _completions(self, pool: list[Any], t: float, role: str,
                     phase: str) -> dict[str, np.ndarray]:
        """The requests that finished at or before ``t`` and were not shown to ``role``
        yet (the pool brought up to ``t`` first)."""
        for r in pool:
            r.advance(t)
        S, log = self.state, self.events.router_finished
        start = self._done_cursor.get(role, 0)
        pending = self._done_pending.setdefault(role, [])
        pending.extend(log[start:])
        self._done_cursor[role] = len(log)
        shown = min(self._done_cursor.get(x, 0) for x in self._done_roles)
        if shown:  # every reading role has seen these: drop them
            del log[:shown]
            for x in self._done_roles:
                self._done_cursor[x] = self._done_cursor.get(x, 0) - shown
        due = [i for f, i in pending if f <= t]
        self._done_pending[role] = [(f, i) for f, i in pending if f > t]
        d = np.asarray(due, np.int64)
        first, fin, gen = S.first_token[d], S.finish[d], S.gen[d]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(gen > 1, (fin - first) / np.maximum(gen - 1, 1), np.nan)
        where = S.decode_replica if phase == "decode" else S.replica
        return {"request": d, "replica": where[d].copy(), "ttft_s": first - S.arrival[d],
                "tpot_s": tpot, "output_tokens": gen.copy()}

    def _flush_kv(self, until: float) -> None:
        """Route and hand over every transferred request whose KV is ready by ``until``."""
        heap = self.events.kv_heap
        while heap and heap[0][0] <= until:
            t, i = heapq.heappop(heap)
            group = [i]
            while heap and heap[0][0] == t:
                group.append(heapq.heappop(heap)[1])
            for i2, r in zip(group, self._route(self.back, group, t, "decode")):
                self.back[r].enqueue(i2, t)

    # ------------------------------------------------------------------ predictions
    def _predict(self, req: list[int], t: float) -> None:
        """Show the predictor every completion up to ``t``, then predict ``req``."""
        S, pr = self.state, self.predictor
        for r in self.replicas():
            r.advance(t)
        # the completions reported since the last prediction (an iteration that started
        # before t may end after it: those wait for a later prediction), by finish time
        pending = self._unobserved + self.events.predictor_finished
        self.events.predictor_finished.clear()
        due = sorted(x for x in pending if x[0] <= t)
        self._unobserved = [x for x in pending if x[0] > t]
        if due:
            done = np.fromiter((i for _, i in due), np.int64, len(due))
            pr.observe(PredictorView(now_s=t, request=readonly(done),
                                     prompt_tokens=readonly(S.prompt[done]),
                                     tenant=readonly(S.tenant[done]),
                                     output_tokens=readonly(S.out[done])))
        idx = np.asarray(req, np.int64)
        view = PredictorView(now_s=t, request=readonly(idx), prompt_tokens=readonly(S.prompt[idx]),
                             tenant=readonly(S.tenant[idx]),
                             output_tokens=readonly(S.out[idx]) if pr.meta.clairvoyant else None)
        who = f"predictor {getattr(pr, 'name', pr)!r}"
        try:
            lo, hi = check_prediction(pr.predict(view), idx.size, who)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
        self.ctx.pred_lo[idx] = lo
        self.ctx.pred_hi[idx] = hi

    # ------------------------------------------------------------------ events
    def _next_arrival_s(self, i: int) -> float:
        """When the next request (``i`` in trace order, or the next released one) arrives."""
        if self.deps is not None:
            return self.deps.next_s()
        return float(self.state.arrival[i]) if i < self.state.n else math.inf

    def _advance_conservatively(self, t: float) -> None:
        """Run every iteration that starts before ``t`` or before an event released
        meanwhile (whichever is earlier); returns when nothing more may run. The replica
        furthest behind steps, up to the next one's time; a replica that had nothing to do
        counts as being at its next own event (``CompiledReplica.wake_s``), so no other
        replica runs past a copy end or release that lets it run again (and release a
        dependent request)."""
        reps = self.replicas()
        idle: dict[int, float] = {}  # replica -> its next own event (nothing to do before)
        while True:
            lim = min(t, self._next_dependent_event_s(), self.horizon_s)
            best, best_t, second = None, math.inf, math.inf
            for k, r in enumerate(reps):
                if k in idle:
                    tk = idle[k]
                elif _has_work(r):
                    tk = r.now
                else:
                    continue
                if tk >= lim:
                    continue
                if best is None or tk < best_t:
                    second = min(second, best_t)
                    best, best_t = k, tk
                else:
                    second = min(second, tk)
            if best is None:
                return
            r = reps[best]
            stop = min(lim, max(second, math.nextafter(best_t, math.inf)))
            if not r.step(stop):
                w = r.wake_s()
                idle[best] = w if w > r.now else math.inf
            else:
                idle.clear()
            self._release_children()

    def _next_dependent_event_s(self) -> float:
        """The next request released (a root arriving, a child whose parent finished) or
        KV handoff to the decode pool (s)."""
        t = self.deps.next_s()
        if self.events.kv_heap:
            t = min(t, self.events.kv_heap[0][0])
        return t

    def _release_children(self) -> None:
        """Schedule the children of every request finished since the last call."""
        fin = self.events.finished
        rep = self.state.replica
        for t, i in fin:  # the client sees the finish after the front end (rule (33))
            t += self.frontend_s[rep[i]] if rep[i] >= 0 else 0.0
            for rel, c in self.deps.finished(i, t, self._routed_s):
                self.state.release_at(c, rel)
        fin.clear()

    def _migration_events(self, t: float) -> None:
        """Every copy landing and rebalancing tick at or before ``t`` (and before the
        horizon), in time order (a landing first when they coincide)."""
        m = self.migrator
        if not m.heap and math.isfinite(t) and self._idle():
            m.skip_ticks_before(t)
        while True:
            land, tick = m.next_landing_s, m.next_tick_s
            e = min(land, tick)
            if e > t or e >= self.horizon_s:
                return
            if land <= tick:
                m.land()
            else:
                self._advance_pool(tick)
                m.tick(tick)

    def _drain_migrations(self) -> None:
        """After the last arrival: keep ticking while the pool has work, land every copy."""
        m = self.migrator
        while True:
            e = m.next_event_s()
            if e == math.inf or e >= self.horizon_s:
                return
            if not m.heap:
                self._advance_pool(e)
                if not self._busy(e):
                    return
            self._migration_events(e)

    def _advance_pool(self, t: float) -> None:
        """Bring the migration pool to ``t`` (in a disaggregated cluster after the prefill
        pool and the KV handovers ready by ``t``, in the order of the main loop)."""
        if self.back:
            for r in self.front:
                r.advance(t)
            self._flush_kv(t)
        for r in self.migrator.pool:
            r.advance(t)

    def _idle(self) -> bool:
        """No request in the system (nor in flight to the decode pool)."""
        return not self.events.kv_heap and not any(_has_work(r) for r in self.replicas())

    def _busy(self, t: float) -> bool:
        """Whether the replicas (advanced to ``t``) may still have candidates after ``t``;
        a replica that idles before ``t`` with requests waiting holds them back for good."""
        return bool(self.events.kv_heap) or any(
            r.running or r.releases or r.loading or (r.waiting and r.now >= t)
            for r in self.replicas())

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        """Simulate the whole trace; returns ``{"wall_s": seconds}``."""
        t0 = time.perf_counter()
        S = self.state
        deps = self.deps
        i = 0  # next arrival (traces without parents)
        if self._arrivals_in_one_call():
            i = int(np.searchsorted(S.arrival, self.horizon_s, side="left"))
            ids, n_rep = np.arange(i, dtype=np.int64), len(self.front)
            if self.predictor is not None:  # it sees every replica's completions
                compiled.enqueue_all_cluster(self.front, ids, S.arrival[:i].copy(),
                                             self._history_twin())
            else:
                for k, r in enumerate(self.front[:i]):  # round robin: j on replica j mod R
                    mine = ids[k::n_rep].copy()
                    r.enqueue_all(mine, S.arrival[mine])
            i = S.n  # every arrival before the horizon joined; the rest never do
        while True:
            t = self._next_arrival_s(i)
            if deps is not None:
                if self.events.kv_heap:
                    t = min(t, self.events.kv_heap[0][0])
                self._advance_conservatively(t)
                if self._next_dependent_event_s() < t:
                    continue  # a completion released an earlier event
            if t >= self.horizon_s:  # also t == inf: nothing left to route
                break
            self._routed_s = t
            if self.migrator is not None:  # landings and rebalancing ticks up to t
                self._migration_events(t)
            if self.back:
                for r in self.front:
                    r.advance(t)
                self._flush_kv(t)
            if deps is not None:
                req = deps.due(t)
            else:
                j = i + 1
                while j < S.n and S.arrival[j] == t:
                    j += 1
                req, i = list(range(i, j)), j
            if not req:
                continue
            if self.predictor is not None:
                self._predict(req, t)
            for k, r in zip(req, self._route(self.front, req, t, "prefill" if self.back
                                             else "colocated")):
                self.front[r].enqueue(k, t)
        if self.migrator is not None:
            self._drain_migrations()
        for r in self.front:
            r.advance(math.inf)
        if self.back:
            self._flush_kv(math.inf)
            for r in self.back:
                r.advance(math.inf)
        compiled.finalize_reasons(S)
        self.runset.sync_policy_state(self.replicas())
        self._label_unfinished()
        if deps is not None:
            deps.label(S)
        if self.check:
            check_final(S)
        return {"wall_s": time.perf_counter() - t0}

    def _arrivals_in_one_call(self) -> bool:
        """Whether the loop reads nothing between two arrivals, so that each replica takes
        its arrivals in one kernel call: compiled replicas that never read each other (one
        replica, whose router is not asked, or several under round robin, whose routes read
        no state, with a scheduler that shares no state across them:
        ``twins.independent_replicas``), no dependencies, decode pool or rebalancer, no
        invariant checks, and no predictor or one with a compiled twin (History: the kernel
        asks it at each arrival, after every replica advanced to that time) on a
        homogeneous cluster."""
        if self.check or self.reference or self.deps is not None or self.back or \
                self.migrator is not None:
            return False
        # the one-call History path prices every replica with the run's cost model
        history = self._history_twin() is not None and not self.heterogeneous
        return (self.predictor is None or history) and (
            len(self.front) == 1
            or twins.independent_replicas(self.policy, self.ctx.ranks_in_python))

    def _history_twin(self) -> tuple | None:
        """The predictor's compiled state ``(state, ip, fp)`` when it is History's
        (``kernel_spec()``), else None."""
        spec = twins.twin_spec(self.predictor)
        return spec[1] if spec is not None and spec[0] == "history" else None

    def _label_unfinished(self) -> None:
        """Give every request left unfinished the reason the run ended without it."""
        S = self.state
        finite = math.isfinite(self.horizon_s)
        for i in np.flatnonzero((S.status != FINISHED) & (S.status != REJECTED)).tolist():
            st = S.status[i]
            if st == PENDING:
                S.reason[i] = "arrived_after_horizon"
            elif finite:
                S.reason[i] = "horizon"
            elif st == WAITING:
                S.reason[i] = "held_back"
            else:
                S.reason[i] = "stalled"

    def replicas(self) -> list[Any]:
        """Every replica: the front (colocated or prefill) pool, then the decode pool."""
        return self.front + self.back
