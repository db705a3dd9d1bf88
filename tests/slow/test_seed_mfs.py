"""MFS on one shared prefill-to-decode link (flow level, ``benchmarks/seeds/mfs.py``):
over three seeds, at a contended bandwidth the reverse multi-level queue meets more
TTFT deadlines than FIFO; on flow sets that preemptive EDF schedules with every deadline
met (the oracle: it meets all whenever any schedule can), RMLQ and LLF meet at least as
many deadlines as FIFO. (When not every deadline can be met, EDF is no bound on the
number met: it can let a cascade of transfers miss.)"""
from __future__ import annotations

import pytest

from tests.slow.seed_bench import load

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rmlq_over_fifo_and_on_edf_feasible_sets(seed):
    B = load("mfs")
    f = B.transfers(300, 12.0, seed)
    att = B.attainment(f, 15.0)
    print(f"seed {seed}: {att}")
    assert att["rmlq"] > att["fcfs"]
    fs = B.feasible_sets(60, seed)
    assert fs["rmlq"] >= fs["fcfs"] and fs["llf"] >= fs["fcfs"]
