"""Password hashes, user tables and the SASL exchange as plain objects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluicegate.gateway.config import ConfigError, load_config
from sluicegate.gateway.rules.auth import (
    ANONYMOUS_USER,
    anonymous_user,
    check_plain,
    hash_password,
    parse_users,
)
from sluicegate.gateway.sasl import AMQP_HEADER, SASL_HEADER, Phase, SaslServer
from sluicegate.gateway.tls import certificate_subject


def test_a_hash_verifies_its_password_only() -> None:
    users = parse_users({"alice": {"password_hash": hash_password("s3cret")}})
    assert check_plain(users, "alice", b"s3cret") is users["alice"]
    assert check_plain(users, "alice", b"s3cret ") is None
    assert check_plain(users, "bob", b"s3cret") is None
    # Two hashes of one password differ: each has its own salt.
    assert hash_password("same") != hash_password("same")


def test_permissions_default_to_nothing_and_search_like_rabbitmq() -> None:
    users = parse_users(
        {"u": {"password_hash": hash_password("p"), "write": "^orders", "read": ""}}
    )
    permissions = users["u"].permissions("/")
    assert permissions is not None
    assert permissions.allows("write", "orders.eu")
    assert not permissions.allows("write", "my-orders")
    assert not permissions.allows("read", "orders")
    assert permissions.allows("configure", "anything")  # an omitted pattern is ".*"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"bob": {}}, "users.bob.password_hash: required"),
        ({"bob": {"password_hash": "md5$x"}}, "users.bob.password_hash: expected scrypt$"),
        ({"bob": {"password_hash": hash_password("p"), "read": "("}}, "users.bob.read: invalid"),
        ({"bob": {"password_hash": hash_password("p"), "admin": True}}, "users.bob.admin: unknown"),
        ({"bob": "x"}, "users.bob: expected a table"),
    ],
)
def test_bad_user_tables_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("$", r"\$").replace("(", r"\(")):
        load_config(overrides={"users": table}, environ={})


def test_users_come_from_the_config_file(tmp_path: Path) -> None:
    hashed = subprocess.run(
        [sys.executable, "-m", "sluicegate", "passwd", "--stdin"],
        input="pw\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    config = tmp_path / "sluicegate.toml"
    config.write_text(f'[users.carol]\n{hashed}write = "^x$"\n')
    users = load_config(config, environ={}).users
    assert check_plain(users, "carol", b"pw") is users["carol"]
    permissions = users["carol"].permissions("/")
    assert permissions is not None
    assert permissions.allows("write", "x")


def test_anonymous_is_allowed_everything_only_without_users() -> None:
    # The zero-configuration server: an anonymous client may do anything in any virtual host.
    superuser = anonymous_user({})
    assert superuser is not None
    for vhost in ("/", "tenant"):
        permissions = superuser.permissions(vhost)
        assert permissions is not None
        assert permissions.allows("configure", "q")
    # Users configured without [users.anonymous]: anonymous logins are refused.
    assert anonymous_user(_USERS) is None
    users = parse_users({ANONYMOUS_USER: {"configure": "", "write": "", "read": "^pub$"}})
    anonymous = anonymous_user(users)
    assert anonymous is not None
    permissions = anonymous.permissions("/")
    assert permissions is not None
    assert not permissions.allows("write", "q")
    assert permissions.allows("read", "pub")
    assert anonymous.permissions("tenant") is None


_USERS = parse_users({"alice": {"password_hash": hash_password("pw")}})


def _server(anonymous: bool = True) -> SaslServer:
    return SaslServer(anonymous_user(_USERS) if anonymous else None)


def _plain_init(response: bytes) -> bytes:
    return _sasl_init_frame("PLAIN", response)


def _sasl_init_frame(mechanism: str, response: bytes) -> bytes:
    from proton import Data, Described, symbol, ulong

    data = Data()
    data.put_object(Described(ulong(0x41), [symbol(mechanism), response]))
    body = data.encode()
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x01\x00\x00" + body


def test_bytes_arriving_one_at_a_time_reach_the_same_verdict() -> None:
    server = _server()
    output = b""
    passthrough = b""
    # The client pipelines its AMQP header: it waits in the SASL layer until the verdict.
    for byte in SASL_HEADER + _plain_init(b"\0alice\0pw") + AMQP_HEADER:
        step = server.feed(bytes([byte]))
        if step.verify is not None:
            assert server.phase is Phase.VERIFYING
            assert step.verify == ("alice", b"pw")
            step = server.verified(check_plain(_USERS, *step.verify))
        output += step.output
        passthrough += step.passthrough
        assert not step.close
    assert server.phase is Phase.DONE
    assert server.user is not None
    assert server.user.name == "alice"
    assert output.startswith(SASL_HEADER)
    assert passthrough == AMQP_HEADER


def test_a_wrong_password_fails_after_the_check() -> None:
    server = _server()
    step = server.feed(SASL_HEADER + _plain_init(b"\0alice\0nope"))
    assert step.verify == ("alice", b"nope")
    verdict = server.verified(check_plain(_USERS, *step.verify))
    assert verdict.close
    assert server.phase is Phase.FAILED
    assert "alice" not in verdict.output.decode("latin-1")


@pytest.mark.parametrize(
    "garbage",
    [b"\x00\x00\x20\x00\x02\x01\x00\x00", b"\x00\x00\x00\x09\x02\x00\x00\x00\x00", b"\xff" * 64],
)
def test_a_malformed_sasl_frame_fails_the_login(garbage: bytes) -> None:
    server = _server()
    step = server.feed(SASL_HEADER + garbage)
    assert step.close
    assert server.phase is Phase.FAILED
    assert server.user is None
    assert server.feed(AMQP_HEADER).passthrough == b""


def test_a_certificate_subject_is_named_as_rabbitmq_names_its_user() -> None:
    certificate = {
        "subject": (
            (("commonName", "localhost"),),
            (("organizationName", "client, inc"),),
            (("organizationalUnitName", "a"), ("userId", "u+1")),
        )
    }
    assert certificate_subject(certificate) == "OU=a+UID=u\\+1,O=client\\, inc,CN=localhost"
    assert certificate_subject({}) is None


def test_external_logs_in_as_the_certificate_subjects_user_only() -> None:
    users = parse_users({"O=client,CN=localhost": {"password_hash": ""}})
    subject: list[str | None] = ["O=client,CN=localhost"]
    sasl = SaslServer(None, users=users, peer_subject=lambda: subject[0])
    assert sasl.mechanisms == ["PLAIN", "EXTERNAL"]
    step = sasl.feed(SASL_HEADER + _sasl_init_frame("EXTERNAL", b""))
    assert sasl.phase is Phase.DONE
    assert sasl.user is not None
    assert sasl.user.name == "O=client,CN=localhost"
    assert step.output.endswith(b"\x00")  # sasl-outcome code ok
    subject[0] = "O=other,CN=localhost"
    stranger = SaslServer(None, users=users, peer_subject=lambda: subject[0])
    stranger.feed(SASL_HEADER + _sasl_init_frame("EXTERNAL", b""))
    assert (stranger.phase, stranger.user) == (Phase.FAILED, None)
    subject[0] = None
    without = SaslServer(None, users=users, peer_subject=lambda: subject[0])
    assert "EXTERNAL" not in without.mechanisms
    without.feed(SASL_HEADER + _sasl_init_frame("EXTERNAL", b""))
    assert without.phase is Phase.FAILED
