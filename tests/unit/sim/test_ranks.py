"""The compiled rank kernels (lpserve/sim/_ranks.py, _vtc_kernels.py) against the
built-in schedulers' Python ranks, on random sequences of decisions over two replicas:
identical ranks at every decision, state and time-slicing included (VTC with the engine's
meter crediting each produced token)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lpserve as lp
from lpserve.arrays import readonly
from lpserve.policies import fairness, mlfq, programs, schedulers, wait
from lpserve.policies.lyapunov import DPPScheduler
from lpserve.policy import FCFS, SchedulerView
from lpserve.sim import _ranks as K
from lpserve.sim import _vtc_kernels as V

CLUSTER = lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2)

SCHEDULERS = {
    "fcfs": FCFS, "sjf": lambda: schedulers.SJFOracle(remaining=False),
    "srpt": lambda: schedulers.SJFOracle(remaining=True),
    "wspt": lambda: schedulers.WSPT({0: 2.0, 2: 0.5}),
    "sjfp-mid": lambda: schedulers.SJFPredicted("mid"),
    "sjfp-lo": lambda: schedulers.SJFPredicted("lo"),
    "las": lambda: schedulers.LAS(quantum_s=0.05, service_quantum_tokens=4),
    "rr": lambda: schedulers.RoundRobin(quantum_s=0.3),
    "mcsf-hi": lambda: schedulers.MemoryCheckedSF("hi", max_batch=6),
    "mcsf-lo": lambda: schedulers.MemoryCheckedSF("lo", max_batch=6),
    "mcsf-oracle": lambda: schedulers.MemoryCheckedSF("oracle", max_batch=6),
    "slo": lambda: schedulers.SLOAware(quantum_s=0.2, ttft_s=1.0, tpot_s=0.05),
    "mlfq": lambda: mlfq.MLFQ(entry="first", starvation_s=0.5, starvation_period_s=0.4),
    "fastserve": lambda: mlfq.MLFQ(entry="prefill", demote_on=">="),
    "mlfq-pred-adaptive": lambda: mlfq.MLFQ(entry="predicted", adaptive_starvation=True,
                                            starvation_s=0.3, starvation_period_s=0.2),
    "plas": lambda: programs.ProgramScheduler("plas", base_quantum_s=0.1),
    "atlas": lambda: programs.ProgramScheduler("atlas", base_quantum_s=0.1, beta=2.0),
    "plas-mlfq": lambda: programs.ProgramScheduler("plas", base_quantum_s=0.1,
                                                   two_level=True),
    "dpp": lambda: DPPScheduler((1.0, 3.0, 0.5)),
    "vtc": fairness.VTC, "vtc-weighted": lambda: fairness.VTC({0: 3.0, -1: 0.5}, 1.5, 4.0),
    "wait": wait.WAIT,
    "wait-flush": lambda: wait.WAIT(default_threshold=2, flush_after_s=0.3),
    "tiered-vtc": lambda: fairness.TieredShedding(
        tiers={0: 1, -1: 2}, max_waiting={1: 2, 0: 4}, shed_after_s={2: 0.8, 0: 1.5},
        quantum_s=0.1, weights={2: 2.0}),
}


def _state(n, R, n_prog):
    rf = np.zeros((K.N_RF, n))
    rf[K.RF_SERVED] = np.nan
    return (rf, np.zeros((K.N_RI, n), np.int64), np.zeros((4, n_prog)),
            np.full((R, 2), np.nan), np.zeros((R, K.N_XI_HEAD + 2 * n), np.int64),
            np.zeros((R, n)), np.zeros(4, np.int64))


def _compare(name, seed, steps=60, with_pred=True):
    rng = np.random.default_rng(seed)
    n, R = 24, 2
    sched = SCHEDULERS[name]()
    sched.reset(CLUSTER, np.random.default_rng(0))
    kind_s, fp, ip = sched.kernel_spec()
    kind = K.RANK_KINDS[kind_s]
    fp, ip = np.asarray(fp, np.float64), np.asarray(ip, np.int64)
    arrival = np.sort(rng.uniform(0, 2, n))
    prompt = rng.integers(1, 400, n)
    out = rng.integers(1, 300, n)
    tenant = rng.integers(-1, 3, n)
    metered = isinstance(sched, fairness.VTC)  # the engine credits its tokens as produced
    if metered:
        fp, ip = V.vtc_params(sched, tenant)
    lo = np.maximum(out - rng.integers(0, 50, n), 1)
    hi = out + rng.integers(0, 50, n)
    pid = rng.integers(-1, 5, n)
    prog_index = np.where(pid >= 0, pid, 5 + np.arange(n))
    gen = np.zeros(n, np.int64)
    computed = np.zeros(n, np.int64)
    rf, ri, pf, xf, xi, xr, g = _state(n, R, 5 + n)
    now = np.zeros(R)
    home = rng.integers(0, R, n)  # each request sits on one replica
    prev: dict = {}  # the last candidates asked on each replica
    for step in range(steps):
        r = int(rng.integers(0, R))
        now[r] += float(rng.choice([0.0, 0.01, 0.05, 0.13, 0.4]))
        pool = np.flatnonzero((home == r) & (arrival <= now[r] + 1.5) & (gen < out))
        if pool.size == 0 or rng.random() < 0.08:
            cand = np.zeros(0, np.int64)  # asked with none: a swap-in joins an empty replica
        elif rng.random() < 0.3 and step > 0:
            cand = prev.get(r, pool)  # same candidates again: a cached decision
        else:
            cand = rng.permutation(pool)[:int(rng.integers(1, pool.size + 1))]
        prev[r] = cand
        m = cand.size
        run = np.zeros(m, bool)
        n_run = int(rng.integers(0, m + 1))
        run[m - n_run:] = True
        cand = np.concatenate([np.sort(cand[:m - n_run]), cand[m - n_run:]])
        grow = rng.integers(0, 3, m) * run
        if metered:  # tokens only for requests a decision has seen, each one metered
            grow *= np.array([int(i) in sched._req for i in cand.tolist()], np.int64)
            grow = np.minimum(gen[cand] + grow, out[cand] - 1) - gen[cand]
            for unit in (1, 2):
                if (grow >= unit).any():
                    sched._produced(r, cand[grow >= unit], 1)
        gen[cand] = np.minimum(gen[cand] + grow, out[cand] - 1)
        computed[cand] = np.minimum(prompt[cand] + gen[cand], computed[cand] + 50)
        view = SchedulerView(
            now_s=float(now[r]), replica=r, request=readonly(cand),
            arrival_s=readonly(arrival[cand]), prompt_tokens=readonly(prompt[cand]),
            generated_tokens=readonly(gen[cand]), computed_tokens=readonly(computed[cand]),
            cached_tokens=readonly(np.zeros(m, np.int64)), running=readonly(run),
            swapped=readonly(np.zeros(m, bool)), preemptions=readonly(np.zeros(m, np.int64)),
            first_scheduled_s=readonly(np.full(m, np.nan)), tenant=readonly(tenant[cand]),
            session_id=readonly(np.full(m, -1, np.int64)),
            predicted_lo=readonly(lo[cand]) if with_pred else None,
            predicted_hi=readonly(hi[cand]) if with_pred else None,
            output_tokens=readonly(out[cand]), free_blocks=100, total_blocks=60,
            block_tokens=16, program_id=readonly(pid[cand]), parent=None)
        want = np.asarray(sched.rank(view), np.float64)
        got = np.empty(m)
        K.ranks(kind, fp, ip, cand.astype(np.int64), run.astype(np.int64), m, float(now[r]),
                r, arrival, prompt, gen, computed, out, tenant, lo, hi, with_pred,
                prog_index, 60, 16, rf, ri, pf, xf, xi, xr, g, got)
        assert np.array_equal(want, got), (name, step, want, got)
    if isinstance(sched, mlfq.MLFQ):
        assert sched.demotions == g[K.G_DEMOTIONS]
    if isinstance(sched, fairness.TieredShedding):
        assert set(np.flatnonzero(rf[K.RF_C1] != 0).tolist()) == sched.shed


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_rank_kernel_equals_python(name):
    for seed in range(4):
        _compare(name, seed, with_pred=seed != 3)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 100_000), name=st.sampled_from(sorted(SCHEDULERS)),
       with_pred=st.booleans())
def test_rank_kernel_equals_python_random(seed, name, with_pred):
    _compare(name, seed, steps=40, with_pred=with_pred)


@pytest.mark.parametrize("flush_after_s", [None, 0.4])
def test_wait_twin_equals_python_on_repeated_types(flush_after_s):
    """WAIT's compiled twin (thresholds per (prompt, output) type, cohorts, flushes) gives
    the reference engine's run, whose scheduler is the Python class, on a trace of four
    repeated types with their own thresholds and an unlisted one."""
    rng = np.random.default_rng(3)
    n = 60
    types = np.array([(120, 40), (300, 12), (64, 90), (500, 25)])
    pick = rng.integers(0, len(types), n)
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 3.0, n)),
                              prompt_tokens=types[pick, 0], output_tokens=types[pick, 1])
    sched = wait.WAIT({(120, 40): 3, (300, 12): 2, (64, 90): 0}, default_threshold=4,
                      flush_after_s=flush_after_s)
    pol = lp.make_policy("vllm").with_(scheduler=sched, name="wait-types")
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    gpu_memory_fraction=0.3), horizon_s=60.0)
    fast = lp.simulate(inst, pol, seed=0)
    ref = lp.simulate(inst, pol, seed=0, reference=True)
    assert fast.stats["engine"] == "compiled"
    assert fast.digest() == ref.digest()

    class OwnWait(wait.WAIT):  # no kernel_spec of its own: ranked in Python
        pass

    own = OwnWait({(120, 40): 3, (300, 12): 2, (64, 90): 0}, default_threshold=4,
                  flush_after_s=flush_after_s)
    asked = lp.simulate(inst, pol.with_(scheduler=own), seed=0)
    assert asked.stats["engine"] == "compiled+python-ranks"
    assert asked.digest() == ref.digest()
    done = fast.arrays["status"] == "finished"
    held = np.isin(np.arange(n), np.flatnonzero(pick == 2))  # threshold 0: never admitted
    assert not done[held].any() and done[~held].sum() > 0




def _registered_twins() -> list[str]:
    from lpserve.registry import policy_names
    from lpserve.sim.twins import twin_spec

    out = []
    for name in policy_names():
        pol = lp.make_policy(name)
        spec = twin_spec(pol.scheduler)
        if spec is not None and pol.engine.speculation is None and name != "lyapunov-disagg":
            out.append(name)
    return out


@pytest.mark.parametrize("name", _registered_twins())
def test_each_registered_twin_runs_as_its_python_rank(name):
    """Every registered policy's scheduler twin gives the run of the scheduler's own Python
    rank asked in pauses (a user's subclass of it without ``kernel_spec``), on a tight KV
    pool where requests queue, in the fast mode. The twins whose state moves when they
    are asked (``_ranks.ASK_TIMED``: MLFQ, the program-level schedulers, VTC) are asked
    at every planning step, as a Python scheduler is; before they were asked only where a
    decision read a rank, and 9 of these 47 policies differed here (the ask-timed ones
    but mlfq-predicted)."""
    from tests.strategies import python_scheduler

    rng = np.random.default_rng(11)
    n = 60
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 3, n)),
                              prompt_tokens=rng.integers(20, 700, n),
                              output_tokens=rng.integers(1, 150, n),
                              tenant=rng.integers(0, 3, n))
    pol = lp.make_policy(name)
    kw = {"predictor": "history"} if pol.reads_predictions else {}
    for frac in (0.175, 0.4):  # engines that reserve a request's whole length need more
        inst = lp.Instance(trace=tr, cluster=lp.Cluster(
            gpu="a100-80gb", llm="llama-2-7b", gpu_memory_fraction=frac),
            slo=lp.SLO(ttft_s=2.0, tpot_s=0.2))
        twin = lp.simulate(inst, pol, seed=0, check=True, **kw)
        if np.mean(twin.arrays["status"] == "finished") > 0.5:
            break
    py = lp.simulate(inst, python_scheduler(lp.make_policy(name)), seed=0, **kw)
    assert np.mean(twin.arrays["status"] == "finished") > 0.5
    assert "python-ranks" in py.stats["engine"] and "python-ranks" not in twin.stats["engine"]
    a = twin.arrays  # requests queue, or are preempted by rank, so the order matters
    assert float(np.nanmean(a["first_scheduled_s"] - a["arrival_s"])) > 0.1 or \
        int(a["preemptions"].sum()) >= n
    assert py.digest() == twin.digest()


@pytest.mark.parametrize("name", ["mlfq", "fastserve", "plas"])
def test_an_ask_timed_twin_with_speculation_runs_as_its_python_rank(name):
    """A run of speculative steps stops at the quantum ticks of a scheduler whose state
    moves when it is asked, so the step there asks it as it asks a Python scheduler: with
    draft-model speculation, the twin's run equals the Python subclass's and its own
    reference mode's (the runs went past the ticks before, and both differed)."""
    import dataclasses

    from tests.strategies import python_scheduler

    rng = np.random.default_rng(11)
    n = 60
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 3, n)),
                              prompt_tokens=rng.integers(20, 700, n),
                              output_tokens=rng.integers(1, 150, n))
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    gpu_memory_fraction=0.175))
    base = lp.make_policy(name)
    spec = lp.make_policy("spec-fixed").engine.speculation
    pol = base.with_(engine=dataclasses.replace(base.engine, speculation=spec))
    twin = lp.simulate(inst, pol, seed=0, check=True)
    assert int(twin.arrays["preemptions"].sum()) >= n  # preempted by rank: order matters
    assert twin.digest() == lp.simulate(inst, python_scheduler(pol), seed=0).digest()
    assert twin.digest() == lp.simulate(inst, pol, seed=0, reference=True).digest()
