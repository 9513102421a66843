"""Waiting for a condition instead of sleeping for a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02
) -> None:
    """Poll until ``predicate`` holds; fail the test if it does not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)
