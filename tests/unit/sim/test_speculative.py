"""Speculative decoding in the simulator (lpserve/sim/speculative.py,
models/speculative-decoding.md): tokens per step, draft memory, k = 0, errors, latency."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import lpserve as lp
from lpserve.cost import UnitRoundCost, cost_model
from lpserve.policies.speculation import (
    FixedSpeculation,
    NeverSpeculate,
    OracleSpeculation,
    UCBSpeculation,
)
from lpserve.policy import EngineConfig
from lpserve.sim.engine import Simulation
from tests.strategies import python_copy

FIELDS = ("first_scheduled_s", "first_token_s", "finish_s", "preemptions",
          "cached_prompt_tokens", "replica", "status", "reason", "generated_tokens")


def _trace(n=40, rate_per_s=2.0, seed=0, max_output=200, tenants=None):
    rng = np.random.default_rng(seed)
    kw = {} if tenants is None else {"tenant": rng.choice(tenants, n)}
    return lp.Trace.from_arrays(arrival_s=np.cumsum(rng.exponential(1 / rate_per_s, n)),
                                prompt_tokens=rng.integers(20, 600, n),
                                output_tokens=rng.integers(1, max_output, n), **kw)


def _inst(trace, llm="llama-2-7b", frac=0.9, replicas=1, **cl):
    return lp.Instance(trace=trace, cluster=lp.Cluster(gpu="a100-80gb", llm=llm,
                                                       replicas=replicas,
                                                       gpu_memory_fraction=frac, **cl))


def _run_recording(inst, policy, seed=0, reference=True):
    """Simulate and record, for every speculative step, (k played, tokens per sequence,
    remaining output before the step), read in the pauses where the compiled replicas ask
    the decider (a user's copy of it, written in Python: :func:`_user_copy`); its digest
    is the built-in twin's (test_a_speculation_decider_written_in_python_is_asked_in_pauses)."""
    from lpserve.sim import hooks as H

    sim = Simulation(inst, _user_copy(policy), seed, reference=reference, check=True)
    steps, before = [], {}
    choose, observe = H.spec_choose, H.spec_observe

    def spec_choose(key, request, context, lag):
        S = sim.state
        before[key] = (request.copy(), S.gen[request].copy(), S.out[request] - S.gen[request])
        return choose(key, request, context, lag)

    def spec_observe(key, arm, k, accepted, emitted, dt_s):
        idx, gen0, left0 = before.pop(key)  # the step's tokens are counted by now
        steps.append((int(k), sim.state.gen[idx] - gen0, left0))
        return observe(key, arm, k, accepted, emitted, dt_s)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(H, "spec_choose", spec_choose)
        mp.setattr(H, "spec_observe", spec_observe)
        sim.run()
    return sim, steps


def test_tokens_per_step_between_one_and_k_plus_one_and_never_past_output():
    inst = _inst(_trace(n=30, rate_per_s=4.0, max_output=40))
    pol = lp.make_policy("spec-fixed", k=4, acceptance=0.9)
    sim, steps = _run_recording(inst, pol)
    assert len(steps) > 50
    full = short = 0
    for k, emitted, left in steps:
        assert k == 4
        assert np.all(emitted >= 1) and np.all(emitted <= k + 1)
        assert np.all(emitted <= left)  # never past the request's output
        full += int(np.sum(emitted == k + 1))
        short += int(np.sum((emitted < k + 1) & (emitted == left)))
    assert full > 0 and short > 0  # both bounds are reached
    S = sim.state
    assert np.array_equal(S.gen, S.out)


def test_draft_memory_reduces_kv_capacity_as_documented():
    """models/speculative-decoding.md (1)-(3) by hand, against the simulator's pool."""
    tr = _trace(n=5)
    inst = _inst(tr, llm="llama-2-13b", frac=0.85, block_tokens=16, host_memory_gb=10.0)
    plain = lp.simulate(inst, "vllm")
    spec = lp.simulate(inst, lp.make_policy("spec-never", draft="tinyllama-1.1b"))
    t = cost_model(gpu="a100-80gb", llm="llama-2-13b")
    d = cost_model(gpu="a100-80gb", llm="tinyllama-1.1b")
    free = 0.85 * t.gpu.memory_bytes - t.weight_bytes_per_gpu - d.weight_bytes_per_gpu
    kv = t.kv_bytes_per_token_per_gpu + d.kv_bytes_per_token_per_gpu
    assert spec.stats["total_blocks"] == int(free // kv) // 16
    assert plain.stats["total_blocks"] == t.kv_capacity_blocks(16, 0.85)
    assert spec.stats["total_blocks"] < plain.stats["total_blocks"]
    assert spec.stats["host_blocks"] == int(10.0e9 // (kv * 16))
    # two drafts: both loaded, both KV shares counted
    two = lp.simulate(inst, lp.make_policy("spec-ucb", draft=["tinyllama-1.1b", "llama-68m"],
                                           acceptance=[0.7, 0.5]))
    e = cost_model(gpu="a100-80gb", llm="llama-68m")
    free2 = free - e.weight_bytes_per_gpu
    kv2 = kv + e.kv_bytes_per_token_per_gpu
    assert two.stats["total_blocks"] == int(free2 // kv2) // 16


def test_k_zero_equals_no_speculation_when_memory_is_not_binding():
    inst = _inst(_trace(n=40, rate_per_s=3.0), replicas=2)
    plain = lp.simulate(inst, "vllm", seed=1)
    for dec in (NeverSpeculate("tinyllama-1.1b"), FixedSpeculation(0, "tinyllama-1.1b")):
        spec = lp.simulate(inst, lp.make_policy("vllm", speculation=dec), seed=1, check=True)
        for f in FIELDS:
            a, b = plain.arrays[f], spec.arrays[f]
            assert (list(a) == list(b)) if a.dtype == object else \
                np.array_equal(a, b, equal_nan=True), f
        assert spec.stats["total_blocks"] < plain.stats["total_blocks"]  # the documented part
        assert spec.stats["speculation"]["draft_tokens"] == 0


def test_same_seed_same_digest_other_seed_other_draws():
    inst = _inst(_trace(n=30, rate_per_s=3.0), replicas=2)
    pol = lp.make_policy("spec-ucb", acceptance=0.7)
    a = lp.simulate(inst, pol, seed=3)
    assert lp.simulate(inst, lp.make_policy("spec-ucb", acceptance=0.7), seed=3).digest() == \
        a.digest()
    assert lp.simulate(inst, pol, seed=4).arrays["finish_s"].tolist() != \
        a.arrays["finish_s"].tolist()


def test_preemption_and_swap_with_speculation_match_reference():
    tr = _trace(n=24, rate_per_s=50.0, max_output=600, seed=2)
    inst = _inst(tr, frac=0.1675)
    for preemption in ("recompute", "swap"):
        pol = lp.make_policy("spec-fixed", k=4, acceptance=0.9, preemption=preemption)
        fast = lp.simulate(inst, pol, seed=0, check=True)
        ref = lp.simulate(inst, pol, seed=0, check=True, reference=True)
        assert fast.digest() == ref.digest()
        assert fast.arrays["preemptions"].sum() > 0
        assert fast.summary()["n_finished"] == len(tr)


def test_zero_acceptance_accepts_nothing_and_per_tenant_rates_apply():
    tr = _trace(n=30, rate_per_s=3.0, tenants=[0, 1])
    res = lp.simulate(_inst(tr), lp.make_policy("spec-fixed", k=3, acceptance={0: 0.0, 1: 0.0}))
    c = res.stats["speculation"]
    assert c["draft_tokens"] > 0 and c["accepted_tokens"] == 0
    assert c["emitted_tokens"] == c["sequence_steps"]
    hi = lp.simulate(_inst(tr), lp.make_policy("spec-fixed", k=3, acceptance={0: 0.9, 1: 0.9}))
    assert hi.stats["speculation"]["accepted_fraction"] > 0.6


class _LoggingUCB(UCBSpeculation):
    """UCB that logs every (context, arm, reward) it is told."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log = []

    def observe(self, ctx, result):
        self.log.append((ctx.key, result.arm, result.reward))
        super().observe(ctx, result)


def test_ucb_rewards_are_normalized_and_rank_arms_by_tokens_per_s():
    """models/speculative-decoding.md (10): rewards in [0, 1]; with nothing accepted and a
    costly draft, plain decoding (arm 0) has the highest mean reward in every context and
    is the arm UCB plays most."""
    tr = _trace(n=60, rate_per_s=2.0, max_output=400)
    dec = _LoggingUCB("tinyllama-1.1b", acceptance=0.0, max_k=4)
    res = lp.simulate(_inst(tr), lp.make_policy("vllm", speculation=dec))
    log = dec.log  # the policy's decider object is the one the simulator used
    assert len(log) == res.stats["speculation"]["steps"]
    r = np.array([x[2] for x in log])
    assert np.all((r >= 0) & (r <= 1))
    for key in {x[0] for x in log}:
        arms = np.array([x[1] for x in log if x[0] == key])
        rew = np.array([x[2] for x in log if x[0] == key])
        if arms.size < 50:
            continue
        means = [rew[arms == j].mean() for j in range(len(dec.arms))]
        assert int(np.argmax(means)) == 0, (key, means)
        assert int(np.argmax(np.bincount(arms, minlength=len(dec.arms)))) == 0, key


def test_speculation_lowers_mean_tpot_at_light_load_and_high_acceptance():
    tr = _trace(n=40, rate_per_s=0.5, max_output=300, seed=5)
    inst = _inst(tr, llm="llama-2-13b")
    never = lp.simulate(inst, lp.make_policy("spec-never", draft="tinyllama-1.1b"))
    tpot_never = never.summary()["tpot_s"]["mean"]
    for name, kw in (("spec-fixed", dict(k=4)), ("spec-ucb", {}), ("spec-oracle", {})):
        res = lp.simulate(inst, lp.make_policy(name, draft="tinyllama-1.1b", acceptance=0.9,
                                               **kw), check=True)
        assert res.summary()["tpot_s"]["mean"] < 0.75 * tpot_never, name


def test_meta_and_registry():
    assert lp.make_policy("spec-oracle").meta.clairvoyant
    for name in ("spec-never", "spec-fixed", "spec-ucb"):
        p = lp.make_policy(name)
        assert not p.meta.clairvoyant and p.meta.engines == ("lpserve",)
    assert not lp.make_policy("spec-ucb").meta.claims  # the bound assumes stationarity
    assert lp.make_policy("sarathi", speculation=UCBSpeculation()).engine.batching == \
        "decode-first"


def _user_copy(pol):
    """``pol`` with its decider replaced by its :func:`~tests.strategies.python_copy`
    (written in Python: no compiled twin of its own, asked in pauses)."""
    return dataclasses.replace(pol, engine=dataclasses.replace(
        pol.engine, speculation=python_copy(pol.engine.speculation)))


@pytest.mark.parametrize("name", ["spec-ucb", "spec-acceptance-ucb", "spec-oracle",
                                  "spec-fixed", "spec-never"])
def test_a_speculation_decider_written_in_python_is_asked_in_pauses(name):
    """A user's subclass of a built-in decider, without a compiled twin, runs on the
    compiled replicas, asked at each speculative step in a pause (and told of each step
    it learns from): the digest and the speculation counters of the built-in twin, and
    the same in the reference mode (one iteration per step)."""
    inst = _inst(_trace(n=60, rate_per_s=4.0, tenants=[0, 1]), frac=0.3)
    pol = lp.make_policy(name, acceptance={0: 0.8, 1: 0.4})
    twin = lp.simulate(inst, pol, seed=3)
    user_pol = _user_copy(pol)
    fast = lp.simulate(inst, user_pol, seed=3, check=True)
    ref = lp.simulate(inst, _user_copy(pol), seed=3, reference=True)
    assert twin.stats["engine"] == "compiled"
    assert fast.stats["engine"] == "compiled+python-speculation"
    assert ref.stats["engine"] == "compiled+python-speculation+reference"
    assert fast.digest() == twin.digest() == ref.digest()
    counts = [{k: "nan" if v != v else v for k, v in r.stats["speculation"].items()}
              for r in (fast, twin, ref)]  # NaN (no draft token) reads as equal
    assert counts[0] == counts[1] == counts[2]
    assert counts[0]["steps"] > 50


def test_a_decider_with_arms_of_its_own_runs_on_the_compiled_replicas():
    """A decider written in Python whose arms are not the base class's grid (its own order,
    its own ``arm_index``) runs on the compiled replicas, asked in pauses: the steps it
    plays, the fallbacks to fewer drafts when KV memory is short (its ``arm_index`` tells
    which arm that is) and their prices give the same digest and counters in the reference
    mode (one iteration per step)."""
    from lpserve.cost.speculation import Arm
    from lpserve.policies.speculation import FixedSpeculation

    class Reordered(FixedSpeculation):
        """Plays k = 3, 1, 2, 0 in turn, its arms listed in that order."""

        def __init__(self) -> None:
            super().__init__(3, max_k=3, acceptance=0.7)
            self.arms = (Arm(0), Arm(3, 0), Arm(1, 0), Arm(2, 0))
            self.turn = 0
            self.last = None  # the arm chosen last, and the steps that fell back from it
            self.fallbacks = 0

        learns = True  # told of each step: a step that drew fewer drafts than its arm's

        def arm_index(self, k: int, draft: int) -> int:
            return next(j for j, a in enumerate(self.arms) if a.k == k and
                        (k == 0 or a.draft == draft))

        def observe(self, ctx, result) -> None:
            self.fallbacks += result.k < self.arms[self.last].k

        def choose(self, ctx) -> int:
            self.turn += 1
            self.last = (1, 2, 3, 0)[self.turn % 4]
            return self.last

    inst = _inst(_trace(n=60, rate_per_s=6.0, max_output=300), frac=0.17)
    base = lp.make_policy("spec-fixed")

    def policy() -> lp.Policy:
        return base.with_(engine=dataclasses.replace(base.engine, speculation=Reordered()))

    fast = lp.simulate(inst, policy(), seed=3, check=True)
    ref_pol = policy()
    ref = lp.simulate(inst, ref_pol, seed=3, reference=True)
    assert ref_pol.engine.speculation.fallbacks > 0  # the table's fallback rows are read
    assert fast.stats["engine"] == "compiled+python-speculation"
    assert ref.stats["engine"] == "compiled+python-speculation+reference"
    assert fast.digest() == ref.digest()
    assert fast.stats["speculation"] == ref.stats["speculation"]
    assert fast.stats["speculation"]["speculative_steps"] > 50


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("make, match", [
    (lambda: UCBSpeculation(draft="no-such-llm"),
     r"UCBSpeculation\.draft: unknown LLM 'no-such-llm'"),
    (lambda: UCBSpeculation(acceptance=1.0),
     r"UCBSpeculation\.acceptance must be in \[0, 1\), got 1\.0"),
    (lambda: UCBSpeculation(acceptance=-0.1), r"UCBSpeculation\.acceptance must be in \[0, 1\)"),
    (lambda: OracleSpeculation(acceptance={0: 0.5, 3: 1.2}),
     r"acceptance\[3\] must be in \[0, 1\)"),
    (lambda: UCBSpeculation(acceptance={"chat": 0.5}), r"tenant ids must be integers"),
    (lambda: UCBSpeculation(max_k=-1), r"UCBSpeculation\.max_k must be >= 0, got -1"),
    (lambda: FixedSpeculation(k=5, max_k=3), r"FixedSpeculation\.k=5 exceeds max_k=3"),
    (lambda: UCBSpeculation(draft=["llama-68m"], acceptance=[0.5, 0.6]),
     r"acceptance has 2 rates but there are 1 draft models"),
    (lambda: EngineConfig(speculation="ucb"), r"EngineConfig\.speculation must be None or a "),
    (lambda: lp.make_policy("spec-ucb", k=3), r"k is a parameter of spec-fixed only"),
])
def test_invalid_configuration_names_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_invalid_run_configurations_name_the_cause():
    from lpserve.policies.lyapunov import TBTRecorder

    with pytest.raises(ValueError, match="cannot be combined with EngineConfig.budget_controller"):
        EngineConfig(speculation=UCBSpeculation(), budget_controller=TBTRecorder())
    tr = _trace(n=5, tenants=[0, 1, 2])
    with pytest.raises(ValueError, match="has no rate for tenant 2"):
        lp.simulate(_inst(tr), lp.make_policy("spec-ucb", acceptance={0: 0.5, 1: 0.6}))
    with pytest.raises(ValueError, match="draft\\(s\\) \\['llama-2-7b'\\] weights exceed"):
        lp.simulate(_inst(tr, frac=0.18), lp.make_policy("spec-ucb", draft="llama-2-7b"))
    unit = _inst(tr).with_(cost=UnitRoundCost(memory_tokens=4000))
    with pytest.raises(ValueError, match="needs an analytic cost model"):
        lp.simulate(unit, "spec-ucb")


def test_step_and_prefill_times_follow_the_model_by_hand():
    """models/speculative-decoding.md (4)-(6) for one request with nothing accepted: TTFT is
    the target's plus the draft's prefill, each later step is SpeculationCost.step_time_s."""
    from lpserve.cost.speculation import speculation_cost

    tr = lp.Trace.from_arrays(arrival_s=[0.0], prompt_tokens=[500], output_tokens=[4])
    inst = _inst(tr, llm="llama-2-13b")
    res = lp.simulate(inst, lp.make_policy("spec-fixed", k=2, draft="tinyllama-1.1b",
                                           acceptance=0.0, prefix_caching=False), check=True)
    sc = speculation_cost("llama-2-13b", "tinyllama-1.1b", gpu="a100-80gb", tp=1)
    prefill = sc.target.batch_time_s(prefill_tokens=[500]) + \
        sc.drafts[0].batch_time_s(prefill_tokens=[500])
    a = res.arrays
    assert a["first_token_s"][0] == pytest.approx(prefill, rel=1e-12)
    steps = sum(sc.step_time_s(2, [c]) for c in (500, 501, 502))
    assert a["finish_s"][0] - a["first_token_s"][0] == pytest.approx(steps, rel=1e-9)


def test_a_speculative_run_stops_at_the_quantum_tick_after_its_start():
    """Named example (found by a random search of speculation under other schedulers): the
    compiled replica runs speculative steps back to back until an event, and must stop at
    the scheduler's first quantum tick after the run's start, as a decode run does. Taken
    from the time after the run's first step instead, a step that crossed the tick was
    followed by more steps; MLFQ, which credits service at each decision, was not asked
    at the tick and its ranks, preemptions and finish times drifted from the reference."""
    import dataclasses

    tr = lp.Trace.from_arrays(
        arrival_s=[0.003479, 0.006052, 0.006695, 0.007458, 0.009502, 0.010469, 0.010527,
                   0.015566, 0.019942, 0.020497, 0.033651, 0.038612, 0.038986, 0.043009,
                   0.04418, 0.04458, 0.045304, 0.048814, 0.049568],
        prompt_tokens=[222, 157, 175, 160, 138, 424, 265, 178, 479, 499, 384, 104, 399, 176,
                       443, 232, 62, 268, 422],
        output_tokens=[44, 215, 120, 267, 331, 348, 199, 294, 342, 116, 267, 261, 99, 303,
                       220, 256, 280, 57, 245])
    inst = _inst(tr, frac=0.18)
    spec = lp.make_policy("spec-acceptance-ucb").engine
    pol = lp.make_policy("mlfq")
    pol = dataclasses.replace(pol, engine=dataclasses.replace(
        pol.engine, speculation=spec.speculation, batching=spec.batching,
        chunked_prefill=spec.chunked_prefill, max_num_seqs=15, max_num_batched_tokens=1024,
        preemption="recompute", priority_preemption=False, prefix_caching=False))
    fast = lp.simulate(inst, pol, seed=1, check=True)
    ref = lp.simulate(inst, pol, seed=1, check=True, reference=True)
    assert fast.stats["engine"] == "compiled"
    assert fast.arrays["preemptions"].sum() > 0
    assert fast.digest() == ref.digest()
