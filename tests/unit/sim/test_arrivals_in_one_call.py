"""A lone compiled replica takes a whole trace's arrivals in one kernel call
(``Simulation._arrivals_in_one_call``): the run equals the one that hands it each arrival
in turn, through every stop for Python (ranks, a full event outbox) and the horizon."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies.predictors import make_predictor
from lpserve.policy import as_scheduler
from lpserve.sim import _step_kernels as SK
from lpserve.sim.compiled import CompiledReplica
from lpserve.sim.engine import Simulation


def _trace(n: int, seed: int) -> lp.Trace:
    rng = np.random.default_rng(seed)
    return lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0.0, 4.0, n)).round(2),
                                prompt_tokens=rng.integers(20, 900, n),
                                output_tokens=rng.integers(1, 120, n))


def _fifo_by_id(view):  # a scheduler written in Python: the compiled loop stops for it
    return np.asarray(view.request, np.float64)


@pytest.mark.parametrize("policy,horizon_s,stop", [
    (lp.make_policy("vllm", max_num_seqs=4), None, SK.NEED_ROOM),  # an outbox of 20 events
    (lp.make_policy("vllm").with_(scheduler=as_scheduler(_fifo_by_id), name="py"), None,
     SK.NEED_RANKS),
    (lp.make_policy("sarathi"), 2.5, None),  # arrivals at and after the horizon
    (lp.make_policy("srpt-oracle"), None, None),
])
def test_one_call_equals_one_arrival_at_a_time(monkeypatch, policy, horizon_s, stop):
    inst = lp.Instance(trace=_trace(300, 7), horizon_s=horizon_s,
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                          gpu_memory_fraction=0.2))
    calls = []
    real = Simulation._arrivals_in_one_call

    def spy(self):
        calls.append(real(self))
        return calls[-1]

    served = []
    serve = CompiledReplica._serve

    def spy_serve(self, code):
        served.append(code)
        return serve(self, code)

    monkeypatch.setattr(Simulation, "_arrivals_in_one_call", spy)
    monkeypatch.setattr(CompiledReplica, "_serve", spy_serve)
    one_call = lp.simulate(inst, policy, seed=1)
    assert calls == [True]
    if stop is not None:  # the one call stopped for Python and resumed
        assert stop in served
    monkeypatch.setattr(Simulation, "_arrivals_in_one_call", lambda self: False)
    each = lp.simulate(inst, policy, seed=1)
    assert one_call.digest() == each.digest()
    assert {k: v for k, v in one_call.stats.items() if k != "wall_s"} == \
        {k: v for k, v in each.stats.items() if k != "wall_s"}
    assert (one_call.arrays["status"] == "finished").sum() > 0


def test_not_taken_where_the_loop_reads_between_arrivals():
    inst = lp.Instance(trace=_trace(40, 1), cluster=lp.Cluster(gpu="a100-80gb",
                                                              llm="llama-2-7b", replicas=2))
    sim = Simulation(inst, lp.make_policy("vllm+least-outstanding"))
    assert not sim._arrivals_in_one_call()  # a router reads the replicas at each arrival
    assert not Simulation(inst, lp.make_policy("plas"))._arrivals_in_one_call()  # programs
    assert not Simulation(inst, lp.make_policy("vllm").with_(
        scheduler=as_scheduler(_fifo_by_id), name="py"))._arrivals_in_one_call()
    assert not Simulation(inst, lp.make_policy("mcsf"),
                          predictor=make_predictor("oracle"))._arrivals_in_one_call()
    assert Simulation(inst, lp.make_policy("vllm"))._arrivals_in_one_call()  # round robin
    one = lp.Instance(trace=_trace(40, 1), cluster=lp.Cluster(gpu="a100-80gb",
                                                             llm="llama-2-7b"))
    assert not Simulation(one, lp.make_policy("vllm"), check=True)._arrivals_in_one_call()
    assert not Simulation(one, lp.make_policy("vllm"), reference=True)._arrivals_in_one_call()
    assert Simulation(one, lp.make_policy("vllm"))._arrivals_in_one_call()


@pytest.mark.parametrize("name,engine,horizon_s", [
    ("mcsf", {"max_num_seqs": 4}, None),  # outbox stops: pending completions carried over
    ("sjf-predicted", {}, 2.5),
    ("mlfq-predicted", {}, None),
])
def test_one_call_asks_the_history_predictor_as_the_loop_does(monkeypatch, name, engine,
                                                              horizon_s):
    """The arrivals kernel shows the History predictor the completions up to each arrival
    (by finish time, then request) and predicts the arrival, as the loop does in Python."""
    inst = lp.Instance(trace=_trace(300, 11), horizon_s=horizon_s,
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                          gpu_memory_fraction=0.2))
    policy = lp.make_policy(name, **engine)
    pred = "history:min_samples=3,window=8,q_lo=0.25"  # predictions move at every completion
    calls, served = [], []
    real, serve = Simulation._arrivals_in_one_call, CompiledReplica._serve
    monkeypatch.setattr(Simulation, "_arrivals_in_one_call",
                        lambda self: calls.append(real(self)) or calls[-1])
    monkeypatch.setattr(CompiledReplica, "_serve",
                        lambda self, code: served.append(code) or serve(self, code))
    one_call = lp.simulate(inst, policy, seed=2, predictor=pred)
    assert calls == [True]
    if engine:
        assert SK.NEED_ROOM in served
    monkeypatch.setattr(Simulation, "_arrivals_in_one_call", lambda self: False)
    each = lp.simulate(inst, policy, seed=2, predictor=pred)
    assert one_call.digest() == each.digest()
    assert (one_call.arrays["status"] == "finished").sum() > 0


def test_a_predictor_without_a_compiled_twin_is_asked_per_arrival():
    one = lp.Instance(trace=_trace(40, 1), cluster=lp.Cluster(gpu="a100-80gb",
                                                             llm="llama-2-7b"))
    policy = lp.make_policy("mcsf")
    assert Simulation(one, policy, predictor=make_predictor("history"))._arrivals_in_one_call()
    assert not Simulation(one, policy, predictor=make_predictor("oracle")
                          )._arrivals_in_one_call()


@pytest.mark.parametrize("name,replicas,predictor", [
    ("vllm", 3, None), ("sarathi", 2, None), ("vtc", 3, None), ("lyapunov", 4, None),
    ("spec-fixed", 2, None),
    ("mcsf", 3, "history:min_samples=3,window=8,q_lo=0.25"),  # all replicas in one call
    ("mlfq-predicted", 2, "history:min_samples=2,window=5"),
    (lp.make_policy("mcsf", max_num_seqs=4), 3, "history:min_samples=2"),  # outbox stops
])
def test_round_robin_replicas_take_their_arrivals_in_one_call_each(monkeypatch, name,
                                                                   replicas, predictor):
    """Round robin reads no state, so each replica takes the requests ``j`` with
    ``j mod R`` its index in one kernel call: the run of one routed arrival at a time."""
    inst = lp.Instance(trace=_trace(300, 5), slo=lp.SLO(ttft_s=2.0, tpot_s=0.1),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                          replicas=replicas, gpu_memory_fraction=0.2))
    calls = []
    real = Simulation._arrivals_in_one_call
    monkeypatch.setattr(Simulation, "_arrivals_in_one_call",
                        lambda self: calls.append(real(self)) or calls[-1])
    served = []
    serve = CompiledReplica._serve
    monkeypatch.setattr(CompiledReplica, "_serve",
                        lambda self, code: served.append(code) or serve(self, code))
    one_call = lp.simulate(inst, name, seed=3, predictor=predictor)
    assert calls == [True]
    if not isinstance(name, str):
        assert SK.NEED_ROOM in served  # the cluster call stopped for Python and resumed
    monkeypatch.setattr(Simulation, "_arrivals_in_one_call", lambda self: False)
    each = lp.simulate(inst, name, seed=3, predictor=predictor)
    assert one_call.digest() == each.digest()
    assert np.array_equal(one_call.arrays["replica"], np.arange(300) % replicas)


def test_a_cluster_call_builds_only_the_replicas_requests_reach():
    """Round robin over 40 replicas with 6 requests reaches replicas 0-5; the rest stay
    vacant (never built), with or without the History predictor in the call."""
    inst = lp.Instance(trace=_trace(6, 2), cluster=lp.Cluster(gpu="a100-80gb",
                                                            llm="llama-2-7b", replicas=40))
    for name, pred in (("mcsf", "history"), ("vllm", None)):
        sim = Simulation(inst, lp.make_policy(name),
                         predictor=None if pred is None else make_predictor(pred))
        assert sim._arrivals_in_one_call()
        sim.run()
        built = [not getattr(r, "vacant", False) for r in sim.front]
        assert built == [True] * 6 + [False] * 34, name
    late = lp.Trace.from_arrays(arrival_s=np.arange(6) + 1.0, prompt_tokens=np.full(6, 50),
                                output_tokens=np.full(6, 5))
    empty = inst.with_(trace=late, horizon_s=0.5)  # no arrival before it: only the pool's
    sim = Simulation(empty, lp.make_policy("mcsf"), predictor=make_predictor("history"))
    sim.run()  # first replica (built with the pool) exists
    assert [not getattr(r, "vacant", False) for r in sim.front] == [True] + [False] * 39
