"""PLAIN password checks on worker threads, with the verdict handed back to the reactor thread.

A salted scrypt hash (gateway/auth.py) takes tens of milliseconds to check, hundreds on a loaded
machine; on the reactor thread every other client would wait that long per login, and a burst of
logins would stall the server. ``hashlib.scrypt`` releases the GIL, so a small pool checks while
the reactor carries on, and :class:`gateway.wakeup.Wakeup` brings each verdict back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

from sluicegate.gateway.auth import User, check_plain

log = logging.getLogger("sluicegate.login")

# Two checks at once keep both cores of a small machine busy at 16 MiB each; more would only
# queue behind the CPU.
WORKERS: Final = 2

Verdict = Callable[[User | None], None]


class PasswordChecks:
    """Checks PLAIN logins against the config's users off the reactor thread."""

    def __init__(self, users: Mapping[str, User], call_soon: Callable[[Callable[[], None]], None]):
        self._users = users
        self._call_soon = call_soon
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="sluicegate-login")

    def check(self, name: str, password: bytes, done: Verdict) -> None:
        """Check a login; ``done(user or None)`` runs later on the reactor thread."""
        future = self._pool.submit(check_plain, self._users, name, password)
        future.add_done_callback(lambda finished: self._deliver(finished, done))

    def _deliver(self, future: Future[User | None], done: Verdict) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            log.error("password check failed: %r", error)
        user = None if error is not None else future.result()
        # After shutdown the wakeup pipe is closed: the client is being dropped anyway.
        with contextlib.suppress(OSError):
            self._call_soon(lambda: done(user))

    def close(self) -> None:
        """Cancel checks not started; a running one finishes but its verdict goes nowhere."""
        self._pool.shutdown(wait=False, cancel_futures=True)
