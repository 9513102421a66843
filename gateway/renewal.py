"""Renewing a connection's OAuth 2 token: ``PUT /auth/tokens`` on ``/management``.

RabbitMQ 4.1's renewal (its pull request 12599): a client whose token is about to expire sends
a fresh one, as a binary body, over the management link pair of the connection it wants to keep.
The token must verify as at login (gateway/oauth2.py), name the same user and still let it into
the connection's virtual host; the connection then has the new token's permissions and expiry.
A connection that logged in with a password has no credential that can expire: as with
RabbitMQ's internal backend, a renewal changes nothing and succeeds.
"""

from __future__ import annotations

from sluicegate.gateway.oauth2 import (
    OAuth2Settings,
    TokenError,
    credential_lifetime,
    verify_token,
)
from sluicegate.gateway.rules.management.requests import Response
from sluicegate.gateway.state import ConnectionState

# The path RabbitMQ's clients renew tokens on (HTTP API v2 over AMQP).
PATH = "/auth/tokens"


def renew_credential(
    state: ConnectionState,
    method: str,
    body: object,
    settings: OAuth2Settings | None,
    *,
    wall_now: float,
    now: float,
) -> Response:
    """Apply a renewal request; ``wall_now`` is seconds since the epoch, ``now`` the reactor's."""
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
    try:
        renewed = verify_token(settings, body, wall_now)
    except TokenError as error:
        return Response(401, f"invalid token: {error}")
    if renewed.name != user.name:
        return Response(401, f"the token names user '{renewed.name}', not '{user.name}'")
    permissions = renewed.permissions(state.vhost.name)
    if permissions is None:
        return Response(401, f"the token gives no access to vhost '{state.vhost.name}'")
    state.renewed(renewed, permissions)
    expires_at = renewed.expires_at if renewed.expires_at is not None else wall_now
    state.deadlines.credential(now, credential_lifetime(expires_at, wall_now))
    return Response(204)
