"""The transfer engine (lpserve/sim/transfer.py, models/simulator.md (26)-(32)): serial
swaps unchanged, overlapped copies on the host link (blocks freed at a swap-out's end, a
swapped-in request runs only once resident), proactive swapping's free-block target, the
link orders, and bad configuration."""
from __future__ import annotations

import math

import numpy as np
import pytest

import lpserve as lp
from lpserve.policy import EngineConfig
from lpserve.sim import transfer as X
from lpserve.sim.state import XF_RESIDENT
from tests.strategies import preempting_instance

# Result.digest() of these runs before the transfer engine existed (swaps charged to the
# next iteration), on tests.strategies.preempting_instance(seed, 64 GB host)
OLD_DIGESTS = {
    (1, "fastserve"): "3906deb315be6a1ec1eaa3216b588571d7dba1b7c238f6bfd6f30da38e78d36d",
    (1, "las"): "a38bfb59dc81c0f7e06f697736731f1c3652690df1050f38d0d30163b1390807",
    (1, "vllm-compress-swap"):
        "989099a93078053e4b84fa103cbe2ffe2128cde807aa265c030fa1ef84fd365a",
    (2, "fastserve"): "beb7ee9cf3772209bcb1d8677ba99da9e3e0411d893fce66f707d288be37da33",
    (2, "las"): "b27686254f5ab69a17a63020029ebb67cb5f1ba1d56c9227523a0daae99eadb0",
}


def _serial(name: str) -> lp.Policy:
    """``name`` with serial transfers: the engine default, except for the ``fastserve``
    entries, which opt in to overlapped proactive swapping."""
    if name.startswith("fastserve"):
        return lp.make_policy(name, transfers="serial", proactive_swap=False)
    return lp.make_policy(name)


@pytest.mark.parametrize("seed,name", sorted(OLD_DIGESTS))
def test_serial_transfers_are_the_old_blocking_swap_bit_for_bit(seed, name):
    inst = preempting_instance(seed, 64.0)
    for reference in (False, True):
        r = lp.simulate(inst, _serial(name), seed=0, reference=reference)
        assert r.digest() == OLD_DIGESTS[(seed, name)]
        # serial swaps stay on the compiled engine
        assert r.stats["engine"] == ("python" if reference else "compiled")


def test_serial_is_the_default_and_fastserve_opts_in_to_overlap():
    assert EngineConfig().transfers == "serial" and not EngineConfig().proactive_swap
    for name in ("las", "mlfq", "srpt-oracle", "vllm-compress-swap"):
        assert lp.make_policy(name).engine.transfers == "serial"
    for name in ("fastserve", "fastserve-adaptive"):
        eng = lp.make_policy(name).engine
        assert eng.transfers == "overlap" and eng.proactive_swap
    r = lp.simulate(preempting_instance(1, 64.0), lp.make_policy("fastserve"), seed=0)
    assert r.stats["engine"] == "compiled" and r.digest() != OLD_DIGESTS[(1, "fastserve")]


def test_bad_transfer_configuration_is_named():
    with pytest.raises(ValueError, match="EngineConfig.transfers"):
        EngineConfig(transfers="async")
    with pytest.raises(ValueError, match="EngineConfig.link_order"):
        EngineConfig(link_order="edf")
    with pytest.raises(ValueError, match="proactive_swap needs transfers='overlap'"):
        EngineConfig(transfers="serial", proactive_swap=True)
    with pytest.raises(ValueError, match="proactive_free_blocks"):
        EngineConfig(transfers="overlap", proactive_swap=True, proactive_free_blocks=-1)
    with pytest.raises(ValueError, match="proactive_swap must be a bool"):
        EngineConfig(transfers="overlap", proactive_swap="yes")


