"""A connection's deadlines, decided without a clock: handshake, idle timeout, credential, send.

- ``handshake_timeout`` runs from the accept to the client's OPEN: TLS, SASL, the AMQP header and
  OPEN must all be done by then, whatever bytes the client trickles meanwhile (a client that
  sends the plain AMQP header and nothing more is an anonymous login still owing its OPEN).
- ``idle_timeout`` runs from the last *whole frame* the client sent (proton's count of frames
  decoded), so a client trickling the bytes of a frame it never finishes is idle.

Proton's own idle timeout restarts on any byte read and is checked only when the transport is
ticked, so it fired at up to twice its setting and never for a trickling client; here proton only
announces the timeout in OPEN (it sends our heartbeats at half the client's own) and is told to
enforce nothing once that OPEN is encoded. Each connection has one armed deadline, handed to the
selector through ``selectable.deadline`` (gateway/reading.py); a frame that arrives only moves
the time of the last frame, and an expired idle deadline re-arms itself from that time, so the
timeout fires within its setting plus the selector's wake-up latency, at no cost per frame beyond
one counter read per socket read. While reads are paused (gateway/reading.py) the client's frames
cannot arrive, so the idle timeout restarts when they resume.

A connection whose user logged in with an OAuth 2 token (gateway/oauth2.py) also ends when the
token expires, unless a fresh one came first (``credential``); the armed deadline is the earlier
of that expiry and the idle deadline.

``send_timeout`` (RabbitMQ's ``tcp_listen_options.send_timeout``) bounds how long a client may
read nothing while output waits for it: what proton holds for a socket that takes none stays
counted in the memory budget, and consumers that never read, each holding its writer's bytes,
could hold a blocked worker's publishers' part until every publisher there waited for as long as
they stayed (docs/bounds.md). Whether the client reads is told by the kernel, not by our writes:
a socket's send buffer holds megabytes, and a client reading slowly from it makes the socket
writable again only once a third of it is free. So once output has waited half the timeout
without a write, the bytes the kernel still queues for the socket are looked at (``SIOCOUTQ``,
by the IO layer); if half a timeout later they have not gone down and nothing was written, the
client has read nothing for that long and is dropped: no CLOSE reaches a client that reads
nothing.

The deadlines are a pure state machine: the time and proton's count of decoded frames are
arguments, so tests/unit/gateway/rules/test_timeouts.py drives them through every order of
events without a socket.
"""

from __future__ import annotations

from typing import Literal

Overdue = Literal["handshake", "idle", "credential", "send"]


