"""OAuth 2 access tokens (JWTs) as credentials, read as RabbitMQ's ``oauth2`` backend reads them.

A client logs in with SASL PLAIN and an access token as its password (RabbitMQ's clients do so
when given ``oauth``); the server checks the token's signature with a key it was configured with
(no identity provider is ever called), its audience (``resource_server_id``) and its expiry,
and takes the user's name and permissions from its claims. A connection lives no longer than its
token: it is closed with ``amqp:unauthorized-access`` when the token expires unless the client
sends a fresh one first (``PUT /auth/tokens`` on ``/management``, RabbitMQ 4.1's renewal).

Scopes are RabbitMQ's: ``<prefix>configure:<vhost>/<name>``, ``<prefix>write:...``,
``<prefix>read:...``, where ``<prefix>`` is ``resource_server_id`` and a dot unless
``scope_prefix`` says otherwise, ``*`` in the vhost or the name matches anything, and a vhost
or name may be percent-encoded (``%2F`` is the default vhost ``/``). A scope with a third part
(a topic routing key) grants the same as without it: sluicegate has no topic permissions.
Other scopes (``tag:administrator``, another resource server's) grant nothing here.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import jwt

from sluicegate.gateway.rules.auth import Access, Permissions, User, UserError
from sluicegate.queues.filters.like import pieces_in_order

# The claims RabbitMQ reads a user's name from, in order, unless preferred_username_claims says.
DEFAULT_USERNAME_CLAIMS: Final = ("sub", "client_id")
# The user of a token none of those claims names (RabbitMQ's name for it).
UNKNOWN_USER: Final = "unknown"
_ACCESSES: Final[tuple[Access, ...]] = ("configure", "write", "read")
_SYMMETRIC: Final = frozenset({"HS256", "HS384", "HS512"})
_ASYMMETRIC: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_SETTINGS_KEYS: Final = frozenset(
    {
        "resource_server_id",
        "scope_prefix",
        "preferred_username_claims",
        "default_key",
        "signing_keys",
    }
)
_KEY_KEYS: Final = frozenset({"alg", "key", "public_key_file"})
# A JWT in compact form: three base64url parts, the header a JSON object ("eyJ" is "{\"").
_COMPACT_JWT: Final = re.compile(rb"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
# Tokens are a few hundred bytes to a few KiB; a SASL frame is at most 4 KiB anyway
# (gateway/sasl.py), and a management request is capped, so this only bounds the decoding.
MAX_TOKEN_SIZE: Final = 16 * 1024
# Vhosts whose permissions a token user has been asked for, kept per user: a few at most in
# practice, bounded so that a client naming ever new vhosts cannot grow it.
_RESOLVED_MAX: Final = 64


class TokenError(ValueError):
    """A token that does not let anyone in: the message says why, for the server's log."""


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A key tokens are signed with: a shared secret (HS*) or a PEM public key (the rest)."""

    algorithm: str
    key: bytes | str


@dataclass(frozen=True, slots=True)
class OAuth2Settings:
    """The ``[oauth2]`` table of the configuration."""

    resource_server_id: str
    scope_prefix: str
    keys: Mapping[str, SigningKey]
    default_key: str | None
    username_claims: tuple[str, ...]


def parse_oauth2(raw: object) -> OAuth2Settings:
    """Read the ``[oauth2]`` table; a bad entry is a :class:`UserError` naming its key."""
    if not isinstance(raw, Mapping):
        raise UserError("oauth2: expected a table")
    unknown = set(raw) - _SETTINGS_KEYS
    if unknown:
        raise UserError(f"oauth2.{sorted(unknown)[0]}: unknown key")
    server = raw.get("resource_server_id", "rabbitmq")
    if not isinstance(server, str) or not server:
        raise UserError("oauth2.resource_server_id: expected a non-empty string")
    prefix = raw.get("scope_prefix", f"{server}.")
    if not isinstance(prefix, str):
        raise UserError("oauth2.scope_prefix: expected a string")
    claims = raw.get("preferred_username_claims", list(DEFAULT_USERNAME_CLAIMS))
    if not isinstance(claims, list) or not claims or not all(isinstance(c, str) for c in claims):
        raise UserError("oauth2.preferred_username_claims: expected a list of claim names")
    tables = raw.get("signing_keys")
    if not isinstance(tables, Mapping) or not tables:
        raise UserError("oauth2.signing_keys: expected at least one [oauth2.signing_keys.KID]")
    keys = {
        str(kid): _signing_key(f"oauth2.signing_keys.{kid}", table) for kid, table in tables.items()
    }
    default = raw.get("default_key")
    if default is None and len(keys) == 1:
        default = next(iter(keys))
    if default is not None and default not in keys:
        raise UserError(f"oauth2.default_key: no signing key {default!r}")
    return OAuth2Settings(server, prefix, keys, default, tuple(claims))


def _signing_key(where: str, table: object) -> SigningKey:
    if not isinstance(table, Mapping):
        raise UserError(f"{where}: expected a table")
    unknown = set(table) - _KEY_KEYS
    if unknown:
        raise UserError(f"{where}.{sorted(unknown)[0]}: unknown key")
    algorithm = table.get("alg")
    if algorithm in _SYMMETRIC:
        secret = table.get("key")
        decoded = b""
        if isinstance(secret, str):
            # RabbitMQ's symmetric keys are a JWK's "k": base64url, often unpadded; plain
            # base64 is read too.
            text = secret.replace("-", "+").replace("_", "/")
            try:
                decoded = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
            except (binascii.Error, ValueError):
                decoded = b""
        if not decoded:
            raise UserError(f"{where}.key: expected the shared secret, base64-encoded")
        return SigningKey(str(algorithm), decoded)
    if algorithm in _ASYMMETRIC:
        path = table.get("public_key_file")
        if not isinstance(path, str) or not Path(path).is_file():
            raise UserError(f"{where}.public_key_file: expected the path of a PEM public key")
        pem = Path(path).read_text()
        try:
            jwt.algorithms.get_default_algorithms()[str(algorithm)].prepare_key(pem)
        except (ValueError, TypeError, jwt.InvalidKeyError) as error:
            raise UserError(
                f"{where}.public_key_file: not a usable {algorithm} key: {error}"
            ) from None
        return SigningKey(str(algorithm), pem)
    choices = ", ".join(sorted(_SYMMETRIC | _ASYMMETRIC))
    raise UserError(f"{where}.alg: expected one of {choices}, got {algorithm!r}")


def looks_like_token(secret: bytes) -> bool:
    """Whether a password is a compact JWT (so it is checked as a token, not a password)."""
    return len(secret) <= MAX_TOKEN_SIZE and _COMPACT_JWT.fullmatch(secret) is not None


def verify_token(settings: OAuth2Settings, token: bytes, now: float) -> User:
    """The user a token names, with the permissions its scopes grant and its expiry.

    ``now`` is the time in seconds since the epoch (a token's ``exp`` is one).
    """
    if not looks_like_token(token):
        # A renewal's body may be a whole management request (1 MiB): PyJWT checks a token's
        # characters one by one in Python, about 0.6 µs a byte, twice (docs/bounds.md).
        raise TokenError(f"not a compact JWT of at most {MAX_TOKEN_SIZE} bytes")
    header = _header(token)
    kid = header.get("kid", settings.default_key)
    key = settings.keys.get(str(kid)) if kid is not None else None
    if key is None:
        raise TokenError(f"no signing key {kid!r}")
    try:
        # The expiry is checked against ``now`` below, so that time stays an argument.
        claims = jwt.decode(
            token,
            key.key,
            algorithms=[key.algorithm],
            audience=settings.resource_server_id,
            options={"verify_exp": False, "require": ["exp"]},
        )
    except jwt.InvalidTokenError as error:
        raise TokenError(str(error)) from None
    expiry = claims["exp"]
    if not isinstance(expiry, int | float) or isinstance(expiry, bool):
        raise TokenError("exp is not a number")
    if now >= expiry:
        raise TokenError("the token has expired")
    # RabbitMQ's oauth2 backend names a token without any of these claims "unknown".
    name = next(
        (claims[claim] for claim in settings.username_claims if isinstance(claims.get(claim), str)),
        UNKNOWN_USER,
    )
    scopes = ScopedVhosts.from_claim(claims.get("scope"), settings.scope_prefix)
    return User(name, None, scopes, expires_at=float(expiry))


def credential_lifetime(expires_at: float, wall_now: float) -> float:
    """Seconds a connection goes on with a token that expires at ``expires_at``, counted as
    RabbitMQ counts them (both times in seconds since the epoch).

    RabbitMQ's AMQP reader arms its expiry timer for ``(exp - os:system_time(second)) * 1000``
    ms: from the start of the second it is in, so a connection outlives its token by the part
    of a second that had passed when the timer was armed (at OPEN, and again at each renewal).
    ``exp`` is whole seconds, and RabbitMQ's clients' tests give tokens a second or two to live
    and renew them a second in (docs/management.md#rabbitmqs-own-client-suites): closing at
    ``exp`` itself took up to a second of the time those tests have and RabbitMQ gives them.
    """
    return expires_at - math.floor(wall_now)


def _header(token: bytes) -> dict[str, object]:
    """A compact JWT's header, read from its own segment only (PyJWT's reads every segment)."""
    segment = token.split(b".", 1)[0]
    try:
        header = json.loads(base64.urlsafe_b64decode(segment + b"=" * (-len(segment) % 4)))
    except (binascii.Error, ValueError) as error:
        raise TokenError(f"not a JWT: {error}") from None
    if not isinstance(header, dict):
        raise TokenError("not a JWT: its header is not an object")
    return header


def _glob(pattern: str) -> str:
    """A RabbitMQ wildcard (``*`` matches anything) as the body of a regular expression."""
    return ".*".join(re.escape(part) for part in pattern.split("*"))


@dataclass(frozen=True, slots=True)
class _Scope:
    """One scope as written: its vhost and name are RabbitMQ wildcards, unescaped.

    Nothing is compiled when a token is verified: a 16 KiB token names some 500 scopes, and a
    connection uses one vhost, whose scopes alone are compiled when it is resolved.
    """

    access: Access
    vhost: str
    name: str

    def names(self, vhost: str) -> bool:
        """Whether this scope's vhost wildcard matches ``vhost`` (no expression compiled)."""
        pieces = self.vhost.split("*")
        return vhost == pieces[0] if len(pieces) == 1 else pieces_in_order(vhost, pieces)


def _pattern(scopes: list[_Scope], access: Access) -> re.Pattern[str]:
    """One access's name patterns joined; an access no scope grants is the empty pattern, which
    allows nothing, and one granted on ``*`` is ``.*``, which allows a null target too
    (gateway/rules/access.py)."""
    names = [_glob(scope.name) for scope in scopes if scope.access == access]
    if ".*" in names:
        return re.compile(".*")
    return re.compile("^(?:" + "|".join(f"(?:{name})" for name in names) + ")$" if names else "")


class ScopedVhosts(Mapping[str, Permissions]):
    """A token user's permissions by virtual host, as its scopes grant them.

    A vhost is entered when any scope names it (RabbitMQ's rule); what the user may do there is
    each access's scopes for that vhost, their name patterns joined. Iterating gives the vhosts
    named without a wildcard.
    """

    __slots__ = ("_resolved", "_scopes")

    def __init__(self, scopes: tuple[_Scope, ...]) -> None:
        self._scopes = scopes
        self._resolved: dict[str, Permissions | None] = {}

    @classmethod
    def from_claim(cls, claim: object, prefix: str) -> ScopedVhosts:
        """Parse the ``scope`` claim: a space-separated string or a list of strings."""
        if isinstance(claim, str):
            words = claim.split()
        elif isinstance(claim, list):
            words = [word for word in claim if isinstance(word, str)]
        else:
            words = []
        scopes: list[_Scope] = []
        unquote = urllib.parse.unquote
        for word in words:
            if not word.startswith(prefix):
                continue
            access, _, resource = word[len(prefix) :].partition(":")
            vhost, slash, rest = resource.partition("/")
            if access not in _ACCESSES or not slash or not vhost:
                continue
            scopes.append(_Scope(access, unquote(vhost), unquote(rest.partition("/")[0])))
        return cls(tuple(scopes))

    def __getitem__(self, vhost: str) -> Permissions:
        permissions = self._resolved.get(vhost) if vhost in self._resolved else self._resolve(vhost)
        if permissions is None:
            raise KeyError(vhost)
        return permissions

    def _resolve(self, vhost: str) -> Permissions | None:
        scopes = [scope for scope in self._scopes if scope.names(vhost)]
        permissions = None
        if scopes:
            permissions = Permissions(*(_pattern(scopes, access) for access in _ACCESSES))
        if len(self._resolved) >= _RESOLVED_MAX:
            self._resolved.clear()
        self._resolved[vhost] = permissions
        return permissions

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(s.vhost for s in self._scopes if "*" not in s.vhost))

    def __len__(self) -> int:
        return sum(1 for _ in self)
