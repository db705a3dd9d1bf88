"""The transfer engine (lpserve/sim/_swap_kernels.py, _link_kernels.py,
models/simulator.md (26)-(32)): serial swaps unchanged, overlapped copies on the host link
(blocks freed at a swap-out's end, a swapped-in request runs only once resident),
proactive swapping's host-room rule, the link orders (on the plain-Python oracle of the
link's queue, tests/oracles/host_link.py), and bad configuration. What a replica does is
read after each of its steps, where the invariant checker runs (:func:`_spy_steps`)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import lpserve as lp
from lpserve.policy import EngineConfig
from lpserve.sim.engine import Simulation
from lpserve.sim.state import FINISHED, RUNNING, TRANSFER, XF_IN, XF_NONE, XF_OUT, XF_RESIDENT
from tests.oracles.host_link import HostLink
from tests.strategies import preempting_instance, python_scheduler

#: what _spy_steps records of a request: its host-link state, swapped flag, status, GPU
#: blocks held (anonymous + hashed) and GPU blocks its swapped KV takes back
XFER, SWAPPED, STATUS, HELD, GPU = range(5)

# Result.digest() of these runs before the transfer engine existed (swaps charged to the
# next iteration), on tests.strategies.preempting_instance(seed, 64 GB host); (1, fastserve)
# re-pinned when MLFQ's twin came to be asked at every planning step, as a Python scheduler
# is (models/simulator.md (16); the run of a Python MLFQ had this digest before already)
OLD_DIGESTS = {
    (1, "fastserve"): "6e763e0393e58441774392fb2127ee6fca80220132b6018079ff48e4bf4780c3",
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
        assert r.stats["engine"] == ("compiled+reference" if reference else "compiled")


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


def _after_each_step(sim: Simulation, fn) -> None:
    """Call ``fn(replica)`` after every step of every replica of ``sim`` (built with
    ``check=True``), after its invariant checker."""
    check = sim.ctx.check

    def both(r) -> None:
        check(r)
        fn(r)

    object.__setattr__(sim.ctx, "check", both)


def _spy_steps(sim: Simulation) -> list[tuple]:
    """Record, after every step of every replica of ``sim`` (where its invariant checker
    runs: ``check=True``), each request whose host-link state, swapped flag, status or
    held GPU blocks changed: ``(replica key, now_s, request, before, after)``, the last two
    indexed by ``XFER, SWAPPED, STATUS, HELD, GPU``."""
    S = sim.state

    def columns() -> np.ndarray:
        return np.stack([S.xfer.astype(np.int64), S.swapped.astype(np.int64),
                         S.status.astype(np.int64), S.anon + S.nslots, S.swap_gpu_blocks])

    last, seen = [columns()], []

    def spy(r) -> None:
        now = columns()
        for i in np.flatnonzero((now != last[0]).any(axis=0)).tolist():
            seen.append((r.key, r.now, i, tuple(last[0][:, i].tolist()),
                         tuple(now[:, i].tolist())))
        last[0] = now

    _after_each_step(sim, spy)
    return seen


def test_swap_out_frees_blocks_only_at_its_end_and_swap_in_waits_for_residency():
    inst = preempting_instance(1, 64.0)
    sim = Simulation(inst, lp.make_policy("las", transfers="overlap"), 0, check=True)
    seen = _spy_steps(sim)
    sim.run()
    outs = [(i, b, a) for _, _, i, b, a in seen if b[XFER] == XF_OUT and a[XFER] != XF_OUT]
    ins = [(i, b, a) for _, _, i, b, a in seen if b[XFER] == XF_IN and a[XFER] != XF_IN]
    assert outs and ins and sum(r.link.n_copies for r in sim.replicas()) >= len(outs)
    assert sim.state.link_wait.sum() > 0.0  # requests waited on the link
    for _, _, i, b, a in seen:
        if a[XFER] == XF_OUT:  # a swap-out in flight holds its whole context
            assert a[HELD] == a[GPU] > 0 and a[STATUS] != RUNNING
        if a[XFER] == XF_IN:  # a swap-in in flight: not running, its blocks once started
            assert a[STATUS] == TRANSFER and a[HELD] in (0, a[GPU])
    for i, b, a in outs:  # held its whole context until the copy ended, nothing after
        assert b[HELD] == b[GPU] > 0 and a[HELD] == 0 and a[SWAPPED]
    for i, b, a in ins:  # not running before its KV is resident, running right after (or
        # done: the step that applied the copy's end may run its last iteration too)
        assert b[STATUS] == TRANSFER and a[XFER] == XF_NONE
        assert (a[STATUS], a[HELD]) == (RUNNING, b[GPU]) or a[STATUS] == FINISHED


def test_overlap_is_faster_than_serial_and_fast_equals_reference():
    inst = preempting_instance(2, 64.0)
    ser = lp.simulate(inst, _serial("las"), seed=0)
    fast = lp.simulate(inst, lp.make_policy("las", transfers="overlap"), seed=0, check=True)
    ref = lp.simulate(inst, lp.make_policy("las", transfers="overlap"), seed=0,
                      reference=True)
    assert fast.stats["engine"] == "compiled" and ref.stats["engine"] == "compiled+reference"
    assert fast.digest() == ref.digest() != ser.digest()
    assert fast.summary()["e2e_s"]["mean"] < ser.summary()["e2e_s"]["mean"]


def test_proactive_swapping_keeps_the_free_block_target():
    """After every step, proactive swapping has met its free-block target (free blocks,
    plus those swap-outs in flight free, less those swap-ins queued take) or has no
    resident request left to swap out."""
    from lpserve.sim import _link_kernels as LK
    from lpserve.sim import _state_kernels as T

    inst = preempting_instance(1, 64.0)
    pol = lp.make_policy("fastserve", proactive_free_blocks=50)
    for reference in (False, True):
        sim = Simulation(inst, pol, 0, check=True, reference=reference)
        residents, outs = [], []

        def spy(r, residents=residents, outs=outs):
            li, S = r.link_arrays.li, sim.state
            free = r.bm.available + int(li[LK.L_FREEING]) - int(li[LK.L_PROMISED])
            resident = [i for i in r.waiting if S.xfer[i] == XF_RESIDENT]
            assert free >= r.cfg[T.C_PRO_TARGET] or not resident
            residents.append(len(resident))
            outs.append(int((S.xfer == XF_OUT).sum()))

        _after_each_step(sim, spy)
        sim.run()
        assert (sim.state.status == FINISHED).all()
        # requests were resident (priority preemption kept their KV, the target met)
        # and were swapped out
        assert max(residents) > 0 and max(outs) > 0


def _order(order: str, copies, t0: float = 0.0) -> list[int]:
    """Start order of ``copies`` (kind, request, duration, rank, deadline) queued behind
    a running copy that ends at 1 s."""
    link = HostLink(order)
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
    link = HostLink("fifo")
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


@pytest.mark.parametrize("in_python", [False, True], ids=["twin", "python"])
@pytest.mark.parametrize("seed", [0, 1, 8])
@pytest.mark.parametrize("name,proactive", [("fastserve", True), ("fastserve", False),
                                            ("mlfq", False)])
def test_a_swapped_in_request_is_not_credited_its_link_time_as_service(name, proactive, seed,
                                                                       in_python):
    """MLFQ credits the time between two decisions to the requests running at the second
    (``lpserve.policies.mlfq``): a request that joins the batch at its swap-in's end must
    not be credited the time it spent on the link. Without a decision before the join, it
    was, and at 0.64 GB/s skip-join MLFQ swapped such requests out again before they ran
    (41,924 swaps on the swap_tipping_point instance; models/simulator.md (28)). Read
    after each step (where the checker runs): the service the scheduler (its twin, or a
    user's copy ranked in Python) credits a request from the step before its join to the
    first step that credits it after is at most the time since its swap-in ended. Named
    example of the copy: the join of a swap-in to a replica with no candidates also asks
    first (with none); without that, on seed 0 (FastServe, proactive) request 4 joined
    the empty replica at 11.046 s and was credited 0.109 s of service, the time since the
    last decision (10.937 s), which it had spent on the link; the twin, on seed 8, credited
    request 10 0.329 s, 0.223 s after its swap-in ended."""
    from lpserve.sim import _link_kernels as LK
    from lpserve.sim import _ranks as RK

    inst = preempting_instance(seed, 64.0)
    inst = lp.Instance(trace=inst.trace, cluster=inst.cluster, cost=lp.cost_model(
        gpu="a100-80gb", llm="llama-2-7b", pcie_efficiency=0.05))
    pol = lp.make_policy(name, transfers="overlap", proactive_swap=proactive)
    pol = python_scheduler(pol) if in_python else pol
    sim = Simulation(inst, pol, 0, check=True)
    S, rk, n = sim.state, sim.runset.rk_a, len(inst.trace)

    def state() -> np.ndarray:  # (level, service in level) per request
        if not in_python:
            return np.stack([rk.ri[RK.RI_LEVEL].astype(np.float64), rk.rf[RK.RF_USED]])
        out = np.zeros((2, n))
        for i, st in pol.scheduler._state.items():
            out[:, i] = st[0], st[1]
        return out

    last = [S.status.copy(), state()]
    in_end, pending, checked, bad = {}, {}, [], []  # pending: joined, not credited since

    def spy(r):
        status, now_state = S.status.copy(), state()
        for i in np.flatnonzero((last[0] == TRANSFER) & (status != TRANSFER)).tolist():
            pending[i] = last[1][:, i]
        for i, before in list(pending.items()):
            after = now_state[:, i]
            if (after != before).any():
                del pending[i]
                checked.append(i)
                since_s = r.now - in_end[i]
                if after[0] == before[0] and after[1] - before[1] > since_s + 1e-9:
                    bad.append((i, r.now, tuple(before), tuple(after), since_s))
        a = r.link_arrays
        k = int(a.li[LK.L_ACTIVE])
        if k >= 0 and a.q_kind[k] == LK.KIND_IN:
            in_end[k] = float(a.lf[LK.LF_END])
        last[0], last[1] = status, now_state

    _after_each_step(sim, spy)
    sim.run()
    assert (S.status == FINISHED).all() and sum(r.link.n_copies for r in sim.replicas())
    assert checked, "no swapped-in request was credited service after joining"
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
def test_proactive_swapping_parks_no_request_without_host_room(seed):
    """FastServe's proactive swap-out only moves KV into free host memory (its block
    manager asserts the room; it has no recompute path): with no host memory, priority
    preemption parks no running request (parking one would free none of its blocks), so
    no request is ever resident after a step, and none is swapped. Before this rule, every
    outranked request was parked and then dropped (on seed 1, 43 parked and the same 43
    dropped)."""
    sim = Simulation(preempting_instance(seed, 0.0), lp.make_policy("fastserve"), 0,
                     check=True)
    seen = _spy_steps(sim)
    sim.run()
    assert (sim.state.status == FINISHED).all() and seen
    assert sum(r.n_swaps for r in sim.replicas()) == 0
    parked = [i for _, _, i, _, a in seen if a[XFER] == XF_RESIDENT]
    assert parked == [], parked[:5]


@pytest.mark.slow
def test_fastserve_serves_the_first_400_mooncake_requests_without_thrashing():
    """The first 400 Mooncake conversation requests at utilisation 0.75 of four H100s
    (Llama-3-8B): with host memory full, starvation promotions parked running requests
    whose KV could not move and proactive swapping dropped them to recompute, 100k-token
    contexts included; within 1,000 simulated seconds 43 requests were still unfinished
    after 296 such drops. Parking only victims with host room serves all 400 (the last by
    about 240 s). Prefetch swap-ins keep the need of the request where admission stopped
    free, as FastServe's do (before, 338 prefetches on this slice took those blocks)."""
    from lpserve.evaluate.utilization import fluid_capacity
    from lpserve.trace.loaders import load_trace

    tr = load_trace("mooncake-conv-5min")
    cl = lp.Cluster(gpu="h100-sxm", llm="llama-3-8b", replicas=4)
    scaled = tr.scale_rate(fluid_capacity(lp.Instance(trace=tr, cluster=cl)).load_for(0.75))
    inst = lp.Instance(trace=scaled.take(np.arange(400)), cluster=cl, horizon_s=1000.0)
    res = lp.simulate(inst, lp.make_policy("fastserve", max_num_batched_tokens=131072),
                      seed=0, predictor="history")
    status = res.arrays["status"]
    assert (status == "finished").all(), dict(zip(*np.unique(status, return_counts=True)))


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


def test_the_checker_catches_link_and_host_counters_out_of_date():
    """The invariant checker (models/simulator.md (32)) raises when the link's blocks
    freeing by swap-outs, or the host's free blocks, are off by one block: each is
    changed once on a replica with a copy on its link, checked, and restored."""
    from lpserve.sim import _link_kernels as LK
    from lpserve.sim import _state_kernels as T
    from lpserve.sim.invariants import InvariantError

    sim = Simulation(preempting_instance(1, 64.0), lp.make_policy("fastserve"), 0,
                     check=True)
    checker, caught = sim.ctx.check, []

    def corrupt(r):
        if caught or r.link_arrays.li[LK.L_ACTIVE] < 0:
            return
        for arr, at in ((r.link_arrays.li, LK.L_FREEING), (r.r.ist, T.I_HOST_FREE)):
            arr[at] += 1
            try:
                checker(r)
            except InvariantError as exc:
                caught.append(str(exc))
            finally:
                arr[at] -= 1

    _after_each_step(sim, corrupt)
    sim.run()
    assert len(caught) == 2, caught
    assert "link block counters" in caught[0] and "host capacity" in caught[1]
