"""TLS for the connector's hand-driven connections: Python's ``ssl`` over memory BIOs.

:class:`spark.amqp.AmqpConnection` moves bytes between a non-blocking socket and proton's
transport itself, so TLS sits between the two as a pair of memory BIOs, as in the gateway
(``gateway/gate.py``). proton's own TLS layer would also fit, but it cannot check a certificate
issued for an IP address and reports every verification failure as the same "certificate verify
failed"; Python's ``ssl`` checks IP SANs and says why (unknown issuer, hostname mismatch,
expired), which is what a user fixing ``tlsCaFile`` needs to read.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Final

from sluicegate.spark.options import Tls

# TLS 1.2 is the oldest version without known practical attacks, and the gateway's minimum.
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
# Bytes per socket read: a TLS record is at most 16 KiB plus overhead, so four records.
RECV_SIZE: Final = 64 * 1024
# Plaintext taken from the TLS layer per read call; proton takes it in pieces of its capacity.
READ_SIZE: Final = 64 * 1024


class TlsError(RuntimeError):
    """TLS failed: a certificate that does not verify, a peer without TLS, a corrupt record.

    Not an ``OSError``: connections are retried on network errors only, and retrying cannot
    change a certificate.
    """


def client_context(tls: Tls) -> ssl.SSLContext:
    """A client context that verifies the gateway against ``tls.ca_file`` or the system CAs."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = MINIMUM_VERSION
    context.check_hostname = tls.verify_hostname
    if tls.ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.ca_file)
        except (OSError, ssl.SSLError) as error:
            raise TlsError(f"option tlsCaFile: cannot load {tls.ca_file!r}: {error}") from None
    return context


class TlsChannel:
    """One connection's TLS state: ciphertext in from the socket, plaintext out to proton."""

    def __init__(self, context: ssl.SSLContext, host: str) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=host)
        self.eof = False

    def handshake(self, sock: socket.socket, timeout: float) -> None:
        """Complete the handshake on a blocking socket, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._tls.do_handshake()
                sock.sendall(self._outgoing.read())
                return
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as error:
                raise TlsError(f"the gateway's certificate: {error.verify_message}") from None
            except ssl.SSLError as error:
                raise TlsError(f"TLS handshake failed: {error.reason or error}") from None
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
                raise TlsError("the gateway closed the connection during the TLS handshake")
            self._incoming.write(data)

    def encrypt(self, plaintext: bytes) -> None:
        """Take bytes for the gateway; their ciphertext waits in :meth:`ciphertext`."""
        self._tls.write(plaintext)

    def ciphertext(self) -> bytes:
        """The bytes the socket should send next (records, alerts, key updates)."""
        return self._outgoing.read()

    def decrypt(self, ciphertext: bytes) -> bytes:
        """Feed bytes from the socket; return the plaintext they complete (maybe none).

        Raises :class:`TlsError` on a record that does not authenticate.
        """
        self._incoming.write(ciphertext)
        parts: list[bytes] = []
        while True:
            try:
                chunk = self._tls.read(READ_SIZE)
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
