"""Virtual hosts and user limits as plain objects: who is let in, counted and let go."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.gateway.config import ConfigError, load_config
from sluicegate.gateway.rules.auth import User, UserLimits, parse_users
from sluicegate.gateway.rules.tenancy import NotAllowed, QuotaExceeded, Tenancy
from sluicegate.gateway.rules.vhost_log import logged_name, split_logged_name
from sluicegate.gateway.rules.vhosts import parse_vhosts, requested_vhost
from sluicegate.queues.registry import QueueRegistry

ALL = {"configure": ".*", "write": ".*", "read": ".*"}


def _tenancy() -> Tenancy:
    vhosts = parse_vhosts({"a": {"max_connections": 1, "max_queues": 1}, "b": {}})
    return Tenancy(vhosts, {name: QueueRegistry() for name in vhosts})


def _user(name: str, *vhosts: str, **limits: int) -> User:
    permissions = parse_users({"anonymous": ALL})["anonymous"].vhosts["/"]
    return User(name, None, dict.fromkeys(vhosts, permissions), UserLimits(**limits))


def test_the_hostname_chooses_the_virtual_host_as_rabbitmq_4_does() -> None:
    assert requested_vhost("vhost:a") == "a"
    assert requested_vhost("vhost:/") == "/"
    assert requested_vhost("vhost:a%2Fb") == "a%2Fb"  # taken as sent, as RabbitMQ does
    assert requested_vhost("localhost") == "/"
    assert requested_vhost(None) == "/"


def test_admission_checks_existence_permissions_then_limits() -> None:
    tenancy = _tenancy()
    user = _user("u", "a", "b", max_connections=2)
    with pytest.raises(NotAllowed, match="has not logged in"):
        tenancy.admit(None, "vhost:a")
    with pytest.raises(NotAllowed, match="virtual host 'c' does not exist"):
        tenancy.admit(user, "vhost:c")
    with pytest.raises(NotAllowed, match="access to vhost '/' refused for user 'u'"):
        tenancy.admit(user, None)
    first = tenancy.admit(user, "vhost:a")
    assert first.vhost.name == "a"
    with pytest.raises(QuotaExceeded, match="vhost connection limit \\(1\\) is reached"):
        tenancy.admit(user, "vhost:a")
    second = tenancy.admit(user, "vhost:b")
    with pytest.raises(QuotaExceeded, match="user connection limit \\(2\\) is reached"):
        tenancy.admit(user, "vhost:b")
    tenancy.leave(user, first.vhost)
    tenancy.leave(user, second.vhost)
    assert [vhost.connections for vhost in tenancy.vhosts.values()] == [0, 0, 0]
    assert tenancy.admit(user, "vhost:a").vhost.connections == 1


def test_sessions_count_across_a_users_connections() -> None:
    tenancy = _tenancy()
    user = _user("u", "b", max_sessions=2)
    vhost = tenancy.admit(user, "vhost:b").vhost
    tenancy.admit(user, "vhost:b")
    tenancy.begin_session(user)
    tenancy.begin_session(user)
    with pytest.raises(QuotaExceeded, match="user session limit \\(2\\) is reached"):
        tenancy.begin_session(user)
    tenancy.end_session(user)
    tenancy.begin_session(user)
    # A limit of 0 lets nothing in, as RabbitMQ's.
    nobody = _user("n", "b", max_connections=0)
    with pytest.raises(QuotaExceeded):
        tenancy.admit(nobody, "vhost:b")
    assert vhost.connections == 2


def test_the_queue_limit_counts_queues_not_redeclarations() -> None:
    vhost = _tenancy().vhosts["a"]
    vhost.check_queue_room("q")
    vhost.registry.declare_queue("q")
    vhost.check_queue_room("q")
    with pytest.raises(QuotaExceeded, match="queue limit in vhost 'a' \\(1\\) is reached"):
        vhost.check_queue_room("r")


@pytest.mark.parametrize(("vhost", "name"), [("/", "q"), ("a", "q"), ("a/b", "c\x01d"), ("x", "")])
def test_logged_names_round_trip(vhost: str, name: str) -> None:
    assert split_logged_name(logged_name(vhost, name)) == (vhost, name)
    # The default virtual host's names are logged as before virtual hosts existed.
    assert (logged_name(vhost, name) == name) is (vhost == "/")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"vhosts": {"a": {"max_queue": 1}}}, "vhosts.a.max_queue: unknown key"),
        ({"vhosts": {"a": {"max_queues": -2}}}, "vhosts.a.max_queues: expected a count"),
        ({"vhosts": {"a": {"max_queues": "10"}}}, "vhosts.a.max_queues: expected a count"),
        ({"vhosts": {"a\x00b": {}}}, "may not contain NUL"),
        (
            {"users": {"anonymous": {"permissions": {"nowhere": ALL}}}},
            "users.anonymous.permissions.nowhere: no virtual host 'nowhere'",
        ),
        (
            {"users": {"anonymous": {"read": ".*", "permissions": {"/": ALL}}}},
            "users.anonymous.read: put it in",
        ),
        (
            {"users": {"anonymous": {"permissions": {"/": {"reed": ""}}}}},
            "users.anonymous.permissions./.reed: unknown key",
        ),
        ({"users": {"anonymous": {"max_sessions": True}}}, "users.anonymous.max_sessions"),
    ],
)
def test_bad_vhost_and_permission_tables_name_the_key(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(overrides=settings, environ={})


def test_permissions_per_vhost_and_limits_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "sluicegate.toml"
    config.write_text(
        "[vhosts.tenant]\nmax_queues = 10\nmax_connections = -1\n"
        "[users.anonymous]\nmax_connections = 3\n"
        '[users.anonymous.permissions."/"]\nread = "^public"\n'
        "[users.anonymous.permissions.tenant]\n"
    )
    loaded = load_config(config, environ={})
    assert loaded.vhosts["tenant"].max_queues == 10
    assert loaded.vhosts["tenant"].max_connections is None
    assert loaded.vhosts["/"].max_queues is None
    anonymous = loaded.users["anonymous"]
    assert anonymous.limits == UserLimits(max_connections=3)
    default = anonymous.permissions("/")
    tenant = anonymous.permissions("tenant")
    assert default is not None
    assert tenant is not None
    assert default.allows("read", "public.x")
    assert not default.allows("read", "private")
    assert default.allows("write", "x")  # an omitted pattern is ".*", as in the short form
    assert tenant.allows("configure", "anything")
