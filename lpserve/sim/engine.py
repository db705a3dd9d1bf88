"""The cluster-level event loop: arrivals, routing, KV transfers, replicas."""
from __future__ import annotations

import heapq
import math
import time
from typing import Any

import numpy as np

from lpserve.instance import Instance
from lpserve.policy import Policy, PolicyError, RouterView
from lpserve.sim.blocks import BlockError
from lpserve.sim.replica import Replica
from lpserve.sim.state import (FINISHED, PENDING, REJECTED, RUNNING, TRANSFER, WAITING,
                               State)


class InvariantError(AssertionError):
    """A simulator invariant failed (only raised with ``check=True``)."""


class Simulation:
    """One run of ``policy`` on ``instance``; see :func:`lpserve.sim.simulate`."""

    def __init__(self, instance: Instance, policy: Policy, seed: int = 0, *,
                 reference: bool = False, check: bool = False, predictor: Any = None) -> None:
        self.instance = instance
        self.policy = policy
        self.seed = int(seed)
        self.reference = bool(reference)
        self.check = bool(check)
        self.state = State(instance.trace)
        tr = instance.trace
        # predicted output intervals shown to schedulers: the trace's, or the predictor's
        # (filled at arrival; the predictor observes each completion after it happens)
        self.predictor = predictor
        if predictor is None:
            self.pred_lo, self.pred_hi = tr.predicted_lo, tr.predicted_hi
        else:
            self.pred_lo = np.ones(len(tr), np.int64)
            self.pred_hi = np.ones(len(tr), np.int64)
            self._observed = np.zeros(len(tr), bool)
        self.cost = instance.cost_model()
        self.params = np.ascontiguousarray(self.cost.params, dtype=np.float64)
        cl = instance.cluster
        self.cluster = cl
        self.block_tokens = int(cl.block_tokens)
        self.total_blocks = int(self.cost.kv_capacity_blocks(
            block_tokens=self.block_tokens, gpu_memory_fraction=cl.gpu_memory_fraction))
        block_bytes = float(self.cost.kv_bytes_per_token) * self.block_tokens
        self.host_blocks = int(cl.host_memory_gb * 1e9 // block_bytes) if block_bytes > 0 else 0
        self.kv_scale = 1.0  # KV bytes per token over the target's (> 1 with a draft model)
        self.spec = None
        if policy.engine.speculation is not None:  # draft memory resizes the KV pool
            from lpserve.sim.speculative import SpecRunner

            self.spec = SpecRunner(self)
        if self.total_blocks < 1:
            raise ValueError(f"cluster {cl.gpu}/{cl.llm} tp={cl.tp}: no room for KV blocks "
                             f"(kv_capacity_blocks = {self.total_blocks})")
        self.link_gbps = cl.link_gbps
        self.horizon_s = math.inf if instance.horizon_s is None else float(instance.horizon_s)
        from lpserve.sim import compiled

        from lpserve.sim.dependencies import DependencyLoop, has_dependencies

        self.deps = DependencyLoop(self) if has_dependencies(tr) else None
        if policy.rebalancer is not None and self.deps is not None:
            raise ValueError(f"policy {policy.name!r}: a rebalancer cannot run on a trace with "
                             "parent dependencies")
        self.compiled = (compiled.eligible(self) and policy.engine.budget_controller is None
                         and not policy.engine.priority_preemption
                         and policy.rebalancer is None)
        if self.compiled:
            self.front = [compiled.CompiledReplica(self, k) for k in range(cl.replicas)]
            self.back = []
        elif cl.disaggregated:
            self.front = [Replica(self, k, "prefill") for k in range(cl.prefill_replicas)]
            self.back = [Replica(self, k, "decode") for k in range(cl.decode_replicas)]
        else:
            self.front = [Replica(self, k, "colocated") for k in range(cl.replicas)]
            self.back = []
        self.kv_heap: list[tuple[float, int]] = []
        self._last_now = {}
        self.migrator = None
        if policy.rebalancer is not None:
            from lpserve.sim.migration import Migrator

            self.migrator = Migrator(self)

    # ------------------------------------------------------------------ callbacks
    def role_name(self, role: str) -> str:
        obj = getattr(self.policy, role)
        return f"policy {self.policy.name!r} ({role} {getattr(obj, 'name', obj)!r})"

    def reject(self, i: int, reason: str, t: float) -> None:
        S = self.state
        S.status[i] = REJECTED
        S.reason[i] = reason
        S.forget_keys(i)
        S.finish[i] = np.nan

    def kv_ready(self, i: int, t: float) -> None:
        heapq.heappush(self.kv_heap, (t, i))

    def check_replica(self, r: Replica) -> None:
        if not self.check:
            return
        if getattr(r, "cfg", None) is not None:  # a compiled replica
            msg = r.check()
            if msg:
                raise InvariantError(f"replica {r.index}: {msg}")
            return
        try:
            r.bm.check()
        except BlockError as exc:
            raise InvariantError(f"replica {r.role}{r.index}: {exc}") from None
        S = self.state
        last = self._last_now.get(id(r), -math.inf)
        if r.now < last:
            raise InvariantError(f"replica {r.index}: time went back {last} -> {r.now}")
        self._last_now[id(r)] = r.now
        anon = int(S.anon[r.running].sum()) + sum(a for *_, a in r.releases) + \
            sum(r.inbound.values())
        if anon != r.bm.anon_used:
            raise InvariantError(f"replica {r.index}: anonymous blocks of requests {anon} != "
                                 f"pool {r.bm.anon_used}")
        refs = np.zeros(r.bm.total, np.int64)
        for i in r.running:
            np.add.at(refs, np.asarray(S.slots[i], np.int64), 1)
        for _, _, slots, _ in r.releases:
            np.add.at(refs, np.asarray(slots, np.int64), 1)
        if not np.array_equal(refs, r.bm.ref):
            raise InvariantError(f"replica {r.index}: slot references do not match holders")
        if r.bm.used > r.bm.total:
            raise InvariantError(f"replica {r.index}: {r.bm.used} blocks used > {r.bm.total}")
        if r.running:
            idx = np.asarray(r.running)
            if np.any(S.arrival[idx] > r.now):
                raise InvariantError(f"replica {r.index}: a request ran before it arrived")
            if np.any(S.status[idx] != RUNNING):
                raise InvariantError(f"replica {r.index}: running list holds non-running ids")
        self._check_host(r)

    def _check_host(self, r: Replica) -> None:
        """Host memory: free >= 0 and free + blocks of the replica's swapped requests is the
        host capacity; a swapped request holds ceil(GPU blocks / ratio) host blocks when
        compressed (models/kv-compression-swap.md (2)), its GPU blocks otherwise, and those
        GPU blocks cover its whole context."""
        from lpserve.preemption import compressed_host_blocks

        S = self.state
        if r.host_free < 0:
            raise InvariantError(f"replica {r.index}: host_free = {r.host_free} < 0")
        sw = [i for i in r.waiting if S.swapped[i]]
        held = int(S.host_blocks[sw].sum()) if sw else 0
        if r.host_free + held != self.host_blocks:
            raise InvariantError(f"replica {r.index}: host_free {r.host_free} + swapped "
                                 f"{held} != host capacity {self.host_blocks}")
        ratio = self.policy.engine.compression_ratio
        for i in sw:
            g = int(S.swap_gpu_blocks[i])
            want = compressed_host_blocks(g, ratio) if S.compressed[i] else g
            if int(S.host_blocks[i]) != want or int(S.computed[i]) > g * r.bt:
                raise InvariantError(f"replica {r.index}: swapped request {i} holds "
                                     f"{int(S.host_blocks[i])} host blocks for {g} GPU "
                                     f"blocks and {int(S.computed[i])} tokens")

    def check_final(self) -> None:
        """After the run: every request still swapped out is labelled with a reason."""
        S = self.state
        bad = np.flatnonzero(S.swapped & ((S.status != WAITING) | (S.reason == "")))
        if bad.size:
            i = int(bad[0])
            raise InvariantError(f"request {i} ended swapped out with status {S.status[i]} "
                                 f"and no reason")

    # ------------------------------------------------------------------ routing
    def _route(self, pool: list[Replica], req: list[int], t: float, phase: str) -> list[int]:
        S = self.state
        role = "decode_router" if phase == "decode" else "router"
        router = getattr(self.policy, role)
        tr = S.trace

        def replica_state() -> dict[str, np.ndarray]:
            for r in pool:
                r.advance(t)
            return {
                "outstanding": np.array([r.outstanding for r in pool]),
                "waiting": np.array([len(r.waiting) for r in pool]),
                "running": np.array([len(r.running) for r in pool]),
                "used_blocks": np.array([r.bm.used for r in pool]),
                "total_blocks": np.array([r.bm.total for r in pool]),
            }

        contiguous = req[-1] - req[0] == len(req) - 1
        idx = slice(req[0], req[-1] + 1) if contiguous else np.asarray(req, np.int64)
        view = RouterView(
            now_s=t, n_replicas=len(pool), phase=phase,
            request=np.arange(req[0], req[-1] + 1) if contiguous else idx,
            arrival_s=S.arrival[idx], prompt_tokens=S.prompt[idx], tenant=S.tenant[idx],
            session_id=S.session[idx],
            predicted_lo=None if self.pred_lo is None else self.pred_lo[idx],
            predicted_hi=None if self.pred_hi is None else self.pred_hi[idx],
            output_tokens=S.out[idx] if self.policy.meta.clairvoyant else None,
            block_keys=lambda: tuple(S.trace_keys(i) for i in req),
            replica_state=replica_state, block_tokens=self.block_tokens)
        out = router.route(view)
        if type(out) is np.ndarray and out.shape == (1,) and out.dtype.kind in "iu" and \
                0 <= out[0] < len(pool):
            return [int(out[0])]
        out = np.asarray(out)
        name = self.role_name(role)
        if out.shape != (len(req),):
            raise PolicyError(f"{name}: route() returned shape {out.shape}, expected "
                              f"({len(req)},)")
        if out.dtype.kind == "f":
            if np.isnan(out).any() or np.any(out != np.round(out)):
                raise PolicyError(f"{name}: route() returned NaN or non-integer replicas {out}")
        elif out.dtype.kind not in "iu":
            raise PolicyError(f"{name}: route() returned dtype {out.dtype}, expected integers")
        out = out.astype(np.int64)
        if out.size and (out.min() < 0 or out.max() >= len(pool)):
            raise PolicyError(f"{name}: route() returned replica {int(out.max() if out.max() >= len(pool) else out.min())} "
                              f"outside [0, {len(pool)})")
        return out.tolist()

    def _flush_kv(self, until: float) -> None:
        """Route and hand over every transferred request whose KV is ready by ``until``."""
        while self.kv_heap and self.kv_heap[0][0] <= until:
            t, i = heapq.heappop(self.kv_heap)
            group = [i]
            while self.kv_heap and self.kv_heap[0][0] == t:
                group.append(heapq.heappop(self.kv_heap)[1])
            for i2, r in zip(group, self._route(self.back, group, t, "decode")):
                self.back[r].enqueue(i2, t)

    # ------------------------------------------------------------------ predictions
    def _predict(self, req: list[int], t: float) -> None:
        """Show the predictor every completion up to ``t``, then predict ``req``."""
        S, pr = self.state, self.predictor
        for r in self.replicas():
            r.advance(t)
        done = np.flatnonzero((S.status == FINISHED) & ~self._observed & (S.finish <= t))
        if done.size:
            done = done[np.lexsort((done, S.finish[done]))]
            self._observed[done] = True
            pr.observe(S.prompt[done], S.tenant[done], S.out[done])
        idx = np.asarray(req, np.int64)
        p = pr.predict(S.prompt[idx], S.tenant[idx],
                       _truth=S.out[idx] if getattr(pr, "uses_truth", False) else None)
        lo, hi = np.asarray(p.lo, np.int64), np.asarray(p.hi, np.int64)
        if lo.shape != idx.shape or hi.shape != idx.shape or np.any(lo < 1) or \
                np.any(hi < lo):
            raise ValueError(f"predictor {getattr(pr, 'name', pr)!r}: predictions must be "
                             f"intervals 1 <= lo <= hi of shape {idx.shape}, got lo={lo[:4]} "
                             f"hi={hi[:4]}")
        self.pred_lo[idx] = lo
        self.pred_hi[idx] = hi

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        S = self.state
        self.policy.reset(self.cluster, np.random.default_rng(self.seed))
        if self.policy.engine.preemption_decider is not None:
            self.policy.engine.preemption_decider.reset(
                self.cluster, np.random.default_rng([self.seed, 11]))
        if self.predictor is not None:
            self.predictor.reset(np.random.default_rng([self.seed, 7]))
        arr = S.arrival
        n = 0 if self.deps is not None else S.n
        i = 0
        if self.deps is not None:  # requests with parents: the dependency-aware loop
            self.deps.run()
        while i < n:
            t = float(arr[i])
            if t >= self.horizon_s:
                break
            j = i + 1
            while j < n and arr[j] == t:
                j += 1
            if self.migrator is not None:  # landings and rebalancing ticks up to t
                self.migrator.run_until(t)
            if self.back:
                for r in self.front:
                    r.advance(t)
                self._flush_kv(t)
            req = list(range(i, j))
            if self.predictor is not None:
                self._predict(req, t)
            for k, r in zip(req, self._route(self.front, req, t, "prefill" if self.back
                                             else "colocated")):
                self.front[r].enqueue(k, t)
            i = j
        if self.migrator is not None:
            self.migrator.drain()
        for r in self.front:
            r.advance(math.inf)
        if self.back:
            self._flush_kv(math.inf)
            for r in self.back:
                r.advance(math.inf)
        if self.compiled:
            from lpserve.sim.compiled import finalize_reasons

            finalize_reasons(self)
        self._label_unfinished()
        if self.deps is not None:
            self.deps.label()
        if self.check and not self.compiled:
            self.check_final()
        return {"wall_s": time.perf_counter() - t0}

    def _label_unfinished(self) -> None:
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

    def replicas(self) -> list[Replica]:
        return self.front + self.back
