"""The bytes between a client's socket and proton's transport: TLS, then sluicegate's SASL.

proton's transport could do TLS itself, but then our SASL layer (gateway/sasl.py) would see only
ciphertext. So TLS is Python's ``ssl`` over memory BIOs (``transport/channel.py``), and the
stack of a connection is

    socket  <->  TLS (amqps listener only)  <->  SASL (until its outcome)  <->  proton transport

A plain connection leaves the gate as soon as SASL is done and its outcome is written: from then
on the reactor's IO handler reads and writes it as proton does, at no extra cost. A TLS
connection keeps the gate for its lifetime. Ciphertext waiting for the socket is bounded: proton's
output is taken only while less than :data:`TLS_OUTPUT_LOW` bytes wait, so proton keeps the rest
and the writer ledger still counts only what left.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Final

from proton import Transport

from sluicegate.gateway import reading
from sluicegate.gateway.feeding import feed, output, taken
from sluicegate.gateway.login import LoginQueue, Ticket
from sluicegate.gateway.proton.internals import Selectable, reactor_now, transport_of
from sluicegate.gateway.rare_warning import CLIENT_BURST, RareWarning
from sluicegate.gateway.rules.auth import User
from sluicegate.gateway.sasl import Phase, SaslServer, Step
from sluicegate.gateway.state import ConnectionState
from sluicegate.gateway.tls import certificate_subject
from sluicegate.transport.channel import TLS_OUTPUT_LOW, TlsChannel, TlsError

log = logging.getLogger("sluicegate.gate")

# While its password is checked a client is still read, so that one that leaves is seen to
# leave and its check dropped; what it sends meanwhile (its AMQP header and first frames) is
# held for proton up to this much, and the socket is not read beyond it.
HELD_WHILE_VERIFYING: Final = 64 * 1024

_busy = RareWarning("login refused, too many password checks waiting")
# Lines each refused client would write (gateway/rare_warning.py).
_tls_failed = RareWarning("TLS failed", burst=CLIENT_BURST, level=logging.INFO, logger=log)
_refused = RareWarning("login refused", burst=CLIENT_BURST, logger=log)


def peer_subject(
    tls: ssl.SSLContext | None, channel: TlsChannel | None
) -> Callable[[], str | None] | None:
    """What SASL EXTERNAL reads: the subject of the client's verified certificate, if it sent
    one; None where the listener verifies no client certificates."""
    if channel is None or tls is None or tls.verify_mode == ssl.CERT_NONE:
        return None

    def subject() -> str | None:
        certificate = channel.peer_certificate()
        return None if certificate is None else certificate_subject(certificate)

    return subject


class Gate:
    """One connection's TLS and SASL state, and the bytes waiting for the socket."""

    __slots__ = (
        "_address",
        "_logins",
        "_ticket",
        "_tls",
        "closing",
        "output",
        "received",
        "sasl",
        "state",
    )

    def __init__(
        self,
        state: ConnectionState,
        sasl: SaslServer,
        logins: LoginQueue,
        tls: TlsChannel | None,
        address: str,
    ) -> None:
        self.state = state
        self.sasl = sasl
        # Checks a PLAIN password off the reactor thread (gateway/login.py); the check under
        # way, and the client's address, which may have only so many checks waiting.
        self._logins = logins
        self._ticket: Ticket | None = None
        self._address = address
        self.output = bytearray()
        # Set once the connection must end as soon as ``output`` is written.
        self.closing = False
        self._tls = tls
        # Bytes the last read took from the socket (the memory budget charges them).
        self.received = 0

    @property
    def verifying(self) -> bool:
        """Whether a password check is under way."""
        return self.sasl.phase is Phase.VERIFYING

    @property
    def readable(self) -> bool:
        """Whether the socket may be read: during a check, only up to a bound."""
        return not self.verifying or self.sasl.held < HELD_WHILE_VERIFYING

    def abandon(self) -> None:
        """The connection is ending: a password check not started yet is dropped."""
        if self._ticket is not None:
            self._ticket.cancel()
            self._ticket = None

    @property
    def reads_ahead(self) -> bool:
        """Whether a held connection may be read ahead through this gate (gateway/reading.py):
        once logged in, and not closing."""
        return self.sasl.phase is Phase.DONE and not self.closing

    @property
    def removable(self) -> bool:
        """Whether proton can have the socket directly from now on."""
        return self._tls is None and self.sasl.phase is Phase.DONE and not self.output

    def read(self, selectable: Selectable, transport: Transport | None, size: int) -> bool:
        """Read up to ``size`` bytes from the socket once and pass on what proton may have;
        False at EOF or on an error.

        The plaintext passed on is at most ``size`` bytes plus the rest of a TLS record begun
        by the previous read, so the reactor's bounds per read hold through TLS as well
        (gateway/proton/io_layer.py).
        """
        if self.state.backlog and transport is not None:
            feed(self.state, transport, b"")
        self.received = 0
        try:
            data: bytes = selectable.recv(size)
        except BlockingIOError:
            return True
        except OSError as error:
            log.debug("recv failed: %r", error)
            return False
        if not data:
            return False
        self.received = len(data)
        if self._tls is not None:
            try:
                data = self._tls.decrypt(data)
            except TlsError as error:
                _tls_failed.happened(reactor_now(self.state.selectable), str(error))
                return False
            finally:
                self.output += self._tls.ciphertext()
        self._apply(self.sasl.feed(data), transport)
        return True

    def _apply(self, step: Step, transport: Transport | None, *, logged: bool = False) -> None:
        if step.output:
            self._queue(step.output)
        if step.close:
            if not logged:
                _refused.happened(reactor_now(self.state.selectable), str(self.sasl.failure))
            self.closing = True
        user = self.sasl.user
        if user is not None and self.state.principal.user is None:
            self.state.logged_in(user)  # before proton sees the frames that came meanwhile
        if step.passthrough and transport is not None:
            if self.state.reads_paused:
                # Read ahead while held, not for proton yet (wire/held_frames.py).
                self.state.held.data += step.passthrough
            else:
                feed(self.state, transport, step.passthrough)
        if step.verify is not None:
            name, password = step.verify
            self._ticket = self._logins.submit(name, password, self._address, self._verified)
            if self._ticket is None:
                _busy.happened(reactor_now(self.state.selectable), f"from {self._address}")
                self._apply(self.sasl.busy(), transport, logged=True)

    def _verified(self, user: User | None) -> None:
        """The password check's verdict, on the reactor thread."""
        self._ticket = None
        state = self.state
        selectable = state.selectable
        if self.closing or selectable.is_terminal or transport_of(selectable) is None:
            return  # dropped meanwhile (handshake timeout, shutdown)
        self._apply(self.sasl.verified(user), state.transport)
        reading.update(state.transport, selectable, reactor_now(selectable))

    def _queue(self, plain: bytes) -> None:
        if self._tls is None:
            self.output += plain
        else:
            self._tls.encrypt(plain)
            self.output += self._tls.ciphertext()

    def write(self, selectable: Selectable, transport: Transport | None) -> int:
        """Write what waits; returns how many bytes of proton's output were taken.

        On a TLS connection proton's output is encrypted into ``output`` first; on a plain one
        only our SASL bytes pass here, before proton has written anything.
        """
        count = 0
        if (
            self._tls is not None
            and self._tls.handshake_done
            and transport is not None
            and len(self.output) < TLS_OUTPUT_LOW
        ):
            # A bounded chunk at a time: proton keeps the rest, counted as not yet written.
            chunk = min(transport.pending(), TLS_OUTPUT_LOW)
            if chunk > 0:
                data = output(self.state, transport, chunk)
                self._queue(data)
                taken(self.state, transport, len(data))
                count = len(data)
        if self.output:
            try:
                sent: int = selectable.send(self.output)
            except BlockingIOError:
                sent = 0
            except OSError as error:
                log.debug("send failed: %r", error)
                self.output.clear()
                self.closing = True
                return count
            del self.output[:sent]
        return count

    @property
    def wants_write(self) -> bool:
        """Whether the socket must be watched for writing on the gate's behalf."""
        return bool(self.output)
