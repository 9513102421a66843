"""Users, their hashed passwords and their permissions (RabbitMQ's configure / write / read).

Passwords are stored as ``scrypt$N$r$p$SALT$HASH`` (base64 salt and hash): a memory-hard hash from
the standard library, salted per user, so a leaked config file does not give the passwords away.
``sluicegate passwd`` prints such a line for a password read from the terminal.

Permissions are RabbitMQ's: three regular expressions searched (``re.search``, as RabbitMQ
does: anchor them with ``^...$``) in a queue or exchange name — *configure* to declare or delete
it, *write* to publish to it, *read* to consume from it. An omitted pattern is ``.*``, an empty
one allows nothing. A user has them per virtual host, and enters only the virtual hosts where it
has them (RabbitMQ's rule): the patterns written in ``[users.NAME]`` itself are its permissions
in the default virtual host ``/``, a ``[users.NAME.permissions.VHOST]`` table those in VHOST.

User limits are RabbitMQ's ``max-connections`` and ``max-channels`` (sessions, in AMQP 1.0):
counted across every connection of the user; absent means no limit, 0 lets nothing in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

# scrypt's cost: 2**14 x 8 x 1 takes 16 MiB and some tens of ms, OWASP's minimum for scrypt.
# Verification runs on the reactor thread once per PLAIN login, so the cost is kept there.
SCRYPT_N: Final = 2**14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
SALT_BYTES: Final = 16
HASH_BYTES: Final = 32
# The user an ANONYMOUS login (or a client without SASL) acts as.
ANONYMOUS_USER: Final = "anonymous"
# RabbitMQ's default virtual host: where a client goes unless its OPEN names another.
DEFAULT_VHOST: Final = "/"
_PATTERN_KEYS: Final = ("configure", "write", "read")
_LIMIT_KEYS: Final = ("max_connections", "max_sessions")

Access = Literal["configure", "write", "read"]


class UserError(ValueError):
    """A ``users`` or ``vhosts`` entry that cannot be used; the message names the key."""


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """The stored form of ``password``, with a fresh random salt."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=HASH_BYTES
    )
    encoded = [base64.b64encode(part).decode() for part in (salt, digest)]
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${encoded[0]}${encoded[1]}"


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """A parsed ``scrypt$N$r$p$SALT$HASH``."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    @classmethod
    def parse(cls, key: str, stored: object) -> PasswordHash:
        """Read a stored hash; a malformed one is a configuration error naming ``key``."""
        parts = str(stored).split("$")
        try:
            if len(parts) != 6 or parts[0] != "scrypt":
                raise ValueError
            n, r, p = (int(part) for part in parts[1:4])
            salt, digest = (base64.b64decode(part, validate=True) for part in parts[4:])
        except ValueError:
            raise UserError(
                f"{key}: expected scrypt$N$r$p$SALT$HASH (make one with `sluicegate passwd`)"
            ) from None
        if n < 2 or n & (n - 1) or r < 1 or p < 1 or not salt or not digest:
            raise UserError(f"{key}: scrypt parameters out of range")
        return cls(n, r, p, salt, digest)

    def verify(self, password: bytes) -> bool:
        """Whether ``password`` hashes to the stored digest (compared in constant time)."""
        try:
            candidate = hashlib.scrypt(
                password,
                salt=self.salt,
                n=self.n,
                r=self.r,
                p=self.p,
                dklen=len(self.digest),
                maxmem=256 * 1024 * 1024,
            )
        except ValueError:
            return False
        return hmac.compare_digest(candidate, self.digest)


@dataclass(frozen=True, slots=True)
class Permissions:
    """RabbitMQ's three patterns; an empty pattern allows nothing."""

    configure: re.Pattern[str]
    write: re.Pattern[str]
    read: re.Pattern[str]

    def allows(self, access: Access, name: str) -> bool:
        """Whether this access to the queue or exchange ``name`` is permitted."""
        pattern: re.Pattern[str] = getattr(self, access)
        return bool(pattern.pattern) and pattern.search(name) is not None


EVERYTHING: Final = Permissions(re.compile(".*"), re.compile(".*"), re.compile(".*"))
# A connection that has not logged in.
NOBODY: Final = Permissions(re.compile(""), re.compile(""), re.compile(""))


@dataclass(frozen=True, slots=True)
class UserLimits:
    """RabbitMQ's user limits; None is no limit."""

    max_connections: int | None = None
    # Sessions open at once across all the user's connections (RabbitMQ's max-channels).
    max_sessions: int | None = None


@dataclass(frozen=True, slots=True)
class User:
    """A user: a name, a password hash (None: cannot log in with PLAIN), where it may go.

    ``vhosts`` holds its permissions per virtual host; ``elsewhere`` those in any virtual host
    not listed (only the anonymous user of a server without users has any). ``expires_at`` is
    when the credential it logged in with stops being valid (seconds since the epoch): set for
    an OAuth 2 token (gateway/oauth2.py), whose connection ends then unless it is renewed.
    """

    name: str
    password: PasswordHash | None
    vhosts: Mapping[str, Permissions]
    limits: UserLimits = UserLimits()
    elsewhere: Permissions | None = None
    expires_at: float | None = None
    # RabbitMQ's user tags; "administrator" sees and manages everything over the HTTP API.
    tags: tuple[str, ...] = ()

    def permissions(self, vhost: str) -> Permissions | None:
        """What the user may do in ``vhost``; None where it may not enter."""
        return self.vhosts.get(vhost, self.elsewhere)


