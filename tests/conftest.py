"""Test-wide settings: Hypothesis profiles, and the metrics port of servers run as subprocesses."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# The quick run (-m "not slow") tries a quarter of the examples; CI, running everything, all.
settings.register_profile("quick", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_configure(config: pytest.Config) -> None:
    """Load the quick profile before the test modules build their settings from it."""
    if "not slow" in (config.getoption("markexpr") or ""):
        settings.load_profile("quick")


# Servers the tests start as subprocesses inherit this: many may run at once on one machine,
# and the default metrics port (15692) would let only one of them start.
os.environ.setdefault("SLUICEGATE_METRICS_LISTEN", "127.0.0.1:0")
