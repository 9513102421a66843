"""PLAIN password checks on worker threads, queued within bounds, verdicts back on the reactor.

A salted scrypt hash (gateway/rules/auth.py) takes tens of milliseconds to check, hundreds on a
loaded machine; on the reactor thread every other client would wait that long per login.
``hashlib.scrypt`` releases the GIL, so :data:`WORKERS` threads check while the reactor carries
on, and :class:`gateway.wakeup.Wakeup` brings each verdict back.

A flood of logins must not delay everyone else's: checks wait in one bounded queue per listener
(:class:`LoginQueue`), each source address may have only a few of them waiting, and a client over
either bound is refused at once (SASL ``sys-temp``: try again later). The workers take the
listeners' queues in turn. A waiting check whose client has gone is dropped before it costs any
hashing (:meth:`Ticket.cancel`). All the bookkeeping runs on the reactor thread; the workers
only hash.

OAuth 2 tokens are checked the same way, at login and when a connection renews its token
(gateway/renewal.py): verifying one (PyJWT's walk over every character, then RSA or EC) took
the reactor up to 5 ms a token, for every other client, as often as a client renewed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

from sluicegate.gateway.oauth2 import OAuth2Settings, TokenError, looks_like_token, verify_token
from sluicegate.gateway.rare_warning import CLIENT_BURST, RareWarning
from sluicegate.gateway.rules.auth import User, check_plain

log = logging.getLogger("sluicegate.login")
# A line per refused token, within the burst of its kind (gateway/rare_warning.py); counted on
# the pool's threads, where two refusals at once may miscount by one, never log more.
_token_refused = RareWarning("refused a token", burst=CLIENT_BURST, level=logging.INFO, logger=log)

# Two checks at once keep both cores of a small machine busy at 16 MiB each; more would only
# queue behind the CPU.
WORKERS: Final = 2

Verdict = Callable[[User | None], None]


@dataclass(eq=False, slots=True)
class Ticket:
    """One login waiting for, or undergoing, its password check."""

    name: str
    password: bytes
    address: str
    done: Verdict
    queue: LoginQueue
    started: bool = False
    cancelled: bool = False
    # A token renewal's (gateway/renewal.py): verified as a token or refused, never a password;
    # the permissions of ``vhost`` resolved on the worker too, and a refusal's reason kept.
    token: bool = False
    vhost: str | None = None
    refusal: str = ""

    def cancel(self) -> None:
        """The client has gone: drop the check if it has not started, and its verdict anyway;
        the ticket keeps nothing of the client while it waits for its turn."""
        self.queue.cancel(self)
        self.done = _nobody
        self.password = b""


@dataclass(frozen=True, slots=True)
class LoginStatistics:
    """What the checks of one server have done."""

    checked: int
    waiting: int
    refused: int
    dropped: int


@dataclass(eq=False, slots=True)
class LoginQueue:
    """One listener's waiting checks: at most ``limit``, at most ``per_address`` per source."""

    checks: PasswordChecks
    limit: int
    per_address: int
    waiting: deque[Ticket] = field(default_factory=deque)
    # Waiting checks not cancelled, in all and by source address.
    live: int = 0
    by_address: dict[str, int] = field(default_factory=dict)

    def submit(
        self,
        name: str,
        password: bytes,
        address: str,
        done: Verdict,
        *,
        token_for: str | None = None,
    ) -> Ticket | None:
        """Queue a check; None if this listener or this address has too many waiting.

        With ``token_for`` (a virtual host), ``password`` is a renewed token, verified as one
        with the permissions it gives there resolved.
        """
        from_address = self.by_address.get(address, 0)
        if self.live >= self.limit or from_address >= self.per_address:
            self.checks.refused += 1
            return None
        ticket = Ticket(name, password, address, done, self)
        if token_for is not None:
            ticket.token = True
            ticket.vhost = token_for
        self.waiting.append(ticket)
        self.live += 1
        self.by_address[address] = from_address + 1
        self.checks.start()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Forget a ticket; one still waiting is skipped when its turn comes."""
        if ticket.cancelled:
            return
        ticket.cancelled = True
        if ticket.started:
            return
        self._uncount(ticket)
        self.checks.dropped += 1
        # Cancelled tickets stay in the deque until their turn; compact it once they
        # outnumber the live ones, so that connect-and-vanish cycles cannot grow it.
        if len(self.waiting) > 2 * self.live + WORKERS:
            self.waiting = deque(waiting for waiting in self.waiting if not waiting.cancelled)

    def take(self) -> Ticket | None:
        """The next live ticket, now started; None if none waits."""
        while self.waiting:
            ticket = self.waiting.popleft()
            if not ticket.cancelled:
                self._uncount(ticket)
                ticket.started = True
                return ticket
        return None

    def _uncount(self, ticket: Ticket) -> None:
        self.live -= 1
        left = self.by_address[ticket.address] - 1
        if left:
            self.by_address[ticket.address] = left
        else:
            del self.by_address[ticket.address]


def _nobody(user: User | None) -> None:
    """The verdict of a cancelled check: nobody waits for it."""


class PasswordChecks:
    """Checks PLAIN logins against the config's users, or its OAuth 2 keys, off the reactor."""

    def __init__(
        self,
        users: Mapping[str, User],
        call_soon: Callable[[Callable[[], None]], None],
        oauth2: OAuth2Settings | None = None,
    ):
        self._users = users
        self._oauth2 = oauth2
        self._call_soon = call_soon
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="sluicegate-login")
        self._queues: list[LoginQueue] = []
        # Which queue the next free worker looks at first: listeners take turns.
        self._turn = 0
        self._running = 0
        self._closed = False
        self.checked = 0
        self.refused = 0
        self.dropped = 0

    def queue(self, limit: int, per_address: int) -> LoginQueue:
        """A new listener's queue."""
        queue = LoginQueue(self, limit, per_address)
        self._queues.append(queue)
        return queue

    def start(self) -> None:
        """Hand waiting checks to free workers, taking the listeners' queues in turn."""
        queues = self._queues
        while self._running < WORKERS and not self._closed:
            for offset in range(len(queues)):
                ticket = queues[(self._turn + offset) % len(queues)].take()
                if ticket is not None:
                    self._turn = (self._turn + offset + 1) % len(queues)
                    break
            else:
                return
            self._running += 1
            future = self._pool.submit(self._check, ticket)
            future.add_done_callback(functools.partial(self._deliver, ticket))

    def _check(self, ticket: Ticket) -> User | None:
        """On a worker thread: a password that is a JWT is a token where OAuth 2 is configured
        (the user is whoever the token names, as with RabbitMQ's oauth2 backend); a renewal's
        is a token or nothing."""
        name, password = ticket.name, ticket.password
        if self._oauth2 is not None and (ticket.token or looks_like_token(password)):
            try:
                user = verify_token(self._oauth2, password, time.time())
            except TokenError as error:
                _token_refused.happened(time.monotonic(), f"presented as {name!r}: {error}")
                ticket.refusal = str(error)
                return None
            if ticket.vhost is not None:
                user.permissions(ticket.vhost)  # compiled here, kept by the user
            return user
        if ticket.token:
            ticket.refusal = "tokens are not accepted by this server"
            return None
        return check_plain(self._users, name, password)

    def _deliver(self, ticket: Ticket, future: Future[User | None]) -> None:
        """On the worker thread: hand the verdict to the reactor thread."""
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            log.error("password check failed: %r", error)
        user = None if error is not None else future.result()
        # After shutdown the wakeup pipe is closed: the client is being dropped anyway.
        with contextlib.suppress(OSError):
            self._call_soon(lambda: self._finished(ticket, user))

    def _finished(self, ticket: Ticket, user: User | None) -> None:
        self._running -= 1
        self.checked += 1
        if not ticket.cancelled:
            ticket.done(user)
        self.start()

    def statistics(self) -> LoginStatistics:
        """Counts since the start; call on the reactor thread."""
        waiting = sum(queue.live for queue in self._queues)
        return LoginStatistics(self.checked, waiting, self.refused, self.dropped)

    def close(self) -> None:
        """Start no more checks; a running one finishes but its verdict goes nowhere."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
