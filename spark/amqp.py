"""One AMQP 1.0 client connection driven by hand: a socket, proton's ``Transport`` and endpoints.

proton's ``Container`` builds an event object graph for every transfer and disposition and tops
out near 18,000 msg/s on this machine; ``BlockingConnection`` is slower still, since it waits for
each settlement in turn. Spark wants a window of 100,000 messages moved as fast as the gateway
sends them, so this module feeds the socket's bytes to proton's transport itself and asks the
links what arrived, with no collector and no events. proton still does all of AMQP: framing,
SASL, sessions, flow and settlement.

Opening a connection is retried with tenacity (the gateway may be restarting); a refused login,
a certificate that does not verify and a refused link are not (each carries the gateway's or the
TLS layer's verdict, which retrying cannot change). With ``username``/``password`` the login is
SASL PLAIN, otherwise ANONYMOUS; with TLS (``spark.tls``) the same bytes pass through Python's
``ssl`` between the socket and proton.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import time
import uuid
from collections.abc import Callable
from typing import Final

from proton import (
    SASL,
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

from sluicegate.spark.options import Endpoint as GatewayEndpoint
from sluicegate.spark.tls import RECV_SIZE, TlsChannel, TlsError, client_context

# The condition proton gives a transport whose SASL outcome was not ``ok`` (AMQP 1.0 §5.3.3.6).
UNAUTHORIZED: Final = "amqp:unauthorized-access"
# Ciphertext waiting for the socket before proton's output is left with proton: the same bound
# as the gateway's (gateway/gate.py), so a slow network does not pile encrypted bytes up here.
TLS_OUTPUT_LOW: Final = 64 * 1024
# sasl-code values (AMQP 1.0 §5.3.3.6) that refuse a login for good.
_REFUSED: Final = {SASL.AUTH: "auth", SASL.SYS: "sys", SASL.PERM: "sys-perm"}
# Between two looks at the socket: short enough to answer FLOWs and heartbeats promptly, long
# enough that an idle connection costs nothing.
POLL_S: Final = 0.05
# Socket reads fed to proton per pump: a bound, so that a connection that never runs dry still
# lets its owner act on what arrived (and other threads take the lock) between reads.
READS_PER_PUMP: Final = 8


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


class AmqpConnection:
    """A connected, opened AMQP connection with one session, pumped by its owner."""

    def __init__(
        self, sock: socket.socket, endpoint: GatewayEndpoint, tls: TlsChannel | None = None
    ) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.endpoint = endpoint
        self._tls = tls
        # Ciphertext the socket did not take yet, and plaintext proton had no room for yet.
        self._tls_out = bytearray()
        self._tls_in = bytearray()
        self.transport = Transport(Transport.CLIENT)
        sasl = self._sasl = self.transport.sasl()
        self.connection = Connection()
        credentials = endpoint.credentials
        if credentials is None:
            sasl.allowed_mechs("ANONYMOUS")
        else:
            sasl.allowed_mechs("PLAIN")
            # proton refuses PLAIN outside its own TLS layer; ours is invisible to it, and
            # without TLS the user chose plain TCP (docs/spark.md says what that exposes).
            sasl.allow_insecure_mechs = True
            self.connection.user = credentials.username
            self.connection.password = credentials.password.reveal()
        # The gateway shows this id; the pid tells an operator which Spark process holds what.
        self.connection.container = f"sluicegate-spark-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.connection.hostname = endpoint.host
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
        context = None if endpoint.tls is None else client_context(endpoint.tls)
        retrying = Retrying(
            stop=stop_after_attempt(endpoint.connect_attempts),
            wait=wait_exponential(multiplier=0.25, max=5),
            retry=retry_if_exception_type(OSError),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return cls._open_once(endpoint, context)
        raise AssertionError("unreachable: tenacity reraises the last error")

    @classmethod
    def _open_once(
        cls, endpoint: GatewayEndpoint, context: ssl.SSLContext | None
    ) -> AmqpConnection:
        sock = socket.create_connection(
            (endpoint.host, endpoint.port), timeout=endpoint.connect_timeout_s
        )
        tls = None
        if context is not None:
            tls = TlsChannel(context, endpoint.host)
            try:
                tls.handshake(sock, endpoint.connect_timeout_s)
            except TlsError as error:
                sock.close()
                raise TlsError(f"{endpoint.url}: {error}") from None
            except OSError:
                sock.close()
                raise
        amqp = cls(sock, endpoint, tls)
        try:
            amqp.wait(
                lambda: amqp.connection.state & Endpoint.REMOTE_ACTIVE != 0,
                endpoint.connect_timeout_s,
                "the gateway's OPEN",
            )
        except AuthenticationError as error:
            amqp.close()
            raise AuthenticationError(f"{endpoint.url}: {error}") from None
        except (AmqpError, TimeoutError) as error:
            amqp.close()
            raise ConnectionError(f"{endpoint.url}: {error}") from error
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
        if self.error is not None:
            return AmqpError(f"connection lost: {self.error}")
        if self.connection.remote_condition is not None:
            return AmqpError(describe(self.connection.remote_condition, "connection closed"))
        return AmqpError(describe(self.transport.condition, "connection closed by the gateway"))

    def check(self, link: Link) -> None:
        """Raise if the connection or the link has been closed by the gateway or the network."""
        refusal = self._login_refusal()
        if refusal is not None:
            raise refusal
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
                raise self._closed_error()
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
        if self._tls is not None:
            self._flush_tls(self._tls)
            return
        transport = self.transport
        pending = transport.pending()
        while pending > 0:
            data = transport.peek(pending)
            if not data:
                return
            written = self._send(data)
            if written is None:
                return
            transport.pop(written)
            if written < len(data):
                return
            pending = transport.pending()

    def _flush_tls(self, tls: TlsChannel) -> None:
        """Encrypt proton's output while little ciphertext waits; send what the socket takes."""
        transport = self.transport
        out = self._tls_out
        while len(out) < TLS_OUTPUT_LOW and (pending := transport.pending()) > 0:
            data = transport.peek(pending)
            if not data:
                break
            tls.encrypt(data)
            transport.pop(len(data))
            out += tls.ciphertext()
        out += tls.ciphertext()
        while out:
            written = self._send(out)
            if not written:
                return
            del out[:written]

    def _send(self, data: bytes | bytearray) -> int | None:
        """What the socket took of ``data``; None when it takes nothing now or failed."""
        try:
            return self.sock.send(data)
        except BlockingIOError:
            return None
        except OSError as error:
            self._fail(error)
            return None

    @property
    def _output_waiting(self) -> bool:
        return self.transport.pending() > 0 or bool(self._tls_out)

    def await_input(self, timeout: float) -> None:
        """Wait up to ``timeout`` until there is input to act on (none if some is buffered)."""
        if self._tls_in or self.closed:
            return
        try:
            select.select([self.sock], [], [], timeout)
        except OSError as error:
            self._fail(error)

    def receive(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for bytes and feed them to proton; whether any came."""
        if self.closed:
            time.sleep(timeout)
            return False
        if self._tls_in:
            return self._push_plaintext()
        try:
            readable, writable, _ = select.select(
                [self.sock], [self.sock] if self._output_waiting else [], [], timeout
            )
        except OSError as error:
            self._fail(error)
            return False
        if writable:
            self.flush()
        if not readable:
            return False
        if self._tls is not None:
            return self._receive_tls(self._tls)
        got = False
        for _ in range(READS_PER_PUMP):
            capacity = self.transport.capacity()
            if capacity <= 0:
                return got
            data = self._recv(capacity)
            if not data:
                if data is not None:
                    self._end_of_input()
                return got
            self.transport.push(data)
            got = True
        return got

    def _recv(self, size: int) -> bytes | None:
        """Bytes from the socket: empty at its end, None if there are none now or it failed."""
        try:
            return self.sock.recv(size)
        except BlockingIOError:
            return None
        except OSError as error:
            self._fail(error)
            return None

    def _end_of_input(self) -> None:
        self.eof = True
        self.transport.close_tail()

    def _receive_tls(self, tls: TlsChannel) -> bool:
        ended = False
        for _ in range(READS_PER_PUMP):
            data = self._recv(RECV_SIZE)
            if not data:
                ended = data is not None
                break
            try:
                self._tls_in += tls.decrypt(data)
            except TlsError as error:
                self.error = str(error)
                self.transport.close_tail()
                self.transport.close_head()
                return False
            if tls.eof or len(self._tls_in) >= RECV_SIZE:
                break
        # The plaintext before the end goes to proton first: it may be the gateway's last word.
        got = self._push_plaintext()
        if (ended or tls.eof) and not self._tls_in:
            self._end_of_input()
        return got

    def _push_plaintext(self) -> bool:
        """Give proton as much of the decrypted input as it has room for."""
        plaintext = self._tls_in
        pushed = False
        while plaintext:
            capacity = self.transport.capacity()
            if capacity <= 0:
                break
            piece = bytes(plaintext[:capacity])
            self.transport.push(piece)
            del plaintext[: len(piece)]
            pushed = True
        return pushed

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
