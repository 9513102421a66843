"""One AMQP 1.0 client connection driven by hand: a socket, proton's ``Transport`` and endpoints.

proton's ``Container`` builds an event object graph for every transfer and disposition and tops
out near 18,000 msg/s on this machine; ``BlockingConnection`` is slower still, since it waits for
each settlement in turn. Spark wants a window of 100,000 messages moved as fast as the gateway
sends them, so this module feeds the socket's bytes to proton's transport itself and asks the
links what arrived, with no collector and no events. proton still does all of AMQP: framing,
SASL, sessions, flow and settlement.

Opening a connection is retried with tenacity (the gateway may be restarting); a refused link is
not (it carries the gateway's error condition, which retrying cannot change).
"""

from __future__ import annotations

import os
import select
import socket
import time
import uuid
from collections.abc import Callable
from typing import Final

from proton import (
    Condition,
    Connection,
    Data,
    Endpoint,
    Link,
    Receiver,
    Sender,
    Terminus,
    Transport,
)
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from spark.options import Endpoint as GatewayEndpoint

SASL_MECHANISMS: Final = "ANONYMOUS"
# Between two looks at the socket: short enough to answer FLOWs and heartbeats promptly, long
# enough that an idle connection costs nothing.
POLL_S: Final = 0.05
# Socket reads fed to proton per pump: a bound, so that a connection that never runs dry still
# lets its owner act on what arrived (and other threads take the lock) between reads.
READS_PER_PUMP: Final = 8


class AmqpError(RuntimeError):
    """The gateway refused or closed something; the message carries its error condition."""


def describe(condition: Condition | None, default: str) -> str:
    """One line from an AMQP error condition."""
    if condition is None:
        return default
    if condition.description:
        return f"{condition.name}: {condition.description}"
    return str(condition.name)


class AmqpConnection:
    """A connected, opened AMQP connection with one session, pumped by its owner."""

    def __init__(self, sock: socket.socket, host: str) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.transport = Transport(Transport.CLIENT)
        self.transport.sasl().allowed_mechs(SASL_MECHANISMS)
        self.connection = Connection()
        # The gateway shows this id; the pid tells an operator which Spark process holds what.
        self.connection.container = f"sluicegate-spark-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.connection.hostname = host
        self.transport.bind(self.connection)
        self.connection.open()
        self.session = self.connection.session()
        self.session.open()
        self.eof = False
        self.error: str | None = None
        self._tick_due = 0.0

    @classmethod
    def open(cls, endpoint: GatewayEndpoint) -> AmqpConnection:
        """Connect and wait for the gateway's OPEN, retrying with exponential back-off."""
        retrying = Retrying(
            stop=stop_after_attempt(endpoint.connect_attempts),
            wait=wait_exponential(multiplier=0.25, max=5),
            retry=retry_if_exception_type(OSError),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return cls._open_once(endpoint)
        raise AssertionError("unreachable: tenacity reraises the last error")

    @classmethod
    def _open_once(cls, endpoint: GatewayEndpoint) -> AmqpConnection:
        sock = socket.create_connection(
            (endpoint.host, endpoint.port), timeout=endpoint.connect_timeout_s
        )
        amqp = cls(sock, endpoint.host)
        try:
            amqp.wait(
                lambda: amqp.connection.state & Endpoint.REMOTE_ACTIVE != 0,
                endpoint.connect_timeout_s,
                "the gateway's OPEN",
            )
        except (AmqpError, TimeoutError) as error:
            amqp.close()
            raise ConnectionError(f"amqp://{endpoint.host}:{endpoint.port}: {error}") from error
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

    def check(self, link: Link) -> None:
        """Raise if the connection or the link has been closed by the gateway or the network."""
        if self.error is not None:
            raise AmqpError(f"connection lost: {self.error}")
        if self.connection.state & Endpoint.REMOTE_CLOSED:
            raise AmqpError(describe(self.connection.remote_condition, "connection closed"))
        if link.state & Endpoint.REMOTE_CLOSED:
            raise AmqpError(describe(link.remote_condition, "link closed by the gateway"))
        if self.eof or self.transport.closed:
            raise AmqpError("connection closed by the gateway")

    # -- moving bytes -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """No more bytes will move either way."""
        return bool(self.transport.closed) or self.error is not None or self.eof

    def wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Pump until ``ready()`` holds; ``TimeoutError`` naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.closed:
                raise AmqpError(
                    self.error or describe(self.connection.remote_condition, "connection closed")
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} within {timeout:g} s")
            self.pump(min(left, POLL_S))

    def pump(self, timeout: float) -> bool:
        """Write what proton has, wait up to ``timeout`` for input and feed it to proton.

        Returns whether bytes arrived.
        """
        self.flush()
        return self.receive(timeout)

    def flush(self) -> None:
        """Let proton run its timers and hand the socket everything it has encoded."""
        if self.closed:
            return
        now = time.monotonic()
        if now >= self._tick_due:
            due = self.transport.tick(now)
            self._tick_due = due if due > 0 else now + 1.0
        transport = self.transport
        pending = transport.pending()
        while pending > 0:
            data = transport.peek(pending)
            if not data:
                return
            try:
                written = self.sock.send(data)
            except BlockingIOError:
                return
            except OSError as error:
                self._fail(error)
                return
            transport.pop(written)
            if written < len(data):
                return
            pending = transport.pending()

    def receive(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for bytes and feed them to proton; whether any came."""
        if self.closed:
            time.sleep(timeout)
            return False
        blocked = self.transport.pending() > 0
        try:
            readable, writable, _ = select.select(
                [self.sock], [self.sock] if blocked else [], [], timeout
            )
        except OSError as error:
            self._fail(error)
            return False
        if writable:
            self.flush()
        if not readable:
            return False
        got = False
        for _ in range(READS_PER_PUMP):
            capacity = self.transport.capacity()
            if capacity <= 0:
                return got
            try:
                data = self.sock.recv(capacity)
            except BlockingIOError:
                return got
            except OSError as error:
                self._fail(error)
                return got
            if not data:
                self.eof = True
                self.transport.close_tail()
                return got
            self.transport.push(data)
            got = True
        return got

    def _fail(self, error: OSError) -> None:
        self.error = error.strerror or str(error)
        self.transport.close_tail()
        self.transport.close_head()

    def close(self, timeout: float = 2.0) -> None:
        """Close politely (the gateway releases what the links held) and drop the socket."""
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
            self.sock.close()


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
