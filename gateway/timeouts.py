"""A connection's deadlines, kept by the gateway: the handshake, the idle timeout, the credential.

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
"""

from __future__ import annotations

from typing import Literal

from sluicegate.gateway.state import ConnectionState

Overdue = Literal["handshake", "idle", "credential"]


def accepted(state: ConnectionState, now: float, handshake_timeout: float) -> None:
    """A new connection: it has ``handshake_timeout`` seconds to send its OPEN."""
    state.handshake_deadline = state.deadline = now + handshake_timeout


def opened(state: ConnectionState, now: float, idle_timeout: float) -> None:
    """The client's OPEN came (its handshake is finished, gateway/limits.py ``Handshakes``)
    and ours is encoded: the idle timeout applies from now on."""
    state.idle_timeout = idle_timeout
    state.last_frame = now
    state.frames_seen = state.transport.frames_input
    _arm(state, now + idle_timeout if idle_timeout else 0.0)


def credential(state: ConnectionState, now: float, expires_in: float | None) -> None:
    """The connection's credential is valid for ``expires_in`` more seconds (None: for ever);
    a renewal replaces the expiry it had."""
    state.credential_expiry = 0.0 if expires_in is None else now + max(0.0, expires_in)
    idle_due = state.last_frame + state.idle_timeout if state.idle_timeout else 0.0
    _arm(state, idle_due)


def _arm(state: ConnectionState, due: float) -> None:
    """Arm the earlier of ``due`` (0: none) and the credential's expiry (0: none)."""
    expiry = state.credential_expiry
    state.deadline = min(due, expiry) if due and expiry else due or expiry


def frames_read(state: ConnectionState, now: float) -> None:
    """Bytes were pushed to proton: if they completed a frame, the client is not idle."""
    frames = state.transport.frames_input
    if frames != state.frames_seen:
        state.frames_seen = frames
        state.last_frame = now


def resumed(state: ConnectionState, now: float) -> None:
    """Reads resume after a pause: the silence the server imposed does not count."""
    if not state.handshake_deadline and state.idle_timeout:
        state.last_frame = now
        _arm(state, now + state.idle_timeout)


def overdue(state: ConnectionState, now: float) -> Overdue | None:
    """Which deadline has passed at ``now``, if any; otherwise re-arm the idle deadline."""
    if state.handshake_deadline:
        return "handshake" if now >= state.handshake_deadline else None
    if state.credential_expiry and now >= state.credential_expiry:
        return "credential"
    timeout = state.idle_timeout
    due = 0.0
    if timeout:
        due = now + timeout if state.reads_paused else state.last_frame + timeout
        if now >= due:
            return "idle"
    _arm(state, due)
    return None