def _pattern(key: str, raw: object) -> re.Pattern[str]:
    if not isinstance(raw, str):
        raise UserError(f"{key}: expected a regular expression string, got {raw!r}")
    try:
        return re.compile(raw)
    except re.error as error:
        raise UserError(f"{key}: invalid regular expression: {error}") from None


def _permissions(key: str, table: Mapping[str, object]) -> Permissions:
    return Permissions(
        *(_pattern(f"{key}.{access}", table.get(access, ".*")) for access in _PATTERN_KEYS)
    )


def parse_limit(key: str, raw: object) -> int | None:
    """A RabbitMQ limit: a count, with -1 (RabbitMQ's way to say it) for no limit."""
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < -1:
        raise UserError(f"{key}: expected a count (0 or more, -1 for no limit), got {raw!r}")
    return None if raw == -1 else raw


def _vhost_permissions(key: str, table: Mapping[str, object]) -> dict[str, Permissions]:
    """The short form (patterns in the user's own table, for ``/``) or the per-vhost tables."""
    by_vhost = table.get("permissions")
    short = [access for access in _PATTERN_KEYS if access in table]
    if by_vhost is None:
        return {DEFAULT_VHOST: _permissions(key, table)}
    if short:
        raise UserError(
            f'{key}.{short[0]}: put it in [{key}.permissions."/"] next to the other '
            "virtual hosts' permissions"
        )
    if not isinstance(by_vhost, Mapping):
        raise UserError(f"{key}.permissions: expected a table of [{key}.permissions.VHOST]")
    parsed: dict[str, Permissions] = {}
    for vhost, patterns in by_vhost.items():
        where = f"{key}.permissions.{vhost}"
        if not isinstance(patterns, Mapping):
            raise UserError(f"{where}: expected a table")
        unknown = set(patterns) - set(_PATTERN_KEYS)
        if unknown:
            raise UserError(f"{where}.{sorted(unknown)[0]}: unknown key")
        parsed[str(vhost)] = _permissions(where, patterns)
    return parsed


def parse_users(raw: object) -> dict[str, User]:
    """Read the ``[users.NAME]`` tables of the config file."""
    if not isinstance(raw, Mapping):
        raise UserError("users: expected a table of [users.NAME] tables")
    users: dict[str, User] = {}
    for name, table in raw.items():
        key = f"users.{name}"
        if not isinstance(table, Mapping):
            raise UserError(f"{key}: expected a table")
        unknown = set(table) - {
            "password_hash",
            "permissions",
            "tags",
            *_PATTERN_KEYS,
            *_LIMIT_KEYS,
        }
        if unknown:
            raise UserError(f"{key}.{sorted(unknown)[0]}: unknown key")
        stored = table.get("password_hash")
        if stored is None and name != ANONYMOUS_USER:
            raise UserError(
                f'{key}.password_hash: required (make one with `sluicegate passwd`, or "" for a '
                "user that logs in only with a client certificate)"
            )
        # "": no password, as RabbitMQ's clear_password leaves a user: SASL EXTERNAL only.
        password = PasswordHash.parse(f"{key}.password_hash", stored) if stored else None
        limits = UserLimits(
            *(parse_limit(f"{key}.{limit}", table.get(limit, -1)) for limit in _LIMIT_KEYS)
        )
        tags = table.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
            raise UserError(f'{key}.tags: expected a list of tags such as ["administrator"]')
        permissions = _vhost_permissions(key, table)
        users[str(name)] = User(str(name), password, permissions, limits, tags=tuple(tags))
    return users


# Checked instead when the user does not exist or has no password, so that a wrong user name
# takes as long to refuse as a wrong password and the answer's timing tells nothing. Random
# salt and digest: no password hashes to it. Its parameters are those `sluicegate passwd` uses.
_NOBODY: Final = PasswordHash(
    SCRYPT_N, SCRYPT_R, SCRYPT_P, secrets.token_bytes(SALT_BYTES), secrets.token_bytes(HASH_BYTES)
)


def check_plain(users: Mapping[str, User], username: str, password: bytes) -> User | None:
    """The user a SASL PLAIN login names, if the password is right; as costly either way."""
    user = users.get(username)
    if user is None or user.password is None:
        _NOBODY.verify(password)
        return None
    return user if user.password.verify(password) else None


def anonymous_user(users: Mapping[str, User], *, tokens: bool = False) -> User | None:
    """Who an anonymous client is: the configured ``anonymous`` user, if there is one.

    Without any users or OAuth 2 tokens (``tokens``) the server is in its zero-configuration
    state (loopback only, by ``anonymous_login``) and an anonymous client may do everything
    everywhere. Once users or tokens are configured, a client must log in unless
    ``[users.anonymous]`` says what an anonymous client may do: None refuses anonymous logins.
    """
    if not users and not tokens:
        return User(ANONYMOUS_USER, None, {}, elsewhere=EVERYTHING)
    return users.get(ANONYMOUS_USER)
