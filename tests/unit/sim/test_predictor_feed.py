"""The event loop feeds an online predictor from the completion stream
(``Events.predictor_finished``): every request it observes has finished by the time of
the prediction that shows it, each is shown once, in finish order, and by the last
arrival every request finished before it has been shown; the fast and the reference mode
show the same."""
from __future__ import annotations

import numpy as np

import lpserve as lp
from lpserve.policies.predictors import History
from lpserve.registry import make_policy
from lpserve.sim.engine import Simulation


class Spy(History):
    """History that records each request it is shown and when."""

    def reset(self, cluster, rng):
        super().reset(cluster, rng)
        self.seen = []

    def observe(self, view):
        self.seen.extend((i, view.now_s) for i in view.request.tolist())
        super().observe(view)


def test_each_completion_is_shown_once_in_finish_order_after_it_happens():
    rng = np.random.default_rng(3)
    n = 300
    tr = lp.Trace.from_arrays(arrival_s=np.sort(rng.uniform(0, 30, n)),
                              prompt_tokens=rng.integers(50, 2000, n),
                              output_tokens=rng.integers(5, 300, n))
    inst = lp.Instance(trace=tr, cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b",
                                                    replicas=2))
    records = []
    for reference in (False, True):
        spy = Spy()
        sim = Simulation(inst, make_policy("mcsf"), 0, reference=reference, predictor=spy)
        sim.run()
        finish = sim.state.finish
        req = [i for i, _ in spy.seen]
        assert len(req) == len(set(req)), "a completion was shown twice"
        assert all(finish[i] <= t for i, t in spy.seen), "shown before it finished"
        assert [finish[i] for i in req] == sorted(finish[i] for i in req), "out of order"
        before_last = set(np.flatnonzero(finish <= tr.arrival_s[-1]).tolist())
        assert before_last <= set(req), "a completion before the last arrival was not shown"
        records.append(spy.seen)
    assert records[0] == records[1]
