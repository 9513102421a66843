"""Renewing a connection's OAuth 2 token: ``PUT /auth/tokens`` on ``/management``.

RabbitMQ 4.1's renewal (its pull request 12599): a client whose token is about to expire sends
a fresh one, as a binary body, over the management link pair of the connection it wants to keep.
The token must verify as at login (gateway/oauth2.py), name the same user and still let it into
the connection's virtual host; the connection then has the new token's permissions and expiry.
A connection that logged in with a password has no credential that can expire: as with
RabbitMQ's internal backend, a renewal changes nothing and succeeds.

The request is checked on the reactor (:func:`token_to_verify`: its form and size, before any
decoding); the token is verified on the login workers, as at login (gateway/login.py), one at a
time per connection, and applied back on the reactor (:func:`apply_renewal`).
"""

from __future__ import annotations

from typing import Final

from sluicegate.gateway.oauth2 import (
    MAX_TOKEN_SIZE,
    OAuth2Settings,
    credential_lifetime,
    looks_like_token,
)
from sluicegate.gateway.rules.auth import User
from sluicegate.gateway.rules.management.requests import Response
from sluicegate.gateway.state import ConnectionState

# The path RabbitMQ's clients renew tokens on (HTTP API v2 over AMQP).
PATH = "/auth/tokens"
# Renewals waiting for the login workers, all connections together: as many as one listener's
# logins may (``max_pending_logins``' default), each a token of at most 16 KiB.
RENEWALS_WAITING: Final = 64


def token_to_verify(
    state: ConnectionState, method: str, body: object, settings: OAuth2Settings | None
) -> Response | bytes:
    """The token a renewal request asks to verify, or the answer that needs no verifying."""
    if method != "PUT":
        return Response(405, f"method {method} not allowed on {PATH}")
    if isinstance(body, memoryview):
        body = body.tobytes()
    if not isinstance(body, bytes):
        return Response(400, "the request body must be the token, as binary")
    user = state.user
    if user is None or state.vhost is None:
        return Response(401, "the connection has not logged in")
    if user.expires_at is None:
        return Response(204)
    if settings is None:
        return Response(401, "tokens are not accepted by this server")
    if not looks_like_token(body):
        # A body may be a whole management request (1 MiB): nothing of it is decoded.
        return Response(401, f"invalid token: not a compact JWT of at most {MAX_TOKEN_SIZE} bytes")
    return body


def apply_renewal(
    state: ConnectionState, renewed: User | None, refusal: str, *, wall_now: float, now: float
) -> Response:
    """Give the connection what its verified token ``renewed`` grants (None: it did not verify,
    for ``refusal``); ``wall_now`` is seconds since the epoch, ``now`` the reactor's."""
    user = state.user
    vhost = state.vhost
    if user is None or vhost is None:
        return Response(401, "the connection has not logged in")
    if renewed is None:
        return Response(401, f"invalid token: {refusal}")
    if renewed.name != user.name:
        return Response(401, f"the token names user '{renewed.name}', not '{user.name}'")
    permissions = renewed.permissions(vhost.name)
    if permissions is None:
        return Response(401, f"the token gives no access to vhost '{vhost.name}'")
    state.renewed(renewed, permissions)
    expires_at = renewed.expires_at if renewed.expires_at is not None else wall_now
    state.deadlines.credential(now, credential_lifetime(expires_at, wall_now))
    return Response(204)
