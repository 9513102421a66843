"""HTTP basic auth against the server's users, without letting requests flood the hasher.

A password check is a salted scrypt hash (gateway/rules/auth.py), tens of milliseconds of CPU: HTTP
clients send their credentials with every request, so a right password is remembered (by a
keyed digest of it, never the password) for the process's life, up to :data:`REMEMBERED`
of them. Checks run on a worker thread (``hashlib.scrypt`` releases the GIL), :data:`CHECKS` at
once; the connection cap bounds how many wait. Without configured users the server is in its
zero-configuration state: who may log in anonymously over AMQP (``anonymous_login``) may use
the API without credentials, as the anonymous user.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Final

from sluicegate.gateway.rules.auth import User, anonymous_user, check_plain

# Right credentials remembered: more than the users an admin team has, few enough to be small.
REMEMBERED: Final = 256
# Password checks at once: one, so that wrong passwords sent as fast as HTTP allows take at most
# one core, whatever clients do (AMQP logins have their own two workers, gateway/login.py); a
# right password is checked once (:data:`REMEMBERED`).
CHECKS: Final = 1


class BasicAuth:
    """Who an ``Authorization`` header names, if its password is right."""

    def __init__(self, users: Mapping[str, User], anonymous: bool) -> None:
        self._users = users
        # Who a request without credentials is, when the server lets anonymous clients in.
        self._anonymous = anonymous_user(users) if anonymous else None
        self._key = secrets.token_bytes(32)
        self._remembered: OrderedDict[bytes, User] = OrderedDict()
        self._checks = asyncio.Semaphore(CHECKS)

    async def user(self, header: str | None) -> User | None:
        """The user the header names and proves; None: 401."""
        if not self._users:
            return self._anonymous
        if header is None:
            return None
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            name, colon, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not colon:
            return None
        key = hmac.digest(self._key, f"{name}\0{password}".encode(), hashlib.sha256)
        user = self._remembered.get(key)
        if user is not None:
            self._remembered.move_to_end(key)
            # The table's entry as it is now: a grant may have replaced it since
            # (gateway/creator_grants.py).
            return self._users.get(user.name, user)
        async with self._checks:
            user = await asyncio.to_thread(check_plain, self._users, name, password.encode())
        if user is not None:
            self._remembered[key] = user
            if len(self._remembered) > REMEMBERED:
                self._remembered.popitem(last=False)
        return user
