"""Tenancy's counts against a model, over any order of connections and sessions.

Connections enter and leave virtual hosts, and begin and end sessions, in whatever order
Hypothesis draws; the vhosts' and users' limits refuse exactly what the model says is over them,
and once every connection has left nothing of any user is left counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.examples import examples

from sluicegate.gateway.rules.auth import User, UserLimits, parse_users
from sluicegate.gateway.rules.tenancy import QuotaExceeded, Tenancy, VirtualHost
from sluicegate.gateway.rules.vhosts import parse_vhosts
from sluicegate.queues.registry import QueueRegistry

ALL = {"configure": ".*", "write": ".*", "read": ".*"}
# Vhost "a" admits 2 connections, "b" any number; user "u" opens 3 connections at most and
# 2 sessions across them, "v" has no limits.
VHOST_LIMITS = {"a": 2, "b": None}
USER_LIMITS = {"u": (3, 2), "v": (None, None)}


def _user(name: str) -> User:
    permissions = parse_users({"anonymous": ALL})["anonymous"].vhosts["/"]
    connections, sessions = USER_LIMITS[name]
    limits = UserLimits(max_connections=connections, max_sessions=sessions)
    return User(name, None, dict.fromkeys(VHOST_LIMITS, permissions), limits)


@dataclass
class _Connection:
    user: User
    vhost: VirtualHost
    sessions: int = 0


@dataclass
class _Model:
    connections: list[_Connection] = field(default_factory=list)

    def in_vhost(self, name: str) -> int:
        return sum(1 for c in self.connections if c.vhost.name == name)

    def of_user(self, name: str) -> list[_Connection]:
        return [c for c in self.connections if c.user.name == name]


class TenancyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        vhosts = parse_vhosts(
            {
                name: {} if limit is None else {"max_connections": limit}
                for name, limit in VHOST_LIMITS.items()
            }
        )
        self.tenancy = Tenancy(vhosts, {name: QueueRegistry() for name in vhosts})
        self.users = {name: _user(name) for name in USER_LIMITS}
        self.model = _Model()

    @rule(user=st.sampled_from(sorted(USER_LIMITS)), vhost=st.sampled_from(sorted(VHOST_LIMITS)))
    def admit(self, user: str, vhost: str) -> None:
        vhost_limit = VHOST_LIMITS[vhost]
        user_limit = USER_LIMITS[user][0]
        over = (vhost_limit is not None and self.model.in_vhost(vhost) >= vhost_limit) or (
            user_limit is not None and len(self.model.of_user(user)) >= user_limit
        )
        try:
            admission = self.tenancy.admit(self.users[user], f"vhost:{vhost}")
        except QuotaExceeded:
            assert over
            return
        assert not over
        assert admission.vhost.name == vhost
        self.model.connections.append(_Connection(self.users[user], admission.vhost))

    @precondition(lambda self: self.model.connections)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        self.leave_one(data.draw(st.sampled_from(self.model.connections)))

    @precondition(lambda self: self.model.connections)
    @rule(data=st.data())
    def begin_session(self, data: st.DataObject) -> None:
        connection = data.draw(st.sampled_from(self.model.connections))
        limit = USER_LIMITS[connection.user.name][1]
        held = sum(c.sessions for c in self.model.of_user(connection.user.name))
        try:
            self.tenancy.begin_session(connection.user)
        except QuotaExceeded:
            assert limit is not None
            assert held >= limit
            return
        assert limit is None or held < limit
        connection.sessions += 1

    @precondition(lambda self: any(c.sessions for c in self.model.connections))
    @rule(data=st.data())
    def end_session(self, data: st.DataObject) -> None:
        connection = data.draw(st.sampled_from([c for c in self.model.connections if c.sessions]))
        self.tenancy.end_session(connection.user)
        connection.sessions -= 1

    @invariant()
    def counts_match_the_model(self) -> None:
        for name, vhost in self.tenancy.vhosts.items():
            assert vhost.connections == self.model.in_vhost(name)
            limit = VHOST_LIMITS.get(name)
            assert limit is None or vhost.connections <= limit

    def teardown(self) -> None:
        for connection in list(self.model.connections):
            self.leave_one(connection)
        assert all(vhost.connections == 0 for vhost in self.tenancy.vhosts.values())
        # Nothing of any user is left counted: a new connection starts from nothing.
        for user in self.users.values():
            self.tenancy.admit(user, "vhost:b")
            self.tenancy.begin_session(user)

    def leave_one(self, connection: _Connection) -> None:
        for _ in range(connection.sessions):
            self.tenancy.end_session(connection.user)
        self.tenancy.leave(connection.user, connection.vhost)
        self.model.connections.remove(connection)


TenancyMachine.TestCase.settings = settings(
    max_examples=examples(100), stateful_step_count=30, deadline=None
)
test_tenancy_counts_follow_the_model = TenancyMachine.TestCase
