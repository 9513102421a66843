"""The bytes between a socket and proton's transport, as the server and the clients both move them:
TLS over a pair of memory BIOs (Python's ``ssl``), and input given to proton within its capacity.

Both ends of sluicegate move bytes between a socket and proton themselves: the gateway, so that
its SASL layer sees plaintext (``gateway/gate.py``), and the clients' hand-driven connections
(``clients/pump.py``), which have no proton IO layer to do it. So TLS is one object that takes
ciphertext from the socket and gives plaintext, and takes plaintext and gives ciphertext, never
touching a socket itself. proton's own TLS layer would also fit a client, but it cannot check a
certificate issued for an IP address and reports every verification failure as the same
"certificate verify failed"; Python's ``ssl`` checks IP SANs and says why (unknown issuer,
hostname mismatch, expired), which is what a user fixing a CA file needs to read.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Final

from proton import Transport

# TLS 1.2 is the oldest version without known practical attacks, and the gateway's minimum.
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
# Bytes per socket read: a TLS record is at most 16 KiB plus overhead, so four records.
RECV_SIZE: Final = 64 * 1024
# Ciphertext waiting for the socket before proton's output is left with proton: the gateway's
# bound too (gateway/gate.py), so a slow network does not pile encrypted bytes up in memory.
TLS_OUTPUT_LOW: Final = 64 * 1024


class TlsError(RuntimeError):
    """TLS failed: a certificate that does not verify, a peer without TLS, a corrupt record.

    Not an ``OSError``: clients retry connections on network errors only, and retrying cannot
    change a certificate.
    """


def client_context(ca_file: str | None, verify_hostname: bool) -> ssl.SSLContext:
    """A client context that verifies the server against ``ca_file`` or the system's CAs."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = MINIMUM_VERSION
    context.check_hostname = verify_hostname
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as error:
            raise TlsError(f"cannot load the CA file {ca_file!r}: {error}") from None
    return context


class TlsChannel:
    """One connection's TLS state: ciphertext in from the socket, plaintext out, and back.

    The handshake runs as ciphertext arrives (:meth:`decrypt`) or, for a client that wants to
    know at once whether the server verifies, on a blocking socket (:meth:`handshake`).
    """

    __slots__ = ("_incoming", "_outgoing", "_tls", "eof", "handshake_done")

    def __init__(
        self, context: ssl.SSLContext, *, server_side: bool = False, host: str | None = None
    ) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=host
        )
        self.handshake_done = False
        # The peer closed TLS (close_notify) or its end of the socket.
        self.eof = False

    def handshake(self, sock: socket.socket, timeout: float) -> None:
        """Complete the handshake on a blocking socket, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self._step():
            sock.sendall(self._outgoing.read())
            left = deadline - time.monotonic()
            if left <= 0:
                raise TlsError(f"no TLS handshake within {timeout:g} s")
            sock.settimeout(left)
            try:
                data = sock.recv(RECV_SIZE)
            except TimeoutError:
                raise TlsError(f"no TLS handshake within {timeout:g} s") from None
            if not data:
                raise TlsError("the peer closed the connection during the TLS handshake")
            self._incoming.write(data)
        sock.sendall(self._outgoing.read())

    def _step(self) -> bool:
        """Advance the handshake with what has arrived; whether it is complete."""
        if self.handshake_done:
            return True
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLCertVerificationError as error:
            raise TlsError(f"the peer's certificate: {error.verify_message}") from None
        except ssl.SSLError as error:
            raise TlsError(f"TLS handshake failed: {error.reason or error}") from None
        self.handshake_done = True
        return True

    def peer_certificate(self) -> dict[str, object] | None:
        """The peer's certificate as :meth:`ssl.SSLObject.getpeercert` gives it, if the peer
        sent one that the context verified; None otherwise."""
        certificate = self._tls.getpeercert() if self.handshake_done else None
        return dict(certificate) if certificate else None

    def encrypt(self, plaintext: bytes | bytearray | memoryview) -> None:
        """Take bytes for the peer; their ciphertext waits in :meth:`ciphertext`."""
        self._tls.write(plaintext)

    def ciphertext(self) -> bytes:
        """The bytes the socket should send next (handshake, records, alerts)."""
        return self._outgoing.read()

    def decrypt(self, ciphertext: bytes) -> bytes:
        """Feed bytes from the socket; return the plaintext they complete (maybe none).

        Drives the handshake first. Raises :class:`TlsError` on a failed handshake or a
        record that does not authenticate; answers to the peer wait in :meth:`ciphertext`.
        """
        self._incoming.write(ciphertext)
        if not self._step():
            return b""
        parts: list[bytes] = []
        while True:
            try:
                chunk = self._tls.read(RECV_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.eof = True
                break
            except ssl.SSLError as error:
                raise TlsError(f"TLS failure: {error.reason or error}") from None
            if not chunk:
                self.eof = True
                break
            parts.append(chunk)
        return b"".join(parts)


def feed(transport: Transport, pending: bytearray) -> bool:
    """Give proton as much of ``pending`` as it has room for; whether it took any.

    proton consumes complete frames as they are pushed, so its capacity comes back at once;
    only a transport with no room at all leaves the rest in ``pending`` for later. A transport
    whose input is closed takes nothing more, and ``pending`` is dropped.
    """
    pushed = False
    while pending:
        capacity = transport.capacity()
        if capacity <= 0:
            if capacity < 0:
                pending.clear()
            break
        piece = bytes(pending[:capacity])
        transport.push(piece)
        del pending[: len(piece)]
        pushed = True
    return pushed
