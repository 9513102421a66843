"""OAuth 2 tokens as credentials: the ``[oauth2]`` settings, verification and RabbitMQ's scopes."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.gateway.oauth2 import (
    OAuth2Settings,
    TokenError,
    credential_lifetime,
    looks_like_token,
    parse_oauth2,
    verify_token,
)
from sluicegate.gateway.rules.auth import UserError
from sluicegate.gateway.rules.timeouts import Deadlines

# Long enough for HS512, so that PyJWT does not warn about a short key when the tests sign with it.
SECRET = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.-"
NOW = 1_800_000_000.0


def _settings(**extra: object) -> OAuth2Settings:
    table: dict[str, object] = {
        "signing_keys": {"token-key": {"alg": "HS256", "key": base64.b64encode(SECRET).decode()}},
        **extra,
    }
    return parse_oauth2(table)


def _token(
    scope: object = "rabbitmq.read:*/*",
    *,
    key: bytes | str = SECRET,
    algorithm: str = "HS256",
    kid: str | None = "token-key",
    **claims: object,
) -> bytes:
    payload = {"sub": "svc", "aud": "rabbitmq", "exp": NOW + 60, "scope": scope, **claims}
    headers = {} if kid is None else {"kid": kid}
    return jwt.encode(payload, key, algorithm=algorithm, headers=headers).encode()


def test_a_valid_token_names_its_user_and_expiry() -> None:
    user = verify_token(_settings(), _token(), NOW)
    assert user.name == "svc"
    assert user.password is None
    assert user.expires_at == NOW + 60


def test_the_user_name_comes_from_the_preferred_claims_in_order() -> None:
    settings = _settings(preferred_username_claims=["user_name", "sub"])
    assert verify_token(settings, _token(user_name="alice"), NOW).name == "alice"
    assert verify_token(settings, _token(), NOW).name == "svc"
    # RabbitMQ's name for a token that names nobody.
    assert verify_token(_settings(preferred_username_claims=["email"]), _token(), NOW).name == (
        "unknown"
    )


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (_token(key=SECRET[::-1]), "Signature"),
        (_token(aud="someone-else"), "(?i)audience"),
        (_token(kid="unknown"), "no signing key"),
        (_token(exp=NOW), "expired"),
        (_token(exp=NOW - 1), "expired"),
        (b"eyJhbGciOiJIUzI1NiJ9.e30.", "Signature|JWT|not"),
        (b"not.a.token", "JWT"),
    ],
)
def test_a_token_that_does_not_verify_lets_nobody_in(token: bytes, reason: str) -> None:
    with pytest.raises(TokenError, match=reason):
        verify_token(_settings(), token, NOW)


def test_a_token_without_expiry_is_refused() -> None:
    token = jwt.encode({"sub": "svc", "aud": "rabbitmq"}, SECRET, algorithm="HS256").encode()
    with pytest.raises(TokenError, match="exp"):
        verify_token(_settings(), token, NOW)


def test_an_algorithm_other_than_the_keys_is_refused() -> None:
    token = _token(algorithm="HS512")
    with pytest.raises(TokenError):
        verify_token(_settings(), token, NOW)


def test_without_kid_the_default_key_signs() -> None:
    assert verify_token(_settings(), _token(kid=None), NOW).name == "svc"


def test_scopes_become_permissions_per_vhost() -> None:
    scopes = (
        "rabbitmq.configure:%2F/orders* rabbitmq.write:%2F/orders rabbitmq.read:%2F/replies-* "
        "rabbitmq.read:tenant-*/q rabbitmq.write:other/x/rk other.read:*/* rabbitmq.tag:admin"
    )
    user = verify_token(_settings(), _token(scopes), NOW)
    default = user.permissions("/")
    assert default is not None
    assert default.allows("configure", "orders-eu")
    assert not default.allows("configure", "bills")
    assert default.allows("write", "orders")
    assert not default.allows("write", "orders-eu")
    assert default.allows("read", "replies-1")
    assert not default.allows("read", "orders")
    tenant = user.permissions("tenant-a")
    assert tenant is not None
    assert tenant.allows("read", "q")
    assert not tenant.allows("read", "qq")
    assert not tenant.allows("write", "q")
    other = user.permissions("other")
    assert other is not None
    assert other.allows("write", "x")
    # A vhost no scope names is not entered; another resource server's scopes grant nothing.
    assert user.permissions("elsewhere") is None
    assert sorted(user.vhosts) == ["/", "other"]


def test_a_scope_on_every_name_allows_a_null_target() -> None:
    user = verify_token(_settings(), _token("rabbitmq.write:*/*"), NOW)
    permissions = user.permissions("any")
    assert permissions is not None
    assert permissions.write.pattern == ".*"
    assert permissions.read.pattern == ""


def test_names_in_scopes_are_literal_apart_from_the_wildcard() -> None:
    user = verify_token(_settings(), _token("rabbitmq.read:*/a.b+"), NOW)
    permissions = user.permissions("/")
    assert permissions is not None
    assert permissions.allows("read", "a.b+")
    assert not permissions.allows("read", "axbb")


@given(
    pattern=st.text(alphabet="ab*.+", min_size=1, max_size=8),
    vhost=st.text(alphabet="ab.+", max_size=9),
)
def test_a_vhost_wildcard_matches_as_its_expression_would(pattern: str, vhost: str) -> None:
    """Scopes' vhost wildcards are matched piece by piece, never compiled (a 16 KiB token names
    some 500): the same answers as the expression ``*`` means, everything else literal."""
    expression = ".*".join(re.escape(piece) for piece in pattern.split("*"))
    expected = re.fullmatch(expression, vhost) is not None
    user = verify_token(_settings(), _token(f"rabbitmq.read:{pattern}/q"), NOW)
    assert (user.permissions(vhost) is not None) == expected


def test_scopes_as_a_list_and_a_custom_prefix() -> None:
    settings = _settings(scope_prefix="api://sg/")
    user = verify_token(settings, _token(["api://sg/read:*/*", "rabbitmq.write:*/*"]), NOW)
    permissions = user.permissions("/")
    assert permissions is not None
    assert permissions.allows("read", "q")
    assert not permissions.allows("write", "q")


def test_an_rsa_public_key_from_a_pem_file(tmp_path: Path) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path = tmp_path / "key.pem"
    path.write_bytes(pem)
    settings = parse_oauth2(
        {"signing_keys": {"rsa": {"alg": "RS256", "public_key_file": str(path)}}}
    )
    token = _token(key=private, algorithm="RS256", kid="rsa")  # type: ignore[arg-type]
    assert verify_token(settings, token, NOW).name == "svc"
    with pytest.raises(TokenError):
        verify_token(settings, _token(kid="rsa"), NOW)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({}, "signing_keys"),
        ({"signing_keys": {"k": {"alg": "HS256"}}}, "signing_keys.k.key"),
        ({"signing_keys": {"k": {"alg": "HS256", "key": "%%%"}}}, "signing_keys.k.key"),
        ({"signing_keys": {"k": {"alg": "none", "key": "YQ=="}}}, "signing_keys.k.alg"),
        ({"signing_keys": {"k": {"alg": "RS256", "public_key_file": "/nonexistent"}}}, "file"),
        ({"signing_keys": {"k": {"alg": "HS256", "key": "YQ==", "x": 1}}}, "k.x: unknown"),
        ({"signing_keys": {"k": {"alg": "HS256", "key": "YQ=="}}, "bogus": 1}, "bogus"),
        (
            {"signing_keys": {"k": {"alg": "HS256", "key": "YQ=="}}, "default_key": "j"},
            "default_key",
        ),
        ({"signing_keys": {"k": {"alg": "HS256", "key": "YQ=="}}, "resource_server_id": ""}, "id"),
    ],
)
def test_bad_settings_name_their_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_oauth2(table)


def test_an_rsa_setting_with_a_file_that_is_no_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    path.write_text("not a key")
    with pytest.raises(UserError, match="not a usable RS256 key"):
        parse_oauth2({"signing_keys": {"k": {"alg": "RS256", "public_key_file": str(path)}}})


def test_only_compact_jwts_are_taken_for_tokens() -> None:
    assert looks_like_token(_token())
    assert not looks_like_token(b"correct horse")
    assert not looks_like_token(b"eyJ" + b"a" * 20_000 + b".b.c")
    assert not looks_like_token(b"eyJ.a b.c")


def test_a_shared_secret_may_be_written_as_a_jwks_base64url() -> None:
    secret = bytes(range(200, 248))
    url = base64.urlsafe_b64encode(secret).decode().rstrip("=")
    assert "-" in url or "_" in url
    settings = parse_oauth2({"signing_keys": {"k": {"alg": "HS256", "key": url}}})
    assert settings.keys["k"].key == secret


def test_a_connection_outlives_its_token_by_the_part_of_a_second_rabbitmq_gives_it() -> None:
    """RabbitMQ's Python client suite's refresh test: a token made at 998.6 for "2.5 s" has
    ``exp`` 1001 (its whole seconds), the connection opens at 998.7 and the renewal comes at
    1001.4 under load. RabbitMQ's timer, armed for (1001 - 998) s at 998.7, has not fired; nor
    has sluicegate's, which closed at 1001.0 when it counted from the exact time."""
    assert credential_lifetime(1001.0, 998.7) == 3.0
    deadlines = Deadlines()
    deadlines.credential(998.7, credential_lifetime(1001.0, 998.7))
    assert deadlines.deadline == pytest.approx(1001.7)
    assert deadlines.overdue(1001.4, reads_paused=False) is None
    # The renewal, for 5 s more (exp 1006), is counted from its own second.
    deadlines.credential(1001.4, credential_lifetime(1006.0, 1001.4))
    assert deadlines.deadline == pytest.approx(1006.4)
    assert deadlines.overdue(1006.4, reads_paused=False) == "credential"


@given(
    st.integers(min_value=1, max_value=2**33),
    st.floats(min_value=0.0, max_value=3600.0, exclude_min=True),
)
def test_the_credential_ends_within_the_second_after_exp(expiry: int, before: float) -> None:
    """Whenever a token that is still valid is counted, the connection ends at its ``exp`` plus
    the part of a second that had passed then: never before ``exp``, at most a second after."""
    wall_now = expiry - before
    end = wall_now + credential_lifetime(float(expiry), wall_now)
    assert expiry <= end <= expiry + 1
