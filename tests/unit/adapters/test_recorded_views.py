"""Parity on recorded views: rankings recorded inside vLLM 0.32 and Vidur 0.0.26
(``LPSERVE_RECORD_VIEWS``; fixtures in ``tests/fixtures/adapters/``) are replayed against
the same policy without either engine installed. The policy must give the recorded
ranks, and the queue order each adapter applied to its engine (read back from the
engine's own queues when recorded) must be the stable argsort of those ranks."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lpserve.adapters import _order as O

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "adapters"
FILES = {"vllm": FIXTURES / "vllm_views.jsonl", "vidur": FIXTURES / "vidur_views.jsonl"}


def rows(engine):
    return O.load_recorded(FILES[engine])


def ids_in(records, positions):
    return [records[i].request for i in positions]


@pytest.mark.parametrize("engine", sorted(FILES))
def test_replayed_ranks_and_applied_order_match(engine):
    data = rows(engine)
    assert len(data) >= 5
    for k, row in enumerate(data):
        assert row["engine"].startswith(engine)
        sched = O.resolve_scheduler(row["policy"], row["params"])
        recs = row["records"]
        view = O.build_view(recs, **row["view"])
        ranks = O.checked_ranks(sched, view, row["policy"])
        np.testing.assert_array_equal(ranks, np.asarray(row["ranks"], float),
                                      err_msg=f"{engine} row {k}: ranks differ")
        d = O.rank_order(sched, recs, row["policy"], **row["view"])
        assert d.waiting.tolist() == row["waiting_order"], f"{engine} row {k}"
        assert d.running.tolist() == row["running_order"], f"{engine} row {k}"
        assert d.held.tolist() == row["held"], f"{engine} row {k}"
        # what the engine's queues held after the adapter reordered them
        order = np.argsort(ranks, kind="stable")
        want_wait = [recs[i].request for i in order if not recs[i].running
                     and math.isfinite(ranks[i])]
        want_run = [recs[i].request for i in order if recs[i].running]
        applied = row["applied"]
        assert applied.get("kv_holding_waiting", []) + applied["waiting"] == want_wait, \
            f"{engine} row {k}: waiting queue not in rank order"
        assert applied["running"] == want_run, f"{engine} row {k}: running not in rank order"
        assert sorted(applied["held"]) == sorted(ids_in(recs, d.held))


@pytest.mark.parametrize("engine", sorted(FILES))
def test_fixtures_exercise_non_fcfs_order(engine):
    """The recordings are not trivial: some waiting queue left FCFS order, some request
    was held back (+inf), and (Vidur) some recorded step had preempted requests, with
    the worst-ranked running request last (the victim)."""
    data = rows(engine)
    moved = held = 0
    for row in data:
        recs = row["records"]
        wait = row["applied"]["waiting"]
        fcfs = sorted(wait, key=lambda i: next(r.arrival_s for r in recs if r.request == i))
        moved += wait != fcfs
        held += bool(row["held"])
        run = row["applied"]["running"]
        if len(run) >= 2:
            rank = {r.request: x for r, x in zip(recs, row["ranks"])}
            assert rank[run[-1]] == max(rank[i] for i in run)
    assert moved > 0 and held > 0
    if engine == "vidur":
        assert any(r.preemptions for row in data for r in row["records"])


def test_replay_detects_a_different_policy():
    """A replay with another policy disagrees (the check can fail)."""
    row = rows("vllm")[0]
    other = O.resolve_scheduler("tests.unit.adapters.policies:longest_prompt_first")
    d = O.rank_order(other, row["records"], "other", **row["view"])
    assert d.waiting.tolist() != row["waiting_order"]
