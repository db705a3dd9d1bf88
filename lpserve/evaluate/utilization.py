"""An estimate of how many requests per second a cluster can serve (layer 5), so that a
load can be stated as a utilisation instead of a rate scale. (The simulated capacity under
latency objectives is :mod:`lpserve.evaluate.capacity`; this one needs no simulation.)

**The estimator** (:func:`fluid_capacity`): a fluid model of each replica as one server
of GPU time, with the instance's cost model. Request ``i`` (prompt ``P_i``, output
``D_i``) needs

    w_i = T(prefill P_i alone) + D_i * tau(B) / B

GPU-seconds: its prompt prefilled in one iteration without prefix-cache hits, and its
``D_i`` decode steps each taking a ``1/B`` share of a decode iteration of ``B`` sequences
at the mean resident context ``c = mean(P) + mean(D) / 2`` (the mean KV a request holds
while it decodes). ``B = min(max_num_seqs, floor(K / c))`` with ``K`` the replica's KV
capacity (tokens): the batch that memory allows. A colocated cluster of ``R`` replicas
serves at most ``capacity_rps = R / mean_i(w_i)`` (a heterogeneous one the sum over its
replicas of ``1 / mean_i(w_i)``, each ``w_i`` priced by that replica's own cost model and KV
capacity; the reported per-request times are then means over the replicas); a
disaggregated one the smaller of its
prefill pool (``R_p / mean T(prefill)``) and decode pool (``R_d / mean(D_i tau/B)``).
Utilisation ``u`` of a trace with arrival rate ``lambda`` is ``lambda / capacity_rps``.

It is an estimate, not a bound: it ignores prefix-cache hits and prefills that share an
iteration with decodes (both make the real capacity larger), queueing, preemption and
batches smaller than ``B`` (which make it smaller). Utilisation 1 is where the fluid
model saturates; the simulated engines may saturate somewhat before or after it.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: the decode batch limit of the estimate when the engine's is not given (vLLM's default)
DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class CapacityEstimate:
    """The fluid capacity of a cluster for one trace's request mix (module docstring).

    Attributes:
        capacity_rps: requests per second the whole cluster can serve (fluid model).
        trace_rate_rps: the trace's own arrival rate (requests / span).
        prefill_s: mean lone-prefill time of a request's prompt (s).
        decode_s: mean decode GPU-seconds of a request, ``D_i tau / B`` (s).
        decode_batch: ``B``, sequences per decode iteration.
        decode_iteration_s: ``tau``, seconds of one decode iteration of ``B`` sequences.
        context_tokens: ``c``, the mean resident context (tokens).
        kv_tokens: ``K``, KV capacity of one replica (tokens).
        replicas: replicas counted (colocated, or prefill + decode).
    """

    capacity_rps: float
    trace_rate_rps: float
    prefill_s: float
    decode_s: float
    decode_batch: int
    decode_iteration_s: float
    context_tokens: int
    kv_tokens: int
    replicas: int

    def utilization(self, load: float) -> float:
        """Utilisation of the trace at rate scale ``load`` (``load * rate / capacity``)."""
        return float(load) * self.trace_rate_rps / self.capacity_rps

    def load_for(self, utilization: float) -> float:
        """The rate scale at which the trace has utilisation ``utilization``."""
        return float(utilization) * self.capacity_rps / self.trace_rate_rps

    def describe(self) -> str:
        """One line: the capacity and how it was estimated."""
        return (f"fluid capacity {self.capacity_rps:.3g} req/s (cost model: mean lone "
                f"prefill {self.prefill_s * 1e3:.3g} ms + decode {self.decode_s * 1e3:.3g} "
                f"ms per request at batch {self.decode_batch} and context "
                f"{self.context_tokens:,} tokens, {self.replicas} replica(s); trace rate "
                f"{self.trace_rate_rps:.3g} req/s)")

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (JSON-ready)."""
        return asdict(self)


def fluid_capacity(instance: Any, *, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
                   ) -> CapacityEstimate:
    """The fluid capacity estimate of ``instance``'s cluster for its trace (module
    docstring); ``max_num_seqs`` caps the decode batch."""
    tr, cl = instance.trace, instance.cluster
    if len(tr) < 2:
        raise ValueError("fluid_capacity: the trace needs at least two requests (a rate)")
    if not (isinstance(max_num_seqs, (int, np.integer)) and max_num_seqs >= 1):
        raise ValueError(f"fluid_capacity: max_num_seqs must be a positive integer, got "
                         f"{max_num_seqs!r}")
    P = np.asarray(tr.prompt_tokens, np.int64)
    D = np.asarray(tr.output_tokens, np.int64)
    ctx = max(1, int(round(float(P.mean()) + float(D.mean()) / 2)))

    def per_replica(cost: Any) -> tuple[np.ndarray, np.ndarray, int, float, int]:
        """Lone-prefill and per-request decode seconds on one replica of ``cost``."""
        uniq = np.unique(P)
        pre = cost.prefill_alone_s(uniq)
        kv = int(cost.kv_capacity_tokens(cl.gpu_memory_fraction))
        B = int(max(1, min(int(max_num_seqs), kv // ctx)))
        tau = float(cost.batch_time_s(decode_context=np.full(B, ctx, np.int64)))
        return pre[np.searchsorted(uniq, P)], D * tau / B, B, tau, kv

    if cl.disaggregated:
        t_pre, dec, B, tau, kv = per_replica(instance.cost_model())
        cap = min(cl.prefill_replicas / float(t_pre.mean()),
                  cl.decode_replicas / float(dec.mean()))
        reps = cl.prefill_replicas + cl.decode_replicas
    else:  # each replica by its own cost model (heterogeneous clusters): rates add up
        models = instance.replica_cost_models()  # replicas of one type share one object
        count = Counter(id(c) for c in models)
        parts = {id(c): per_replica(c) for c in {id(c): c for c in models}.values()}
        cap = sum(count[k] / float((p[0] + p[1]).mean()) for k, p in parts.items())
        reps = cl.replicas

        def mean(j: int) -> Any:  # part j averaged over the replicas
            return sum(count[k] * p[j] for k, p in parts.items()) / len(models)

        t_pre, dec, tau = mean(0), mean(1), float(mean(3))
        B, kv = int(round(mean(2))), int(round(mean(4)))
    rate = float(tr.rate_per_s)
    if not (math.isfinite(cap) and cap > 0 and rate > 0):
        raise ValueError(f"fluid_capacity: no finite capacity ({cap}) or rate ({rate})")
    return CapacityEstimate(capacity_rps=float(cap), trace_rate_rps=rate,
                            prefill_s=float(t_pre.mean()), decode_s=float(dec.mean()),
                            decode_batch=B, decode_iteration_s=tau, context_tokens=ctx,
                            kv_tokens=kv, replicas=int(reps))


__all__ = ["DEFAULT_MAX_NUM_SEQS", "CapacityEstimate", "fluid_capacity"]