class Deadlines:
    """One connection's handshake, idle, credential and send deadlines, and the one armed."""

    __slots__ = (
        "credential_expiry",
        "deadline",
        "frames_seen",
        "handshake_deadline",
        "idle_timeout",
        "kernel_queued",
        "last_frame",
        "send_check",
        "send_timeout",
    )

    def __init__(self) -> None:
        # When the OPEN is due (0 once it came or the connection ended before it).
        self.handshake_deadline = 0.0
        # The idle timeout (0: none), when the last whole frame came and the frame count then.
        self.idle_timeout = 0.0
        self.last_frame = 0.0
        self.frames_seen = 0
        # When its user's OAuth 2 token expires (0: never).
        self.credential_expiry = 0.0
        # The send timeout (0: none); while output waits, when the kernel's queue for the
        # socket is next looked at (0: no output waits), and what it held when last looked at
        # (-1: not looked at since the output last moved).
        self.send_timeout = 0.0
        self.send_check = 0.0
        self.kernel_queued = -1
        # The one deadline armed in the selector (0: none).
        self.deadline = 0.0

    def accepted(self, now: float, handshake_timeout: float) -> None:
        """A new connection: it has ``handshake_timeout`` seconds to send its OPEN."""
        self.handshake_deadline = self.deadline = now + handshake_timeout

    def handshake_over(self) -> bool:
        """The OPEN came or the connection ended: whether its handshake was still counted."""
        if not self.handshake_deadline:
            return False
        self.handshake_deadline = 0.0
        return True

    def opened(
        self, now: float, idle_timeout: float, frames: int, send_timeout: float = 0.0
    ) -> None:
        """The client's OPEN came (its handshake is finished, gateway/limits.py ``Handshakes``)
        and ours is encoded: the idle and send timeouts apply from now on; ``frames`` is
        proton's count of frames decoded so far."""
        self.idle_timeout = idle_timeout
        self.send_timeout = send_timeout
        self.last_frame = now
        self.frames_seen = frames
        self._arm(now + idle_timeout if idle_timeout else 0.0)

    def output(self, now: float, waiting: bool) -> None:
        """Whether bytes wait to be written to the socket (``waiting``): the kernel's queue is
        looked at half a send timeout after they began to (:meth:`send_stuck`)."""
        if not waiting:
            self.send_check = 0.0
            self.kernel_queued = -1
        elif not self.send_check and self.send_timeout:
            self.send_check = now + self.send_timeout / 2
            self._arm(self._idle_due())

    def wrote(self, now: float) -> None:
        """Bytes reached the socket: the output moves, and the kernel's queue grew by them.
        The deadline armed stays; when it fires it re-arms from here (:meth:`overdue`)."""
        if self.send_check:
            self.send_check = now + self.send_timeout / 2
            self.kernel_queued = -1

    def send_stuck(self, now: float, kernel_queued: int) -> bool:
        """The send check is due (:meth:`overdue` said ``send``) and the kernel queues
        ``kernel_queued`` bytes for the socket (-1: unknown): whether the client read nothing
        since the last look, half a send timeout ago; otherwise look again as long after."""
        last = self.kernel_queued
        if last < 0 or kernel_queued < 0 or kernel_queued < last:
            self.kernel_queued = kernel_queued
            self.send_check = now + self.send_timeout / 2
            self._arm(self._idle_due())
            return False
        return True

    def _idle_due(self) -> float:
        """When the client is idle if it sends nothing more (0: no idle timeout)."""
        return self.last_frame + self.idle_timeout if self.idle_timeout else 0.0

    def credential(self, now: float, expires_in: float | None) -> None:
        """The connection's credential is valid for ``expires_in`` more seconds (None: for
        ever); a renewal replaces the expiry it had."""
        self.credential_expiry = 0.0 if expires_in is None else now + max(0.0, expires_in)
        self._arm(self._idle_due())

    def _arm(self, due: float) -> None:
        """Arm the earliest of ``due`` (0: none), the credential's expiry (0: none) and the
        send check (0: none)."""
        expiry = self.credential_expiry
        check = self.send_check
        if check:
            expiry = min(expiry, check) if expiry else check
        self.deadline = min(due, expiry) if due and expiry else due or expiry

    def frames_read(self, now: float, frames: int) -> None:
        """Bytes were pushed to proton, which has decoded ``frames`` frames in all: if that
        completed a frame, the client is not idle."""
        if frames != self.frames_seen:
            self.frames_seen = frames
            self.last_frame = now

    def resumed(self, now: float) -> None:
        """Reads resume after a pause: the silence the server imposed does not count."""
        if not self.handshake_deadline and self.idle_timeout:
            self.last_frame = now
            self._arm(now + self.idle_timeout)

    def overdue(self, now: float, reads_paused: bool) -> Overdue | None:
        """Which deadline has passed at ``now``, if any; otherwise re-arm the idle deadline
        (from ``now`` while the server does not read the client, ``reads_paused``)."""
        if self.handshake_deadline:
            return "handshake" if now >= self.handshake_deadline else None
        if self.credential_expiry and now >= self.credential_expiry:
            return "credential"
        if self.send_check and now >= self.send_check:
            return "send"
        timeout = self.idle_timeout
        due = 0.0
        if timeout:
            due = now + timeout if reads_paused else self.last_frame + timeout
            if now >= due:
                return "idle"
        self._arm(due)
        return None
