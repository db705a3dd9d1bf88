"""Shared test configuration: hypothesis profiles and data locations.

Profiles: ``dev`` (fast, random) and ``ci`` (derandomized, more examples); chosen by the
``HYPOTHESIS_PROFILE`` environment variable (the README's test command uses ``ci``). The
mutation suite runs each planted bug's tests under ``mutation-dev`` / ``mutation-ci``: the
same examples without the shrink phase (a kill needs one failing example, not the
smallest one, and shrinking a failure costs minutes).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

settings.register_profile("dev", max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
for _name in ("dev", "ci"):
    settings.register_profile(f"mutation-{_name}", settings.get_profile(_name),
                              phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def shared_dir() -> Path | None:
    """The shared data folder beside the repository (``LPSERVE_SHARED`` overrides)."""
    env = os.environ.get("LPSERVE_SHARED")
    p = Path(env) if env else REPO.parent / "shared"
    return p if (p / "traces").is_dir() else None


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def shared_traces() -> Path:
    d = shared_dir()
    if d is None:
        pytest.skip("the shared trace folder (../shared/traces) is not present on this machine")
    return d / "traces"


def pytest_collection_modifyitems(config, items):
    """Everything under ``tests/slow/`` belongs to the slow tier, marked or not."""
    for item in items:
        if "/tests/slow/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)