def _spy_ticks(monkeypatch):
    """Record every copy that ends, with the holder's GPU blocks and place before/after."""
    seen = []
    orig = X.tick

    def tick(rep):
        S, link = rep.S, rep.link
        before = {c.request: (c, int(S.anon[c.request] + S.nslots[c.request]),
                              c.request in rep.running, c is link.active, link.end_s)
                  for c in link.copies()}
        orig(rep)
        for i, (c, held, was_running, active, end) in before.items():
            if link.by_request.get(i) is c:
                continue  # still queued or copying
            seen.append(dict(c=c, held_before=held,
                             held_after=int(S.anon[i] + S.nslots[i]),
                             was_running=was_running, was_active=active,
                             running=i in rep.running,
                             end=end if active else math.nan, now=rep.now))
    monkeypatch.setattr(X, "tick", tick)
    return seen


def test_swap_out_frees_blocks_only_at_its_end_and_swap_in_waits_for_residency(monkeypatch):
    seen = _spy_ticks(monkeypatch)
    inst = preempting_instance(1, 64.0)
    # the Python replicas (the spy watches lpserve.sim.transfer); the compiled ones give
    # the same digest (test_overlap_is_faster_than_serial_and_fast_equals_reference)
    r = lp.simulate(inst, lp.make_policy("las", transfers="overlap"), seed=0, check=True,
                    reference=True)
    assert r.summary()["n_finished"] == 12
    outs = [e for e in seen if e["c"].kind == "out"]
    ins = [e for e in seen if e["c"].kind == "in" and e["c"].then_run]
    assert outs and ins and r.stats["link_copies"] == len(seen)
    for e in outs:  # held its whole context until the copy ended, nothing after
        assert e["held_before"] == e["c"].blocks > 0 and e["held_after"] == 0
    for e in ins:  # not running before its KV is resident, running right after
        assert not e["was_running"] and e["running"]
        assert e["held_after"] == e["c"].blocks
        # it took its blocks when it started: before this tick, or within it (queued then)
        assert e["held_before"] == e["c"].blocks or (e["held_before"] == 0
                                                     and not e["was_active"])
    # copy ends are events: one is applied no later than the planning step it ends in
    assert r.stats["link_wait_s"] > 0.0


def test_overlap_is_faster_than_serial_and_fast_equals_reference():
    inst = preempting_instance(2, 64.0)
    ser = lp.simulate(inst, _serial("las"), seed=0)
    fast = lp.simulate(inst, lp.make_policy("las", transfers="overlap"), seed=0, check=True)
    ref = lp.simulate(inst, lp.make_policy("las", transfers="overlap"), seed=0,
                      reference=True)
    assert fast.stats["engine"] == "compiled" and ref.stats["engine"] == "python"
    assert fast.digest() == ref.digest() != ser.digest()
    assert fast.summary()["e2e_s"]["mean"] < ser.summary()["e2e_s"]["mean"]


def test_proactive_swapping_keeps_the_free_block_target(monkeypatch):
    orig = X.proactive
    checked = []

    def proactive(rep, blocked):
        before = sum(rep.S.xfer[i] == XF_RESIDENT for i in rep.waiting)
        orig(rep, blocked)
        free = rep.bm.available + rep.link.freeing - rep.link.promised
        resident = [i for i in rep.waiting if rep.S.xfer[i] == XF_RESIDENT]
        # after each decision either the target is met or nothing is left to swap out
        assert free >= X.proactive_target(rep) or not resident
        checked.append((before, len(resident)))

    monkeypatch.setattr(X, "proactive", proactive)
    inst = preempting_instance(1, 64.0)
    pol = lp.make_policy("fastserve", proactive_free_blocks=200)
    # the Python replicas (the spy watches them), then the compiled ones: the same run
    ref = lp.simulate(inst, pol, seed=0, check=True, reference=True)
    # requests were resident (priority preemption kept their KV) and were swapped out
    assert ref.summary()["n_finished"] == 12 and any(b > a for b, a in checked)
    assert ref.stats["link_copies"] > 0
    fast = lp.simulate(inst, pol, seed=0, check=True)
    assert fast.stats["engine"] == "compiled" and fast.digest() == ref.digest()


