"""Clear errors when a policy writes into its read-only view or uses a field it may not
see (lpserve.policy.checks.explain_policy_error through lp.simulate and check_policy)."""
from __future__ import annotations

import numpy as np
import pytest

import lpserve as lp
from lpserve.policy import Evictor, Policy, PolicyError, Router, Scheduler, as_scheduler
from lpserve.testing import ConformanceError, check_policy


@pytest.fixture(scope="module")
def inst():
    return lp.Instance(trace=lp.bundled_trace().window(0.0, 10.0),
                       cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=2))


class AddsInPlace(Scheduler):
    name = "adds-in-place"

    def rank(self, view):
        view.prompt_tokens[:] += 1
        return view.prompt_tokens


class RouterWrites(Router):
    name = "router-writes"

    def route(self, view):
        w = view.waiting
        w[0] = 7
        return np.zeros(len(view), np.int64)


class ReadsHi(Scheduler):
    name = "reads-hi"  # forgets to declare reads_predictions

    def rank(self, view):
        hi = view.predicted_hi
        return hi.astype(float)


class RouterPeeks(Router):
    name = "router-peeks"

    def route(self, view):
        return (view.output_tokens % view.n_replicas).astype(np.int64)


class Buggy(Scheduler):
    name = "buggy"

    def rank(self, view):
        return np.asarray(view.arrival_s) + {}["missing"]


def test_writing_into_a_scheduler_view(inst):
    with pytest.raises(PolicyError) as e:
        lp.simulate(inst, Policy(scheduler=AddsInPlace(), name="x"))
    msg = str(e.value)
    assert "AddsInPlace 'adds-in-place'" in msg and "view field 'prompt_tokens'" in msg
    assert "read-only" in msg and "view.prompt_tokens[:] += 1" in msg


def test_writing_into_a_router_view(inst):
    with pytest.raises(PolicyError, match="wrote into a view array of its RouterView"):
        lp.simulate(inst, Policy(router=RouterWrites(), name="x"))


def test_using_a_hidden_field_names_it_and_why(inst):
    with pytest.raises(PolicyError) as e:
        lp.simulate(inst, Policy(scheduler=ReadsHi(), name="x"))
    # the failing line holds a local, not the field: the message lists the None fields
    assert "predicted_hi" in str(e.value) and "no predictor was given" in str(e.value)
    with pytest.raises(PolicyError) as e:
        lp.simulate(inst, Policy(router=RouterPeeks(), name="x"))
    msg = str(e.value)
    assert "view.output_tokens is None" in msg and "clairvoyant" in msg
    assert "RouterPeeks 'router-peeks'" in msg


def test_other_errors_pass_through_unchanged(inst):
    with pytest.raises(KeyError, match="missing"):
        lp.simulate(inst, Policy(scheduler=Buggy(), name="x"))
    with pytest.raises(PolicyError, match="rank\\(\\) returned shape"):
        lp.simulate(inst, Policy(scheduler=as_scheduler(lambda v: np.zeros(1)), name="x"))


def test_check_policy_reports_the_field():
    with pytest.raises(ConformanceError, match="failed view fields: .*output_tokens"):
        check_policy(Policy(router=RouterPeeks(), name="peeks"),
                     make=lambda: Policy(router=RouterPeeks(), name="peeks"))
    with pytest.raises(ConformanceError, match="failed inputs untouched: .*prompt_tokens"):
        check_policy(Policy(scheduler=AddsInPlace(), name="adder"),
                     make=lambda: Policy(scheduler=AddsInPlace(), name="adder"))


def test_evictor_view_hidden_field_reason():
    from lpserve.policy.checks import HIDDEN_FIELDS

    assert "reads_queue" in HIDDEN_FIELDS["queued"]
    assert issubclass(PolicyError, ValueError) and Evictor is not None


class ReadsParent(Evictor):
    """Oldest first, after reading ``view.parent`` (which ``reads_tree`` controls)."""

    name = "reads-parent"

    def __init__(self, reads_tree: bool) -> None:
        self.reads_tree = reads_tree
        self.calls = 0

    def evict(self, view, need_blocks):
        has_parent = view.parent >= 0  # a TypeError when the simulator left it None
        assert has_parent.shape == (len(view),)
        self.calls += 1
        return np.argsort(view.last_access_s, kind="stable")[:need_blocks].astype(np.int64)


def test_evictor_parent_follows_reads_tree():
    """``EvictorView.parent`` is filled for evictors with ``reads_tree`` (the default) and
    left None otherwise, where reading it names the flag; the built-in LRU and the session
    evictors, which never read it, turn it off."""
    from lpserve.policies.baselines import engine_policy
    from lpserve.policies.evictors_sessions import SESSION_SPECS, SessionEvictor
    from lpserve.policy import LRU

    mc = lp.Instance(trace=lp.bundled_trace("mooncake-conv-5min").window(0.0, 60.0),
                     cluster=lp.Cluster(gpu="a100-80gb", llm="llama-2-7b", replicas=1))
    ev = ReadsParent(True)
    lp.simulate(mc, engine_policy("vllm-chunked", evictor=ev, name="reads-parent"))
    assert ev.calls > 0
    with pytest.raises(PolicyError, match="reads_tree"):
        lp.simulate(mc, engine_policy("vllm-chunked", evictor=ReadsParent(False),
                                      name="reads-parent-off"))
    assert not LRU.reads_tree and not SessionEvictor(SESSION_SPECS["ttl-pin"]).reads_tree
