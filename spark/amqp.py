"""The connector's AMQP connection: one session over a :class:`~sluicegate.clients.pump.Pump`.

Spark wants windows of 100,000 messages moved as fast as the gateway sends them, so connections
are driven by hand (``clients/pump.py``): the connector asks its links what arrived, with no
collector and no events.

Opening a connection is retried with exponential back-off on network errors (the gateway may be
restarting), all within ``connectTimeoutMs`` x ``connectAttempts``; the error after the last
attempt names the URL and the last cause. A refused login, a certificate that does not verify
and a refused link are not retried (each carries the gateway's or the TLS layer's verdict, which
retrying cannot change). With ``username``/``password`` the login is SASL PLAIN, otherwise
ANONYMOUS; with TLS the bytes pass through Python's ``ssl`` (``transport/channel.py``).
"""

from __future__ import annotations

import os
import socket
import ssl
import time
import uuid
from collections.abc import Callable
from typing import Final

from proton import (
    SASL,
    Condition,
    Data,
    Endpoint,
    Link,
    Message,
    Receiver,
    Sender,
    Terminus,
)

from sluicegate.clients.management import ADDRESS as MANAGEMENT
from sluicegate.clients.management import Reply, reply_of, request_message
from sluicegate.clients.pump import Pump
from sluicegate.spark.options import Endpoint as GatewayEndpoint
from sluicegate.transport.channel import TlsChannel, TlsError, client_context

__all__ = ["POLL_S", "AmqpConnection", "AmqpError", "AuthenticationError", "TlsError", "describe"]

# The condition proton gives a transport whose SASL outcome was not ``ok`` (AMQP 1.0 §5.3.3.6).
UNAUTHORIZED: Final = "amqp:unauthorized-access"
# sasl-code values (AMQP 1.0 §5.3.3.6) that refuse a login for good.
_REFUSED: Final = {SASL.AUTH: "auth", SASL.SYS: "sys", SASL.PERM: "sys-perm"}
# Between two looks at the socket: short enough to answer FLOWs and heartbeats promptly, long
# enough that an idle connection costs nothing.
POLL_S: Final = 0.05
# Back-off between connection attempts: doubling from a quarter second, at most five seconds,
# so that a gateway restarting for a few seconds is reached on the second or third attempt.
BACKOFF_FIRST_S: Final = 0.25
BACKOFF_MAX_S: Final = 5.0


class AmqpError(RuntimeError):
    """The gateway refused or closed something; the message carries its error condition."""


class AuthenticationError(AmqpError):
    """The gateway refused the login: a wrong user name or password, or no mechanism in common.

    Not retried: the same login would be refused again.
    """


def describe(condition: Condition | None, default: str) -> str:
    """One line from an AMQP error condition."""
    if condition is None:
        return default
    if condition.description:
        return f"{condition.name}: {condition.description}"
    return str(condition.name)


def _tls_context(endpoint: GatewayEndpoint) -> ssl.SSLContext | None:
    tls = endpoint.tls
    if tls is None:
        return None
    try:
        return client_context(tls.ca_file, tls.verify_hostname)
    except TlsError as error:
        raise TlsError(f"option tlsCaFile: {error}") from None


