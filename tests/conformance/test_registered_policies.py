"""Every registered policy through the public conformance suite."""
from __future__ import annotations

import numpy as np
import pytest

from lpserve.policy import Policy, as_scheduler
from lpserve.registry import policy_names
from lpserve.testing import ConformanceError, check_policy


@pytest.mark.parametrize("name", policy_names())
def test_registered_policy_conforms(name):
    report = check_policy(name)
    assert report["checks"]["liveness"] == "ok"


def _always_hold(view):
    return np.full(len(view), np.inf)


def test_suite_catches_a_starving_policy():
    with pytest.raises(ConformanceError, match="liveness"):
        check_policy(Policy(scheduler=as_scheduler(_always_hold), name="hold"))


def test_suite_catches_a_writer():
    def writer(view):
        view.arrival_s[0] = 0.0
        return view.arrival_s

    with pytest.raises(ConformanceError, match="policy 'writer' failed inputs untouched"):
        check_policy(Policy(scheduler=as_scheduler(writer), name="writer"),
                     make=lambda: Policy(scheduler=as_scheduler(writer), name="writer"))
