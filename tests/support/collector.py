"""Python's cyclic collector off for a test, as in a worker (gateway/collection.py): what goes,
goes by reference counting alone, as soon as nothing refers to it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_off() -> Iterator[None]:
    """Collect what earlier tests left, then keep the collector off until the block ends."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
