"""Test-wide settings: Hypothesis profiles, the metrics port of servers run as subprocesses, and
what keeps tests apart when pytest-xdist runs them in several processes (docs/testing.md)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, keep the tests of one costly process in one worker (``--dist loadgroup``):
    each worker would otherwise start its own Spark session (a JVM) or Chromium for a few tests.
    And run the ``alone`` tests last: each waits for the tests running beside it to end, and at
    the end that wait is paid once rather than before every one of them."""
    if not hasattr(config, "workerinput"):
        return
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in (("spark", "spark"), ("browser", "chromium")):
            if fixture in fixtures:
                item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.get_closest_marker("alone") is not None)


@contextmanager
def _locked(path: Path, operation: int) -> Iterator[None]:
    """Hold ``flock(path, operation)`` for the block."""
    with path.open("a") as file:
        fcntl.flock(file, operation)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


# First, so outside pytest-timeout's timer: the wait for the lock is not the test's time.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Under xdist, run a test marked ``alone`` while no other worker runs a test.

    Every test holds a shared lock from its setup to its teardown; an ``alone`` test holds it
    exclusively. The turnstile, taken briefly by everyone and held by an ``alone`` test while it
    waits, stops new tests from starting meanwhile, so the waiting test is not starved.
    """
    if not hasattr(item.config, "workerinput"):  # not an xdist worker: tests run one at a time
        return (yield)
    # Each worker's temporary root is a folder of the run's, which pytest removes in time.
    base = item.config._tmp_path_factory.getbasetemp().parent / "alone"  # type: ignore[attr-defined]
    alone = item.get_closest_marker("alone") is not None
    with _locked(base.with_suffix(".turnstile"), fcntl.LOCK_EX):
        gate = base.with_suffix(".gate").open("a")
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    try:
        return (yield)
    finally:
        fcntl.flock(gate, fcntl.LOCK_UN)
        gate.close()


# Servers the tests start as subprocesses inherit this: many may run at once on one machine,
# and the default metrics port (15692) would let only one of them start.
os.environ.setdefault("SLUICEGATE_METRICS_LISTEN", "127.0.0.1:0")