class AmqpConnection:
    """A connected, opened AMQP connection with one session, pumped by its owner."""

    def __init__(self, pump: Pump, endpoint: GatewayEndpoint) -> None:
        self._pump = pump
        self.endpoint = endpoint
        self.transport = pump.transport
        self.connection = pump.connection
        self._sasl = self.transport.sasl()
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self._management: tuple[Sender, Receiver] | None = None

    @classmethod
    def open(cls, endpoint: GatewayEndpoint) -> AmqpConnection:
        """Connect and wait for the gateway's OPEN, retrying network errors with back-off.

        Every attempt, and the pauses between them, fit in ``connectTimeoutMs`` x
        ``connectAttempts``; then ``ConnectionError`` names the URL and the last cause.
        """
        context = _tls_context(endpoint)
        started = time.monotonic()
        budget = endpoint.connect_timeout_s * endpoint.connect_attempts
        deadline = started + budget
        pause = BACKOFF_FIRST_S
        attempts = 0
        cause: OSError | None = None
        while attempts < endpoint.connect_attempts:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            attempts += 1
            try:
                return cls._open_once(endpoint, context, min(endpoint.connect_timeout_s, left))
            except OSError as error:
                cause = error
            if attempts < endpoint.connect_attempts:
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                pause = min(pause * 2, BACKOFF_MAX_S)
        elapsed = time.monotonic() - started
        raise ConnectionError(
            f"{endpoint.url}: no connection after {attempts} attempt"
            f"{'s' if attempts != 1 else ''} in {elapsed:.1f} s "
            f"(connectTimeoutMs x connectAttempts = {budget:g} s): {_cause(cause)}"
        ) from cause

    @classmethod
    def _open_once(
        cls, endpoint: GatewayEndpoint, context: ssl.SSLContext | None, timeout: float
    ) -> AmqpConnection:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        tls = None
        if context is not None:
            tls = TlsChannel(context, host=endpoint.host)
            try:
                tls.handshake(sock, timeout)
            except TlsError as error:
                sock.close()
                raise TlsError(f"{endpoint.url}: {error}") from None
            except OSError:
                sock.close()
                raise
        credentials = endpoint.credentials
        pump = Pump.client(
            sock,
            # The gateway shows this id; the pid tells an operator which Spark process holds what.
            container=f"sluicegate-spark-{os.getpid()}-{uuid.uuid4().hex[:12]}",
            hostname=endpoint.host,
            login=None
            if credentials is None
            else (credentials.username, credentials.password.reveal()),
            tls=tls,
        )
        amqp = cls(pump, endpoint)
        try:
            amqp.wait(
                lambda: amqp.connection.state & Endpoint.REMOTE_ACTIVE != 0,
                timeout,
                "AMQP OPEN from the gateway",
            )
        except AuthenticationError as error:
            amqp.close()
            raise AuthenticationError(f"{endpoint.url}: {error}") from None
        except AmqpError as error:
            amqp.close()
            raise ConnectionError(str(error)) from error
        except TimeoutError:
            amqp.close()
            raise
        return amqp

    # -- links --------------------------------------------------------------------------

    def receiver(
        self,
        address: str,
        *,
        settled: bool = False,
        copy: bool = False,
        filters: dict[str, tuple[str, object]] | None = None,
        timeout: float,
    ) -> Receiver:
        """Attach a receiver and wait until the gateway accepts its source."""
        link = self.session.receiver(f"sluicegate-spark-{uuid.uuid4()}")
        link.source.address = address
        if settled:
            link.snd_settle_mode = Link.SND_SETTLED
        else:
            link.snd_settle_mode = Link.SND_UNSETTLED
            link.rcv_settle_mode = Link.RCV_FIRST
        if copy:
            link.source.distribution_mode = Terminus.DIST_MODE_COPY
        if filters:
            _put_filters(link.source.filter, filters)
        link.open()
        self._await_attach(link, timeout)
        if link.remote_source.address is None:
            raise AmqpError(f"{address}: {self._refusal(link)}")
        return link

    def sender(self, address: str, *, timeout: float) -> Sender:
        """Attach a sender with unsettled transfers and wait until the gateway accepts it."""
        link = self.session.sender(f"sluicegate-spark-{uuid.uuid4()}")
        link.target.address = address
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        self._await_attach(link, timeout)
        if link.remote_target.address is None:
            raise AmqpError(f"{address}: {self._refusal(link)}")
        return link

    def _await_attach(self, link: Link, timeout: float) -> None:
        self.wait(lambda: link.state & Endpoint.REMOTE_UNINIT == 0, timeout, "the ATTACH reply")

    def _refusal(self, link: Link) -> str:
        """The DETACH that follows a refused ATTACH carries the reason (AMQP 1.0 §2.6.3)."""
        try:
            self.wait(lambda: link.state & Endpoint.REMOTE_CLOSED != 0, 5.0, "the DETACH")
        except TimeoutError:
            return "attach refused"
        return describe(link.remote_condition, "attach refused")

    def request(self, method: str, path: str, timeout: float) -> Reply:
        """One request to the gateway's management node (RabbitMQ 4's HTTP-over-AMQP API)."""
        if self._management is None:
            name = f"sluicegate-spark-management-{uuid.uuid4()}"
            requests = self.session.sender(name)
            requests.target.address = MANAGEMENT
            replies = self.session.receiver(name)
            replies.source.address = MANAGEMENT
            requests.open()
            replies.open()
            self._await_attach(requests, timeout)
            self._await_attach(replies, timeout)
            self._management = (requests, replies)
        requests, replies = self._management
        self.wait(lambda: requests.credit > 0, timeout, "credit for a management request")
        requests.send(request_message(method, path))
        replies.flow(1)

        def answered() -> bool:
            self.check(replies)
            current = replies.current
            return current is not None and current.readable and not current.partial

        self.wait(answered, timeout, f"the reply to {method} {path}")
        delivery = replies.current
        assert delivery is not None
        message = Message()
        message.decode(replies.recv(delivery.pending) or b"")
        replies.advance()
        delivery.settle()
        return reply_of(message)

    def _login_refusal(self) -> AuthenticationError | None:
        """The refused login, if the SASL exchange ended with one.

        The gateway closes the socket right after its sasl-outcome, and proton turns the outcome
        into a condition only when it next writes; the end of input can come first and look
        like a framing error. So the outcome itself is read too. A ``sys-temp`` outcome is
        transient and left to the connection retries.
        """
        condition = self.transport.condition
        outcome = self._sasl.outcome
        if condition is not None and condition.name == UNAUTHORIZED:
            reason = describe(condition, UNAUTHORIZED)
        elif outcome in _REFUSED:
            reason = f"{UNAUTHORIZED}: SASL outcome {_REFUSED[outcome]}"
        else:
            return None
        credentials = self.endpoint.credentials
        who = "anonymously" if credentials is None else f"as {credentials.username!r}"
        return AuthenticationError(
            f"the gateway refused the login {who} ({reason}): "
            "check options username and password against the gateway's [users]"
        )

    def _closed_error(self) -> AmqpError:
        """Why no more bytes move, from the most specific source."""
        refusal = self._login_refusal()
        if refusal is not None:
            return refusal
        if self._pump.error is not None:
            return AmqpError(f"{self.endpoint.url}: connection lost: {self._pump.error}")
        if self.connection.remote_condition is not None:
            return AmqpError(describe(self.connection.remote_condition, "connection closed"))
        return AmqpError(describe(self.transport.condition, "connection closed by the gateway"))

    def check(self, link: Link) -> None:
        """Raise if the connection or the link has been closed by the gateway or the network."""
        if self.closed:
            raise self._closed_error()
        if self.connection.state & Endpoint.REMOTE_CLOSED:
            raise AmqpError(describe(self.connection.remote_condition, "connection closed"))
        if link.state & Endpoint.REMOTE_CLOSED:
            raise AmqpError(describe(link.remote_condition, "link closed by the gateway"))

    # -- moving bytes -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """No more bytes will move either way."""
        return self._pump.closed or self._pump.eof

    def wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Pump until ``ready()`` holds; ``TimeoutError`` naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.closed:
                raise self._closed_error()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} within {timeout:g} s")
            self._pump.pump(min(left, POLL_S))

    def pump(self, timeout: float) -> bool:
        """Write what proton has, wait up to ``timeout`` for input and feed it to proton.

        Returns whether bytes arrived.
        """
        return self._pump.pump(timeout)

    def flush(self) -> None:
        """Let proton run its timers and hand the socket everything it has encoded."""
        self._pump.flush()

    def await_input(self, timeout: float) -> None:
        """Wait up to ``timeout`` until there is input to act on (none if some is buffered)."""
        self._pump.await_input(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Close politely (the gateway settles what the links left) and drop the socket."""
        try:
            if not self.closed and self.connection.state & Endpoint.LOCAL_ACTIVE:
                self.connection.close()
                try:
                    self.wait(
                        lambda: not self.connection.state & Endpoint.REMOTE_ACTIVE,
                        timeout,
                        "the gateway's CLOSE",
                    )
                except (AmqpError, TimeoutError):
                    return  # closing anyway: the socket goes, the gateway releases all
                self.flush()
        finally:
            self._pump.close()


def _cause(error: OSError | None) -> str:
    """An OS error as one line: its text, without the errno noise when there is text."""
    if error is None:
        return "no attempt made"
    if isinstance(error, TimeoutError) and error.args and isinstance(error.args[0], str):
        return error.args[0]
    return error.strerror or str(error) or type(error).__name__


def _put_filters(data: Data, filters: dict[str, tuple[str, object]]) -> None:
    """A source filter-set: each key maps to a described value (AMQP 1.0 §3.5.8)."""
    data.put_map()
    data.enter()
    for key, (descriptor, value) in filters.items():
        data.put_symbol(key)
        data.put_described()
        data.enter()
        data.put_symbol(descriptor)
        data.put_object(value)
        data.exit()
    data.exit()
