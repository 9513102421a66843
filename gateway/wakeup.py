"""Waking the reactor from a signal handler or another thread.

Proton's ``EventInjector`` takes a lock in ``queue.Queue.put``, which a signal handler must not do.
Here callers append to a deque and write one byte to a pipe; the reactor thread drains the pipe
and runs the callbacks. A reentrant lock orders a late caller against :meth:`Wakeup.close`: a
thread that found the pipe open could otherwise write after it was closed (EBADF), or into
whatever file was opened next under the same descriptor number. It is reentrant because a
signal handler runs on the main thread between bytecodes and may interrupt that very thread
while it holds the lock: it must get in, not wait for itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import cast

from proton import Event
from proton.reactor import Container, EventInjector

from sluicegate.gateway.proton.internals import Selectable, register

log = logging.getLogger("sluicegate")


class Wakeup:
    """A selectable pipe that runs queued callbacks on the reactor thread."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._calls: deque[Callable[[], None]] = deque()
        self._selectable: Selectable | None = None
        # Set when the reactor closes the pipe: late callers (a log writer thread finishing its
        # last fsync) are dropped instead of writing to a closed descriptor.
        self._closed = False
        self._lock = threading.RLock()

    def attach(self, container: Container) -> None:
        """Register the pipe with the reactor's selector."""
        # The selector only needs fileno(): the pipe stands in for proton's injector.
        self._selectable = register(container, cast(EventInjector, self), self)

    def detach(self) -> None:
        """Leave the selector, so that a reactor with nothing else to do can end."""
        if self._selectable is not None and not self._selectable.is_terminal:
            self._selectable.terminate()
            self._selectable.update()

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the reactor thread; safe from threads and signal handlers."""
        with self._lock:
            if self._closed:
                return
            self._calls.append(callback)
            # A full pipe already wakes the reactor: the byte is not needed.
            with contextlib.suppress(BlockingIOError):
                os.write(self._write, b"!")

    def fileno(self) -> int:
        """The read end of the pipe, for the selector."""
        return self._read

    def on_selectable_readable(self, event: Event) -> None:
        """Drain the pipe and run what was queued. A call that raises is logged as an internal
        error and the calls after it still run: the pipe is drained, so a call left queued
        behind it would wait for the next caller's byte (a log fsync's report, a login's
        verdict, an HTTP request's job), which may never come."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass
        # Only the calls queued so far: one that queues another (a job run in turns,
        # gateway/server.py) has it run in the next turn, after the sockets that are ready.
        calls = self._calls
        for _ in range(len(calls)):
            try:
                calls.popleft()()
            except Exception:
                log.exception("internal error in a call run on the reactor thread; the rest go on")

    def close(self) -> None:
        """Called by the reactor when the selectable ends: release both ends of the pipe."""
        with self._lock:
            self._closed = True
            os.close(self._read)
            os.close(self._write)
