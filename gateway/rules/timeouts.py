"""A connection's deadlines, decided without a clock: handshake, idle timeout, credential.

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

The deadlines are a pure state machine: the time and proton's count of decoded frames are
arguments, so tests/unit/gateway/rules/test_timeouts.py drives them through every order of
events without a socket.
"""

from __future__ import annotations

from typing import Literal

Overdue = Literal["handshake", "idle", "credential"]


class Deadlines:
    """One connection's handshake, idle and credential deadlines, and the one armed."""

    __slots__ = (
        "credential_expiry",
        "deadline",
        "frames_seen",
        "handshake_deadline",
        "idle_timeout",
        "last_frame",
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

    def opened(self, now: float, idle_timeout: float, frames: int) -> None:
        """The client's OPEN came (its handshake is finished, gateway/limits.py ``Handshakes``)
        and ours is encoded: the idle timeout applies from now on; ``frames`` is proton's
        count of frames decoded so far."""
        self.idle_timeout = idle_timeout
        self.last_frame = now
        self.frames_seen = frames
        self._arm(now + idle_timeout if idle_timeout else 0.0)

    def credential(self, now: float, expires_in: float | None) -> None:
        """The connection's credential is valid for ``expires_in`` more seconds (None: for
        ever); a renewal replaces the expiry it had."""
        self.credential_expiry = 0.0 if expires_in is None else now + max(0.0, expires_in)
        self._arm(self.last_frame + self.idle_timeout if self.idle_timeout else 0.0)

    def _arm(self, due: float) -> None:
        """Arm the earlier of ``due`` (0: none) and the credential's expiry (0: none)."""
        expiry = self.credential_expiry
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
        timeout = self.idle_timeout
        due = 0.0
        if timeout:
            due = now + timeout if reads_paused else self.last_frame + timeout
            if now >= due:
                return "idle"
        self._arm(due)
        return None
