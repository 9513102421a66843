"""The epoll selector against real socket pairs: readiness, paused interest, deadlines."""

from __future__ import annotations

import gc
import socket
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from sluicegate.gateway.selector import EpollSelector


class FakeReactor:
    """What ``Selectable`` needs from a reactor: somewhere to push its events."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def push_event(self, context: object, kind: object) -> None:
        self.events.append(kind)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def selectable(sock: socket.socket, *, reading: bool = False, writing: bool = False) -> Any:
    from proton._selectable import Selectable

    s = Selectable(sock, FakeReactor())  # type: ignore[arg-type]
    s.reading = reading
    s.writing = writing
    return s


def test_reports_readable_only_while_reading_is_wanted_and_a_peer_leaving_once(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    selector = EpollSelector()
    ours, theirs = pair
    s = selectable(ours, reading=True)
    selector.add(s)
    theirs.send(b"x")
    assert selector.select(1.0)[0] == [s]
    s.reading = False
    selector.update(s)
    assert selector.select(0.05) == ([], [], [])
    # The peer leaving is reported once while nothing is wanted (as readable, and left()
    # says why), then no more: no busy loop.
    theirs.close()
    assert selector.select(1.0) == ([s], [], [])
    assert selector.left(s)
    assert not selector.left(s)
    assert selector.select(0.05) == ([], [], [])
    s.reading = True
    selector.update(s)
    assert selector.select(1.0)[0] == [s]
    assert not selector.left(s)
    selector.remove(s)
    assert len(selector._selectables) == 0
    selector.close()


def test_writable_and_expired(pair: tuple[socket.socket, socket.socket]) -> None:
    selector = EpollSelector()
    s = selectable(pair[0], writing=True)
    selector.add(s)
    assert selector.select(1.0)[1] == [s]
    s.writing = False
    s.deadline = time.time() + 0.05
    selector.update(s)
    started = time.monotonic()
    readable, writable, expired = selector.select(5.0)
    assert (readable, writable, expired) == ([], [], [s])
    assert time.monotonic() - started < 4.0, "the wait ended at the deadline, not the timeout"
    # An expired deadline is reported once, until the selectable sets a new one.
    assert selector.select(0.01) == ([], [], [])
    selector.close()


def test_a_moved_deadline_replaces_the_old_one(pair: tuple[socket.socket, socket.socket]) -> None:
    selector = EpollSelector()
    s = selectable(pair[0])
    s.deadline = time.time() + 0.01
    selector.add(s)
    s.deadline = time.time() + 60
    selector.update(s)
    time.sleep(0.02)
    assert selector.select(0.01) == ([], [], [])
    s.deadline = None
    selector.update(s)
    selector.remove(s)
    selector.close()


def test_deadlines_that_keep_moving_keep_the_heap_small_and_hold_no_removed_selectable(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """A busy connection moves its idle deadline with every frame; a closed one is let go."""
    selector = EpollSelector()
    s = selectable(pair[0])
    selector.add(s)
    far = time.time() + 60
    for step in range(10_000):
        s.deadline = far + step
        selector.update(s)
    assert len(selector._heap) <= 2 + 64
    gone = weakref.ref(s)
    selector.remove(s)
    del s
    gc.collect()
    assert gone() is None, "a stale heap entry kept a removed selectable alive"
    selector.close()