def _order(order: str, copies, t0: float = 0.0) -> list[int]:
    """Start order of ``copies`` (kind, request, duration, rank, deadline) queued behind
    a running copy that ends at 1 s."""
    link = X.HostLink(order)
    link.enqueue("out", 99, 1, 1.0, t0, 0.0, math.inf, False)
    started = []

    def start(c, t):
        started.append(c.request)
        return True

    link.advance(t0, start, lambda c, t: None)
    for kind, i, dur, rank, dl in copies:
        link.enqueue(kind, i, 1, dur, t0, rank, dl, kind == "in")
    link.advance(100.0, start, lambda c, t: None)
    assert link.active is None and not link.queue and link.freeing == link.promised == 0
    return started[1:]


def test_link_orders_start_copies_as_specified():
    copies = [("out", 1, 0.5, 3.0, 9.0), ("in", 2, 0.1, 1.0, 4.0),
              ("out", 3, 0.2, 2.0, 1.35), ("in", 4, 0.3, 0.0, math.inf)]
    assert _order("fifo", copies) == [1, 2, 3, 4]
    assert _order("priority", copies) == [4, 2, 3, 1]
    # least laxity first: deadline - duration = 8.5, 3.9, 1.15, inf
    assert _order("llf", copies) == [3, 2, 1, 4]
    # rmlq at t = 1 s: laxity 7.5, 2.9, 0.15, inf -> levels 7 (capped), 7, 3, 7; then the
    # queue at each later start: FIFO within a level
    assert _order("rmlq", copies) == [3, 1, 2, 4]


def test_link_runs_one_copy_at_a_time_and_skips_a_swap_in_without_blocks():
    link = X.HostLink("fifo")
    for k, kind in enumerate(("in", "out", "in")):
        link.enqueue(kind, k, 5, 1.0, 0.0, 0.0, math.inf, True)
    log = []
    room = {"ok": False}

    def start(c, t):
        if c.kind == "in" and not room["ok"]:
            return False
        log.append((c.request, t))
        return True

    def end(c, t):
        room["ok"] = True  # the swap-out's end frees the blocks the swap-ins need

    link.advance(0.0, start, end)  # the first swap-in cannot start: the swap-out can
    assert log == [(1, 0.0)] and link.promised == 10 and link.freeing == 5
    link.advance(10.0, start, end)
    assert log == [(1, 0.0), (0, 1.0), (2, 2.0)] and link.n_copies == 3
    assert link.busy_s == 3.0 and link.next_end_s == math.inf


@pytest.mark.parametrize("name,proactive", [("fastserve", True), ("fastserve", False),
                                            ("mlfq", False)])
def test_a_swapped_in_request_is_not_credited_its_link_time_as_service(monkeypatch, name,
                                                                        proactive):
    """MLFQ credits the time between two decisions to the requests running at the second
    (``lpserve.policies.mlfq``): a request that joins the batch at its swap-in's end must
    not be credited the time it spent on the link. Without a decision before the join, it
    was, and at 0.64 GB/s skip-join MLFQ swapped such requests out again before they ran
    (41,924 swaps on the swap_tipping_point instance; models/simulator.md (28)). A
    scheduler that repeats its ranks within a quantum tick may still credit the time since
    its last fresh decision, under one ``quantum_s``."""
    inst = preempting_instance(1, 64.0)
    inst = lp.Instance(trace=inst.trace, cluster=inst.cluster, cost=lp.cost_model(
        gpu="a100-80gb", llm="llama-2-7b", pcie_efficiency=0.05))
    pol = lp.make_policy(name, transfers="overlap", proactive_swap=proactive)
    sched = pol.scheduler
    joined: dict[int, tuple] = {}  # joined the batch, not ranked since: MLFQ state then
    bad: list = []
    orig_tick, orig_rank = X.tick, type(sched).rank

    def tick(rep):
        loading = list(rep.loading)
        orig_tick(rep)
        for i in loading:
            if i in rep.running:
                joined[i] = (rep.now, tuple(sched._state[i][:2]))

    def rank(self, view):
        out = orig_rank(self, view)
        for i, r in zip(view.request.tolist(), view.running.tolist()):
            if r and i in joined:  # first decision after the join: no service credited
                t, before = joined.pop(i)
                after = tuple(self._state[i][:2])
                # at most the time since the scheduler's last fresh decision, which is in
                # the same quantum tick when it repeats its ranks before the join
                if view.now_s == t and (after[0] != before[0] or
                                        after[1] - before[1] > self.quantum_s):
                    bad.append((i, t, before, after))
        return out

    monkeypatch.setattr(X, "tick", tick)
    monkeypatch.setattr(type(sched), "rank", rank)
    r = lp.simulate(inst, pol, seed=0, check=True)
    assert r.summary()["n_finished"] == 12 and r.stats["link_copies"] > 0
    assert bad == [], f"credited link time as service (request, t, before, after): {bad[:3]}"


