"""The event-driven simulator: ``simulate(instance, policy, seed=0) -> Result``.

Continuous batching over paged KV blocks with prefix caching, chunked prefill,
recompute or swap preemption, several replicas behind a router, and prefill/decode
disaggregation with KV transfer over links. Engine semantics: ``models/simulator.md``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lpserve import objectives as obj
from lpserve.instance import Instance
from lpserve.policy import Policy
from lpserve.sim.state import FINISHED, STATUS_NAMES

__all__ = ["Result", "simulate", "REQUEST_COLUMNS"]

REQUEST_COLUMNS = ("request", "arrival_s", "release_s", "first_scheduled_s", "first_token_s", "finish_s",
                   "ttft_s", "tpot_s", "e2e_s", "queue_s", "prompt_tokens", "output_tokens",
                   "generated_tokens", "preemptions", "cached_prompt_tokens", "replica",
                   "decode_replica", "status", "reason")


@dataclass(frozen=True, eq=False)
class Result:
    """Outcome of one simulation.

    Attributes:
        arrays: per-request arrays of shape ``(n,)`` keyed by :data:`REQUEST_COLUMNS`.
            ``release_s`` is when a request entered routing: its ``arrival_s``, or for a
            request with a ``parent`` ``max(arrival_s, parent's finish)`` (NaN if never
            released); TTFT, E2E and queue times are measured from it.
        instance_digest: :meth:`Instance.digest` of the input.
        policy: the policy's name; seed: the seed.
        stats: per-run counters (``iterations``, ``decode_iterations``, ``swaps``,
            ``kv_utilization``, ``total_blocks`` (of the first replica),
            ``replica_total_blocks`` (of each), ``wall_s``); for preemption
            (models/kv-compression-swap.md): ``compressed_swaps`` (of ``swaps``),
            ``compressed_tokens`` (context tokens swapped compressed),
            ``compression_quality_loss`` (``compression_accuracy_cost`` x those tokens),
            ``swap_wait_s`` and ``busy_s`` (seconds of iterations spent on swaps, and in
            iterations); ``link_wait_s`` (seconds the finished requests waited on the host
            link: serial swaps charged to their iterations, swap-ins they waited for,
            iterations stalled for swap-outs; ``models/simulator.md`` (29)),
            ``link_copies`` and ``link_busy_s`` (overlapped copies and their time; 0 with
            serial swaps); ``speculation`` (steps,
            speculative steps, drafted, accepted and emitted tokens;
            :meth:`lpserve.sim.speculative.SpecRunner.summary`; None without speculative
            decoding); ``offload`` (``tier_blocks``, ``hit_tokens``, ``loaded_blocks``,
            ``load_s``, ``stored_blocks``, ``dropped_blocks``, summed over replicas;
            None without CPU KV offload);
            ``migrations``, ``migrated_gb`` and ``migration_s``, the summed copy time,
            counted when a copy starts (0 without a rebalancer). Every run has these
            keys, in either mode).
            ``arrays["migrations"]`` counts each request's live migrations and
            ``arrays["migrated_to"]`` is its last destination (-1: never migrated;
            ``replica`` stays the router's choice).
        slo: ``(ttft_s, tpot_s)`` used for goodput.
        request_slos: per request ``(ttft_s, tpot_s, tier)`` arrays, shape ``(n,)``, from
            the instance's tiers (:meth:`lpserve.instance.Instance.request_slos`), for the
            per-tenant and per-tier metrics; ``None`` uses ``slo`` for every request.
        slo_e2e_s: the instance's end-to-end deadline (``SLO.e2e_s``), counted by goodput;
        request_e2e_s: per request deadline ``(n,)`` from the tiers, or ``None``.
    """

    arrays: dict[str, np.ndarray]
    instance_digest: str
    policy: str
    seed: int
    stats: dict[str, Any] = field(default_factory=dict)
    slo: tuple[float, float] = (float("inf"), float("inf"))
    request_slos: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    slo_e2e_s: float = float("inf")
    request_e2e_s: np.ndarray | None = None

    def __repr__(self) -> str:
        a = self.arrays
        st = a["status"]
        fin = st == "finished"
        n = int(st.shape[0])
        e2e = a["e2e_s"][fin]
        mean = f"{float(e2e.mean()):.4g} s" if e2e.size else "n/a"
        return (f"Result(policy={self.policy!r}, seed={self.seed}, {n:,} requests: "
                f"{int(fin.sum()):,} finished, {int((st == 'rejected').sum()):,} rejected, "
                f"{int(n - fin.sum() - (st == 'rejected').sum()):,} unfinished; e2e mean "
                f"{mean}; res.requests: one row per request, res.summary(): metrics)")

    @property
    def requests(self):
        """One row per request (pandas DataFrame with :data:`REQUEST_COLUMNS`)."""
        import pandas as pd

        return pd.DataFrame({k: self.arrays[k] for k in REQUEST_COLUMNS})

    def summary(self, flat: bool = False) -> dict[str, Any]:
        """Metrics with the DESIGN keys (see :func:`lpserve.objectives.summarize`), plus
        ``reasons`` (count per reason of every request not finished), ``preemptions``,
        ``rejected_share`` and ``warnings``: one line (in capitals: REJECTED) when the
        policy rejected more than 1 % of the requests
        (:data:`lpserve.objectives.REJECTION_WARN_SHARE`), whose latencies then cover only
        the requests it accepted. ``flat=True``: the numbers only, with ``lp.compare``'s
        column names (``summary()["e2e_s"]["mean"]`` is ``summary(flat=True)
        ["e2e_s_mean"]``; :func:`lpserve.objectives.flatten`)."""
        if flat:
            return obj.flatten(self.summary())
        a = self.arrays
        # latencies count from the release (the effective arrival); a request never
        # released (reason parent_not_finished) is pending and counted as unfinished
        rel = a["release_s"]
        eff = np.where(np.isnan(rel), a["arrival_s"], rel)
        s = obj.summarize(
            arrival_s=eff, first_token_s=a["first_token_s"], finish_s=a["finish_s"],
            first_scheduled_s=a["first_scheduled_s"], output_tokens=a["output_tokens"],
            finished=a["status"] == "finished", rejected=a["status"] == "rejected",
            cached_prompt_tokens=a["cached_prompt_tokens"], prompt_tokens_seen=a["seen_tokens"],
            slo_ttft_s=self.slo[0], slo_tpot_s=self.slo[1], wall_s=self.stats.get("wall_s", 0.0),
            kv_utilization=self.stats.get("kv_utilization", float("nan")),
            slo_e2e_s=self.slo_e2e_s)
        reasons = a["reason"][a["reason"] != ""]
        s["reasons"] = {str(k): int(v) for k, v in zip(*np.unique(reasons, return_counts=True))} \
            if reasons.size else {}
        # say loudly when the policy turned away more than 1 % of the trace
        rej = a["reason"][a["status"] == "rejected"]
        rej_reasons = {str(k): int(v) for k, v in zip(*np.unique(rej, return_counts=True))} \
            if rej.size else {}
        s["rejected_share"] = s["n_rejected"] / s["n_requests"] if s["n_requests"] else 0.0
        w = obj.rejection_warning(s["n_rejected"], s["n_requests"], rej_reasons, self.policy)
        s["warnings"] = [w] if w else []
        s["preemptions"] = int(a["preemptions"].sum())
        s["migrations"] = int(self.stats.get("migrations", 0))  # live migrations
        s["migrated_gb"] = float(self.stats.get("migrated_gb", 0.0))
        s.update(self.tenant_summary())
        return s

    def tenant_summary(self) -> dict[str, Any]:
        """``tenants`` (per tenant: requests, service received, TTFT/E2E distributions,
        SLO attainment), ``jain_index`` of the service over tenants and ``tiers`` (SLO
        attainment per tier); see :func:`lpserve.objectives.tenant_summary`."""
        a = self.arrays
        n = a["request"].shape[0]
        if self.request_slos is None:
            slos = (np.full(n, self.slo[0]), np.full(n, self.slo[1]),
                    np.full(n, "default", dtype=object))
        else:
            slos = self.request_slos
        rel = a["release_s"]
        return obj.tenant_summary(
            tenant=a.get("tenant", np.full(n, -1, np.int64)),
            arrival_s=np.where(np.isnan(rel), a["arrival_s"], rel),
            first_token_s=a["first_token_s"], finish_s=a["finish_s"],
            first_scheduled_s=a["first_scheduled_s"], prompt_tokens=a["prompt_tokens"],
            output_tokens=a["output_tokens"], generated_tokens=a["generated_tokens"],
            finished=a["status"] == "finished", slo_ttft_s=slos[0], slo_tpot_s=slos[1],
            tier=slos[2], slo_e2e_s=(self.request_e2e_s if self.request_e2e_s is not None
                                     else np.full(n, self.slo_e2e_s)))

    def digest(self) -> str:
        """sha256 of the per-request outcomes, the instance digest, policy and seed
        (``release_s`` is hashed only when it differs from ``arrival_s``)."""
        h = hashlib.sha256()
        h.update(f"{self.instance_digest}|{self.policy}|{self.seed}".encode())
        a = self.arrays
        for k in REQUEST_COLUMNS:
            v = a[k]
            if k == "release_s" and np.array_equal(v, a["arrival_s"]):
                continue  # no dependencies: the digest of earlier versions
            h.update(k.encode())
            h.update(("|".join(map(str, v.tolist()))).encode() if v.dtype == object
                     else np.ascontiguousarray(v).tobytes())
        return h.hexdigest()


def simulate(instance: Instance, policy: Policy, seed: int = 0, *,
             reference: bool = False, check: bool = False, predictor: Any = None,
             iteration_log: list | None = None) -> Result:
    """Simulate ``policy`` (a :class:`~lpserve.policy.Policy`) on ``instance``.

    A pure function of its arguments (``lp.simulate`` also takes a registered name).
    ``reference=True`` plans one iteration per step (no decode runs; slower, for tests:
    it gives the same per-request results, ``models/simulator.md`` (15)); there,
    ``iteration_log`` (a list) gets every iteration appended, ``(replica key, t0_s, t1_s,
    chunks, decodes)``, with ``chunks`` ``(request, tokens, context before, generated
    before)`` and ``decodes`` ``(request, context, generated before)``. ``check=True`` verifies the block and timing invariants after
    every event and raises :class:`~lpserve.sim.invariants.InvariantError`. ``predictor``
    (a :class:`lpserve.policy.hooks.Predictor`, copied and reset with a generator derived
    from ``seed``) replaces the trace's predicted output intervals: each request's
    ``[lo, hi]`` is predicted at its arrival, and the predictor observes every completion
    before the next arrival; ``None`` shows the trace's ``predicted_lo/hi``.
    """
    import copy

    from lpserve.sim.engine import Simulation

    if predictor is not None:
        if not (hasattr(predictor, "predict") and hasattr(predictor, "observe")):
            raise ValueError(f"simulate: predictor must have predict() and observe(), got "
                             f"{type(predictor).__name__}")
        predictor = copy.deepcopy(predictor)
    if isinstance(policy, str):
        raise ValueError(f"lpserve.sim.simulate takes a Policy, got the name {policy!r}: "
                         "use lp.simulate (or lpserve.registry.make_policy) for registered "
                         "names")
    if not isinstance(policy, Policy):
        raise ValueError(f"simulate: policy must be a Policy, got {type(policy).__name__}")
    if not isinstance(instance, Instance):
        raise ValueError(f"simulate: instance must be an Instance, got {type(instance).__name__}")
    sim = Simulation(instance, policy, seed, reference=reference, check=check,
                     predictor=predictor, iteration_log=iteration_log)
    info = sim.run()
    S = sim.state
    # what the client sees: tokens the serving front end's latency after the engine made
    # them (models/simulator.md (33)); the engine's own times are first_token - front
    front = sim.frontend_latency_of(np.arange(S.n, dtype=np.int64))
    first_token, finish = S.first_token + front, S.finish + front
    arrays = {
        "request": np.arange(S.n, dtype=np.int64),
        "arrival_s": np.array(instance.trace.arrival_s, np.float64, copy=True),
        "release_s": S.release.copy(),
        "first_scheduled_s": S.first_sched,
        "first_token_s": first_token,
        "finish_s": finish,
        "ttft_s": obj.ttft_s(S.arrival, first_token),
        "tpot_s": obj.tpot_s(S.first_token, S.finish, S.out),
        "e2e_s": obj.e2e_s(S.arrival, finish),
        "queue_s": obj.queue_s(S.arrival, S.first_sched),
        "prompt_tokens": S.prompt.copy(),
        "output_tokens": S.out.copy(),
        "generated_tokens": S.gen,
        "preemptions": S.preempt,
        "migrations": S.migrations,
        "migrated_to": S.migrated_to,
        "cached_prompt_tokens": S.cached_tok,
        "seen_tokens": S.seen_tok,
        "replica": S.replica,
        "decode_replica": S.decode_replica,
        "tenant": S.tenant.copy(),
        "status": np.array([STATUS_NAMES[s] for s in S.status.tolist()], dtype=object),
        "reason": S.reason,
    }
    stats = _run_stats(sim, policy, info["wall_s"])
    return Result(arrays=arrays, instance_digest=instance.digest(), policy=policy.name,
                  seed=int(seed), stats=stats, slo=(instance.slo.ttft_s, instance.slo.tpot_s),
                  request_slos=instance.request_slos() if instance.tiers else None,
                  slo_e2e_s=instance.slo.e2e_s,
                  request_e2e_s=instance.request_e2e_s() if instance.tiers else None)


def _run_stats(sim: Any, policy: Policy, wall_s: float) -> dict[str, Any]:
    """``Result.stats`` of a finished :class:`~lpserve.sim.engine.Simulation` (the same
    keys on every run; see :class:`Result`)."""
    S, reps = sim.state, sim.replicas()
    span = max((r.now for r in reps), default=0.0) - (float(S.arrival[0]) if S.n else 0.0)
    util = (sum(r.used_block_s for r in reps) / (sum(r.bm.total for r in reps) * span)
            if span > 0 else float("nan"))
    stats = {
        "iterations": int(sum(r.n_iters for r in reps)),
        "decode_iterations": int(sum(r.n_decode_iters for r in reps)),
        "swaps": int(sum(r.n_swaps for r in reps)),
        # compressed swaps and swap time (models/kv-compression-swap.md)
        "compressed_swaps": int(sum(r.n_compressed_swaps for r in reps)),
        "compressed_tokens": int(sum(r.compressed_tokens for r in reps)),
        "compression_quality_loss": float(policy.engine.compression_accuracy_cost * sum(
            r.compressed_tokens for r in reps)),
        "swap_wait_s": float(sum(r.swap_wait_s for r in reps)),
        "busy_s": float(sum(r.busy_s for r in reps)),
        "total_blocks": sim.total_blocks,
        "replica_total_blocks": [int(r.bm.total) for r in reps],
        "host_blocks": sim.host_blocks,
        "kv_utilization": util,
        "wall_s": wall_s,
        # which hooks ran in Python: "compiled" (numba replicas), with "+python-ranks" (a
        # scheduler written in Python, asked at planning steps) and "+python-evictor" (an
        # evictor written in Python, asked at evictions and told of arrivals and
        # finishes), "+python-decider" (a preemption decider written in Python, asked
        # per victim), "+python-controller" (a budget controller written in Python) and
        # "+python-speculation" (a speculation decider written in Python, asked per
        # speculative step), and "+reference" in the reference mode (one iteration per
        # step)
        "engine": sim.engine_name,
    }
    # the host link (models/simulator.md (26)-(31)): seconds the finished requests waited
    # on it, and the overlapped copies and their link occupancy (0 with serial swaps)
    fin = S.status == FINISHED
    stats["link_wait_s"] = float(S.link_wait[fin].sum())
    links = [r.link for r in reps if getattr(r, "link", None) is not None]
    stats["link_copies"] = int(sum(k.n_copies for k in links))
    stats["link_busy_s"] = float(sum(k.busy_s for k in links))
    # every run has the same keys: an engine feature that is off gives None or zeros
    offloads = [r.offload for r in reps if getattr(r, "offload", None) is not None]
    # CPU KV offload (lpserve/sim/_offload_kernels.py): summed over replicas
    stats["offload"] = {k: sum(o.stats()[k] for o in offloads)
                        for k in offloads[0].stats()} if offloads else None
    # speculative decoding counters (lpserve/sim/speculative.py)
    stats["speculation"] = sim.spec.summary() if sim.spec is not None else None
    # migrations, migrated_gb, migration_s (transfer time)
    stats.update(sim.migrator.stats() if sim.migrator is not None else
                 {"migrations": 0, "migrated_gb": 0.0, "migration_s": 0.0})
    return stats
