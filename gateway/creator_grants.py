"""The permissions RabbitMQ gives the user who creates a virtual host over its HTTP API.

RabbitMQ's ``rabbit_vhost:put_vhost`` grants the creating user, when it is one of the
broker's own users, ``.*`` to configure, write and read in the new virtual host
(``maybe_grant_full_permissions``), so that a client can create a virtual host and connect to
it at once, as RabbitMQ's Python client's suite does. Deleting the virtual host clears them.

Users are the configuration's (``[users.NAME]``): a grant replaces the user's entry in the
server's one users table, which every login path reads by name at each login (gateway/login.py,
gateway/sasl.py, gateway/http/basic_auth.py), so a grant applies from the next login on. Grants
are kept with the virtual hosts created at run time (gateway/runtime_vhosts.py), and made again
at start.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from sluicegate.gateway.rules.auth import EVERYTHING, User


def grant(users: dict[str, User], name: str, vhost: str) -> bool:
    """Give user ``name`` every permission in ``vhost``; False if there is no such user (an
    OAuth 2 token's or the anonymous user of a server without users: RabbitMQ grants only its
    own users)."""
    user = users.get(name)
    if user is None:
        return False
    users[name] = replace(user, vhosts={**user.vhosts, vhost: EVERYTHING})
    return True


def revoke(users: dict[str, User], names: Iterable[str], vhost: str) -> None:
    """Take back what :func:`grant` gave in ``vhost`` (it is deleted)."""
    for name in names:
        user = users.get(name)
        if user is not None and vhost in user.vhosts:
            users[name] = replace(
                user, vhosts={key: value for key, value in user.vhosts.items() if key != vhost}
            )