@pytest.mark.slow
def test_fastserve_serves_every_request_of_a_mooncake_burst():
    """Proactive swapping never idles a replica with requests waiting: the first 80
    Mooncake conversation requests on one H100 (prompts up to 122k tokens, shared prefix
    blocks, host memory full) left 77 of them waiting for good while the blocked head's
    need, as proactive swapping read it, left out its free cached hits, which admission
    takes too (so it freed too little and the replica idled)."""
    from lpserve.evaluate.utilization import fluid_capacity
    from lpserve.trace.loaders import load_trace

    tr = load_trace("mooncake-conv-5min")
    four = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="h100-sxm", llm="llama-3-8b",
                                                    replicas=4))
    burst = tr.scale_rate(fluid_capacity(four).load_for(0.75)).take(np.arange(80))
    inst = lp.Instance(trace=burst, cluster=lp.Cluster(gpu="h100-sxm", llm="llama-3-8b"))
    res = lp.simulate(inst, lp.make_policy("fastserve", max_num_batched_tokens=131072),
                      seed=0, predictor="history")
    status = res.arrays["status"]
    assert (status == "finished").all(), dict(zip(*np.unique(status, return_counts=True)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_proactive_swapping_parks_and_drops_no_request_without_host_room(monkeypatch, seed):
    """FastServe's proactive swap-out only moves KV into free host blocks (its block
    manager asserts the room; it has no recompute path): with no host memory, priority
    preemption parks no running request (parking one would free none of its blocks) and
    no resident request is dropped to recompute. Before this rule, every outranked
    request was parked and then dropped (on seed 1, 43 parked and the same 43 dropped)."""
    parked, dropped = [], []
    park, drop = X.park, X._drop_kv

    def spy_park(rep, v):
        parked.append(v)
        park(rep, v)

    def spy_drop(rep, v):
        if v in rep.waiting:  # a resident request (a running victim is still running)
            dropped.append(v)
        drop(rep, v)

    monkeypatch.setattr(X, "park", spy_park)
    monkeypatch.setattr(X, "_drop_kv", spy_drop)
    r = lp.simulate(preempting_instance(seed, 0.0), lp.make_policy("fastserve"), seed=0,
                    check=True)
    assert r.summary()["n_finished"] == 12 and r.stats["swaps"] == 0
    assert parked == [] and dropped == [], (parked[:5], dropped[:5])


@pytest.mark.slow
def test_fastserve_serves_the_first_400_mooncake_requests_without_thrashing(monkeypatch):
    """The first 400 Mooncake conversation requests at utilisation 0.75 of four H100s
    (Llama-3-8B): with host memory full, starvation promotions parked running requests
    whose KV could not move and proactive swapping dropped them to recompute, 100k-token
    contexts included; within 1,000 simulated seconds 43 requests were still unfinished
    after 296 such drops. Parking only victims with host room serves all 400 (the last by
    about 240 s). Prefetch swap-ins keep the need of the request where admission stopped
    free, as FastServe's do (before, 338 prefetches on this slice took those blocks)."""
    from lpserve.evaluate.utilization import fluid_capacity
    from lpserve.trace.loaders import load_trace

    short = []
    orig = X.proactive

    def proactive(rep, blocked):
        before = set(map(id, rep.link.copies()))
        out = orig(rep, blocked)
        if blocked is not None and any(c.kind == "in" and not c.then_run and
                                       id(c) not in before for c in rep.link.copies()):
            free = rep.bm.available + rep.link.freeing - rep.link.promised
            if free < rep.wm_blocks + blocked[1]:
                short.append((rep.now, blocked, free))
        return out

    monkeypatch.setattr(X, "proactive", proactive)
    tr = load_trace("mooncake-conv-5min")
    cl = lp.Cluster(gpu="h100-sxm", llm="llama-3-8b", replicas=4)
    scaled = tr.scale_rate(fluid_capacity(lp.Instance(trace=tr, cluster=cl)).load_for(0.75))
    inst = lp.Instance(trace=scaled.take(np.arange(400)), cluster=cl, horizon_s=1000.0)
    res = lp.simulate(inst, lp.make_policy("fastserve", max_num_batched_tokens=131072),
                      seed=0, predictor="history")
    status = res.arrays["status"]
    assert (status == "finished").all(), dict(zip(*np.unique(status, return_counts=True)))
    assert short == [], f"prefetches below the blocked request's need: {short[:3]}"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_resident_without_host_room_is_dropped_only_when_nothing_else_frees_blocks(
        monkeypatch, seed):
    """Proactive swapping skips a resident whose KV has no host room; it drops one to
    recompute only when no request runs and no copy runs on the link (else the replica
    would idle for good). Residents without host room are forced here by parking every
    outranked request regardless of host room, on a replica with no host memory. (Memory
    pressure, rule (10), still drops the worst resident before preempting a running
    request: those drops are not counted.)"""
    class EveryVictim(X.HostRoom):
        def __call__(self, v):
            return True

    monkeypatch.setattr(X, "HostRoom", EveryVictim)
    drops, pressure = [], []
    drop, relieve = X._drop_kv, X.relieve

    def spy_relieve(rep):
        pressure.append(True)
        try:
            return relieve(rep)
        finally:
            pressure.pop()

    def spy_drop(rep, v):
        if v in rep.waiting and not pressure:  # a resident dropped by proactive swapping
            drops.append(bool(rep.running) or rep.link.active is not None)
        drop(rep, v)

    monkeypatch.setattr(X, "relieve", spy_relieve)
    monkeypatch.setattr(X, "_drop_kv", spy_drop)
    r = lp.simulate(preempting_instance(seed, 0.0), lp.make_policy("fastserve"), seed=0,
                    check=True, reference=True)  # the Python replicas: the spies watch them
    assert r.summary()["n_finished"] == 12
    assert drops and not any(drops), drops


def test_a_resident_on_a_decode_replica_is_not_counted_on_the_prefill_replica_of_its_index():
    """Named counterexample of the registry fuzz: FastServe on a disaggregated cluster
    (one prefill, one decode replica, both index 0) parks request 4 as a resident on the
    decode replica; the compiled invariant checker of the prefill replica counted its
    blocks as its own (the request's prefill replica is index 0 too) and raised."""
    from lpserve.cost import UnitRoundCost

    prompt = np.array([1, 1, 1, 129, 41, 127, 128, 127, 1, 1, 1, 1, 1, 1])
    output = np.array([1, 1, 3, 2, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1])
    tr = lp.Trace.from_arrays(arrival_s=np.r_[np.zeros(13), 3.0], prompt_tokens=prompt,
                              output_tokens=output, name="resident-on-decode")
    cl = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=1, prefill_replicas=1,
                    decode_replicas=1, block_tokens=1, host_memory_gb=1e-6)
    inst = lp.Instance(trace=tr, cluster=cl, cost=UnitRoundCost(memory_tokens=301),
                       slo=lp.SLO(ttft_s=4.0, tpot_s=2.0))
    fast = lp.simulate(inst, "fastserve", seed=1, check=True)
    ref = lp.simulate(inst, "fastserve", seed=1, reference=True, check=True)
    assert fast.digest() == ref.digest()
    assert fast.stats["engine"] == "compiled"
    assert int(fast.arrays["preemptions"].sum()) > 0
