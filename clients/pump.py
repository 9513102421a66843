"""One AMQP connection driven by hand: a socket, proton's ``Transport`` and ``Connection``.

Measured on this 2-core machine, peer to peer with 100-byte bodies: proton's ``Container`` tops
out near 18,000 msg/s with both clients at 100 % CPU, because it builds an ``Event`` with five
wrapper objects for every transfer and every disposition and dispatches it through three handler
layers; ``BlockingConnection`` is slower still, since it waits for each settlement in turn.
Without a collector there are no events: the owner asks its links what arrived and what credit
they have, and a pair of such clients moves over 200,000 msg/s at a fraction of a core each.
proton still does all of AMQP (framing, SASL, sessions, flow, settlement); a :class:`Pump` only
moves bytes between it and the socket, through TLS (``transport/channel.py``) when there is one, the
way proton's own IO layer does. ``sluicegate quiver`` and the Spark connector both drive their
connections with it.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Final

from proton import Connection, Transport

from sluicegate.transport.channel import RECV_SIZE, TLS_OUTPUT_LOW, TlsChannel, TlsError, feed

__all__ = ["Pump"]

# Socket reads fed to proton per pump: a bound, so that a connection that never runs dry still
# lets its owner act on what arrived between reads.
READS_PER_PUMP: Final = 8
# Until proton asks for a timer, look again after this long.
IDLE_TICK_S: Final = 1.0


class Pump:
    """A connected non-blocking socket and the proton transport and connection bound to it."""

    def __init__(
        self,
        sock: socket.socket,
        transport: Transport,
        connection: Connection,
        tls: TlsChannel | None = None,
    ) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames are small and paced
        self.sock = sock
        self.transport = transport
        self.connection = connection
        self._tls = tls
        # Ciphertext the socket did not take yet, and plaintext proton had no room for yet.
        self._tls_out = bytearray()
        self._tls_in = bytearray()
        transport.bind(connection)
        self.blocked = False  # the socket took less than there was to write
        self.eof = False  # the peer closed its end of the socket
        self.error: str | None = None  # the socket or TLS failed
        self.head_closed = False  # proton has written its last byte
        self.written = 0  # bytes the socket took, to tell a slow close from a stuck one
        self._tick_due = 0.0  # proton's next timer deadline (monotonic)

    @classmethod
    def client(
        cls,
        sock: socket.socket,
        container: str,
        hostname: str,
        login: tuple[str, str] | None = None,
        tls: TlsChannel | None = None,
    ) -> Pump:
        """The client end of a connection: SASL PLAIN with ``login``, else ANONYMOUS."""
        transport = Transport(Transport.CLIENT)
        sasl = transport.sasl()
        connection = Connection()
        if login is None:
            sasl.allowed_mechs("ANONYMOUS")
        else:
            sasl.allowed_mechs("PLAIN")
            # proton refuses PLAIN outside its own TLS layer; ours is invisible to it, and
            # without TLS the caller chose plain TCP.
            sasl.allow_insecure_mechs = True
            connection.user, connection.password = login
        connection.container = container
        connection.hostname = hostname
        return cls(sock, transport, connection, tls)

    @classmethod
    def connect(cls, host: str, port: int, container: str, timeout: float) -> Pump:
        """A plain TCP client logging in anonymously; ``OSError`` if the socket cannot open."""
        return cls.client(socket.create_connection((host, port), timeout=timeout), container, host)

    @classmethod
    def server(cls, sock: socket.socket, container: str) -> Pump:
        """The server end of an accepted connection (SASL is auto-detected)."""
        connection = Connection()
        connection.container = container
        return cls(sock, Transport(Transport.SERVER), connection)

    @property
    def closed(self) -> bool:
        """No more bytes will move either way."""
        return bool(self.transport.closed) or self.error is not None

    def pump(self, timeout: float) -> bool:
        """Write what there is, wait up to ``timeout`` for input and feed it to proton.

        Returns whether input arrived. Waits only on what can move: input when proton has room
        for it, output when the socket took less than there was.
        """
        if self.closed:
            time.sleep(max(0.0, timeout))
            return False
        self.flush()
        if self._tls_in:
            return feed(self.transport, self._tls_in)
        readable = self.transport.capacity() > 0 and not self.eof
        if not readable and not self.blocked:
            time.sleep(max(0.0, timeout))
            return False
        try:
            ready_in, ready_out, _ = select.select(
                [self.sock] if readable else [],
                [self.sock] if self.blocked else [],
                [],
                max(0.0, timeout),
            )
        except OSError as error:
            self.fail(error)
            return False
        got = self.read() if ready_in else False
        if ready_out:
            self.flush()
        return got

    def await_input(self, timeout: float) -> None:
        """Wait up to ``timeout`` until there is input to act on, without touching proton.

        For an owner that pumps under a lock: it waits here outside the lock.
        """
        if self._tls_in or self.closed or self.eof:
            return
        try:
            select.select([self.sock], [], [], max(0.0, timeout))
        except OSError as error:
            self.fail(error)

    def tick(self) -> None:
        """Let proton send heartbeats and notice an idle peer, when due."""
        now = time.monotonic()
        if now >= self._tick_due:
            due = self.transport.tick(now)
            self._tick_due = due if due > 0 else now + IDLE_TICK_S

    def flush(self) -> None:
        """Run proton's timers and hand the socket everything it takes of proton's output."""
        if self.closed:
            return
        self.tick()
        if self._tls is not None:
            self._flush_tls(self._tls)
            return
        transport = self.transport
        pending = transport.pending()
        self.blocked = False
        while pending > 0:
            data = transport.peek(pending)
            if not data:
                return
            written = self._send(data)
            transport.pop(written)
            if written < len(data):
                self.blocked = True
                return
            pending = transport.pending()
        if pending < 0:
            self._close_head()

    def _flush_tls(self, tls: TlsChannel) -> None:
        """Encrypt proton's output while little ciphertext waits; send what the socket takes."""
        transport = self.transport
        out = self._tls_out
        pending = transport.pending()
        while len(out) < TLS_OUTPUT_LOW and pending > 0:
            data = transport.peek(min(pending, TLS_OUTPUT_LOW))
            if not data:
                break
            tls.encrypt(data)
            transport.pop(len(data))
            out += tls.ciphertext()
            pending = transport.pending()
        out += tls.ciphertext()
        self.blocked = False
        if out:
            written = self._send(out)
            del out[:written]
            self.blocked = bool(out)
        if pending < 0 and not out:
            self._close_head()

    def _send(self, data: bytes | bytearray) -> int:
        """What the socket took of ``data`` (0 when it takes nothing now or failed)."""
        try:
            written = self.sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as error:
            self.fail(error)
            return 0
        self.written += written
        return written

    def _close_head(self) -> None:
        """proton closed its output: tell the peer, once."""
        if self.head_closed:
            return
        self.head_closed = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return  # the peer is gone already

    def read(self) -> bool:
        """Move what the socket has into proton (which decodes it at once); whether any came."""
        if self._tls is not None:
            return self._read_tls(self._tls)
        transport = self.transport
        got = False
        for _ in range(READS_PER_PUMP):
            capacity = transport.capacity()
            if capacity <= 0:
                break
            data = self._recv(capacity)
            if not data:
                if data is not None:
                    self._end_of_input()
                break
            transport.push(data)
            got = True
        return got

    def _recv(self, size: int) -> bytes | None:
        """Bytes from the socket: empty at its end, None if there are none now or it failed."""
        try:
            return self.sock.recv(size)
        except BlockingIOError:
            return None
        except OSError as error:
            self.fail(error)
            return None

    def _read_tls(self, tls: TlsChannel) -> bool:
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
            self._tls_out += tls.ciphertext()  # the handshake's or an alert's answer
            if tls.eof or len(self._tls_in) >= RECV_SIZE:
                break
        # The plaintext before the end goes to proton first: it may be the peer's last word.
        got = feed(self.transport, self._tls_in)
        if (ended or tls.eof) and not self._tls_in:
            self._end_of_input()
        return got

    def _end_of_input(self) -> None:
        self.eof = True
        self.transport.close_tail()

    def fail(self, error: OSError) -> None:
        """Record a socket failure; proton is told its input and output are gone."""
        self.error = error.strerror or str(error)
        self.transport.close_tail()
        self.transport.close_head()

    def close(self) -> None:
        """Release the socket."""
        self.sock.close()
