"""Worked examples (FastServe's toy model as in proofs/sched-mlfq-skip-join.md, Autellix's
Fig. 2, arXiv 2502.13965, as in proofs/sched-plas-atlas.md) and the engine
support the schedulers need (priority preemption, the predictor hook)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import lpserve as lp
from lpserve.policies.mlfq import MLFQ, entry_level, iteration_toy
from lpserve.policies.predictors import Oracle
from lpserve.policies.programs import ProgramScheduler, program_toy
from lpserve.policy import FCFS, as_scheduler


def _srpt_time(view):  # remaining time on the toy model (first iteration = prompt length)
    first = view.generated_tokens == 0
    return np.where(first, view.prompt_tokens + view.output_tokens - 1,
                    view.output_tokens - view.generated_tokens).astype(float)


def _mlfq(entry, demote_on):
    return MLFQ(entry, base_quantum_s=1.0, starvation_s=None, demote_on=demote_on,
                prefill_s_per_token=1.0, decode_iteration_s=1.0)


def _mean(x):
    return Fraction(int(round(3 * float(np.sum(x)))), 9)


@pytest.mark.parametrize("f, o, fcfs, naive, skip_ge, skip_gt, srpt", [
    ((2, 2, 1), (2, 1, 1), Fraction(14, 3), Fraction(15, 3), Fraction(4), Fraction(11, 3),
     Fraction(10, 3)),
    ((2, 1, 1), (2, 1, 2), Fraction(13, 3), Fraction(14, 3), Fraction(4), Fraction(10, 3),
     Fraction(10, 3)),
])
def test_fastserve_toy_instances(f, o, fcfs, naive, skip_ge, skip_gt, srpt):
    assert _mean(iteration_toy(FCFS(), f, o)) == fcfs
    assert _mean(iteration_toy(as_scheduler(_srpt_time), f, o)) == srpt
    for rule in (">=", ">"):
        assert _mean(iteration_toy(_mlfq("first", rule), f, o)) == naive
    assert _mean(iteration_toy(_mlfq("prefill", ">="), f, o)) == skip_ge
    assert _mean(iteration_toy(_mlfq("prefill", ">"), f, o)) == skip_gt
    strict_skip, naive_m = _mlfq("prefill", ">"), _mlfq("first", ">")
    iteration_toy(strict_skip, f, o)
    iteration_toy(naive_m, f, o)
    assert strict_skip.demotions <= naive_m.demotions


def test_skip_join_entry_queue():
    assert entry_level(0.010, 0.010) == 0
    assert entry_level(0.011, 0.010) == 1
    assert entry_level(0.035, 0.010) == 2


def test_autellix_example_fcfs_wait_is_18():
    out = program_toy(FCFS(), [[4, 3, 1, 1], [3, 3, 4], [1, 2], [4]], batch=2)
    assert out["total_wait"] == 18 and out["makespan"] == 14


def test_plas_single_call_programs_equal_mlfq():
    progs = [[3], [1], [4], [2], [5], [1]]
    plas = program_toy(ProgramScheduler("plas", base_quantum_s=1.0), progs, batch=2)
    mlfq = program_toy(MLFQ("first", base_quantum_s=1.0, starvation_s=None, demote_on=">=",
                            prefill_s_per_token=1.0, decode_iteration_s=1.0), progs, batch=2)
    assert plas == mlfq


def test_plas_inherits_program_service_and_beats_fcfs_on_example():
    progs = [[4, 3, 1, 1], [3, 3, 4], [1, 2], [4]]
    plas = program_toy(ProgramScheduler("plas", base_quantum_s=1.0), progs, batch=2)
    atlas = program_toy(ProgramScheduler("atlas", base_quantum_s=1.0), progs, batch=2)
    assert plas["total_wait"] < 18 and atlas == plas  # chains: ATLAS == PLAS


def _unit_instance(a, s, o, M=100_000, **kw):
    tr = lp.Trace.from_arrays(arrival_s=np.asarray(a, float), prompt_tokens=s, output_tokens=o,
                              **kw)
    return lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    block_tokens=1),
                       cost=lp.UnitRoundCost(memory_tokens=M))


def test_priority_preemption_lets_a_short_job_pass():
    inst = _unit_instance([0, 1], [1, 1], [10, 1])
    plain = lp.simulate(inst, lp.make_policy("sjf-oracle", max_num_seqs=1), check=True)
    pre = lp.simulate(inst, lp.make_policy("srpt-oracle", max_num_seqs=1), check=True)
    assert plain.arrays["finish_s"][1] == 11.0          # waits for the long job
    assert pre.arrays["finish_s"][1] == 2.0              # preempts it
    assert pre.arrays["preemptions"][0] == 1


def test_predictor_hook_fills_predictions_and_learns_only_from_the_past():
    seen = []

    def spy(view):
        seen.append((view.predicted_lo.copy(), view.output_tokens.copy()))
        return view.arrival_s.copy()

    inst = _unit_instance([0, 1, 2], [1, 1, 1], [3, 5, 2])
    pol = lp.Policy(scheduler=as_scheduler(spy, meta=lp.Meta(clairvoyant=True)), name="spy")
    lp.simulate(inst, pol, predictor=Oracle())
    assert all(np.array_equal(lo, out) for lo, out in seen)
    with pytest.raises(ValueError, match="predictor"):
        lp.simulate(inst, pol, predictor=object())
