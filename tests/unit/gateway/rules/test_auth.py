"""Password hashes and user tables as plain objects."""

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

_USERS = parse_users({"alice": {"password_hash": hash_password("pw")}})


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
