"""OAuth 2 access tokens as credentials (gateway/oauth2.py), with RabbitMQ's own Python client:
login with a token, its scopes as permissions, the connection's end when the token expires, and
RabbitMQ 4.1's renewal over ``/management`` (gateway/renewal.py)."""

from __future__ import annotations

import base64
import functools
import time
from collections.abc import Callable

import jwt
import pytest
from integration.conftest import RunningServer
from proton import ConnectionException, Endpoint, Message
from proton.utils import BlockingConnection, ConnectionClosed, LinkDetached
from rabbitmq_amqp_python_client import (
    AddressHelper,
    Connection,
    Converter,
    OAuth2Options,
    OutcomeState,
    ValidationCodeException,
)
from rabbitmq_amqp_python_client import Message as RabbitMessage
from support.polling import wait_until
from support.prober import Prober

from sluicegate.gateway.oauth2 import OAuth2Settings, parse_oauth2
from sluicegate.gateway.rules.auth import User, hash_password, parse_users

# The key and audience RabbitMQ's client suites configure their brokers with.
SECRET = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH"
OWN_QUEUES = "rabbitmq.configure:*/orders* rabbitmq.write:*/orders* rabbitmq.read:*/orders*"


@functools.cache
def _settings() -> OAuth2Settings:
    key = {"alg": "HS256", "key": base64.b64encode(SECRET).decode()}
    return parse_oauth2({"signing_keys": {"token-key": key}})


@functools.cache
def _users() -> dict[str, User]:
    return parse_users({"svc": {"password_hash": hash_password("pw")}})


def _token(
    scope: str = OWN_QUEUES, *, lifetime: float = 60, sub: str = "svc", **claims: object
) -> str:
    payload = {"sub": sub, "aud": "rabbitmq", "exp": int(time.time() + lifetime), "scope": scope}
    return jwt.encode(
        {**payload, **claims}, SECRET, algorithm="HS256", headers={"kid": "token-key"}
    )


def _server(make_server: Callable[..., RunningServer]) -> RunningServer:
    return make_server(users=_users(), oauth2=_settings())


def _plain(running: RunningServer, user: str, password: str) -> BlockingConnection:
    return BlockingConnection(
        running.url,
        timeout=10,
        user=user,
        password=password,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )


def _oauth(running: RunningServer, token: str) -> Connection:
    connection = Connection(running.url, oauth2_options=OAuth2Options(token=token))
    connection.dial()
    return connection


def test_a_token_logs_in_as_the_user_it_names_with_its_scopes(
    make_server: Callable[..., RunningServer],
) -> None:
    running = _server(make_server)
    # RabbitMQ's client sends the user name "no": the token names the user.
    connection = _oauth(running, _token())
    try:
        publisher = connection.publisher(AddressHelper.queue_address("orders"))
        status = publisher.publish(RabbitMessage(body=Converter.string_to_bytes("paid")))
        assert status.remote_state == OutcomeState.ACCEPTED
        publisher.close()
        with pytest.raises(Exception, match="unauthorized-access"):
            connection.publisher(AddressHelper.queue_address("payroll"))
    finally:
        connection.close()
    assert running.queue("orders").ready == 1


@pytest.mark.parametrize(
    "token",
    [
        jwt.encode({"sub": "svc", "aud": "rabbitmq", "exp": 2**33}, b"x" * 44, algorithm="HS256"),
        jwt.encode({"sub": "svc", "aud": "someone", "exp": 2**33}, SECRET, algorithm="HS256"),
        jwt.encode({"sub": "svc", "aud": "rabbitmq", "exp": 1}, SECRET, algorithm="HS256"),
    ],
    ids=["wrong key", "wrong audience", "expired"],
)
def test_a_token_that_does_not_verify_is_refused_at_login(
    make_server: Callable[..., RunningServer], token: str
) -> None:
    running = _server(make_server)
    with pytest.raises(ConnectionException, match="amqp:unauthorized-access"):
        _plain(running, "svc", token)
    # A password user still logs in beside it.
    _plain(running, "svc", "pw").close()


def test_a_connection_ends_when_its_token_expires(
    make_server: Callable[..., RunningServer],
) -> None:
    running = _server(make_server)
    connection = _plain(running, "svc", _token(lifetime=2))
    try:
        sender = connection.create_sender("/queues/orders")
        sender.send(Message(body="before"))
        with pytest.raises(ConnectionClosed, match=r"amqp:unauthorized-access.*credential expired"):
            connection.wait(lambda: False, timeout=15)
    finally:
        connection.close()
    wait_until(lambda: running.call(lambda: len(running.server.broker.connections)) == 0)
    assert running.queue("orders").ready == 1


def test_a_renewed_token_keeps_the_connection_past_the_first_expiry(
    make_server: Callable[..., RunningServer],
) -> None:
    running = _server(make_server)
    connection = _oauth(running, _token(lifetime=3))
    try:
        connection.refresh_token(_token(lifetime=120))
        time.sleep(4.5)
        publisher = connection.publisher(AddressHelper.queue_address("orders"))
        status = publisher.publish(RabbitMessage(body=Converter.string_to_bytes("after")))
        assert status.remote_state == OutcomeState.ACCEPTED
        publisher.close()
    finally:
        connection.close()
    assert running.queue("orders").ready == 1


@pytest.mark.parametrize(
    "renewal",
    [_token(sub="mallory"), jwt.encode({"exp": 2**33}, b"x" * 44, algorithm="HS256"), "garbage"],
    ids=["another user", "wrong key", "not a token"],
)
def test_a_renewal_that_does_not_verify_is_refused_and_the_connection_carries_on(
    make_server: Callable[..., RunningServer], renewal: str
) -> None:
    running = _server(make_server)
    connection = _oauth(running, _token())
    try:
        with pytest.raises(ValidationCodeException, match="401"):
            connection.refresh_token(renewal)
        publisher = connection.publisher(AddressHelper.queue_address("orders"))
        publisher.publish(RabbitMessage(body=Converter.string_to_bytes("still in")))
        publisher.close()
    finally:
        connection.close()
    assert running.queue("orders").ready == 1


def test_a_renewal_with_narrower_scopes_detaches_the_links_it_no_longer_allows(
    make_server: Callable[..., RunningServer],
) -> None:
    running = _server(make_server)
    connection = _plain(running, "svc", _token())
    management = _oauth(running, _token())
    try:
        connection.create_sender("/queues/orders-in").send(Message(body="1"))
        consumer = connection.create_receiver("/queues/orders-in", credit=0)
        sender = connection.create_sender("/queues/orders-out")
        assert running.queue("orders-in").consumers == 1
        narrower = "rabbitmq.write:*/orders* rabbitmq.configure:*/orders*"
        # A renewal applies to the connection that sends it: another one's links stay.
        management.refresh_token(_token(narrower))
        assert running.queue("orders-in").consumers == 1
        # The reply and the consumer's DETACH come in either order; a wait raises the DETACH.
        with pytest.raises(LinkDetached, match=r"unauthorized-access.*may not read"):
            _renew_on(connection, _token(narrower), then_wait=10)
        assert running.queue("orders-in").consumers == 0
        assert consumer.link.state & Endpoint.REMOTE_CLOSED
        sender.send(Message(body="2"))
    finally:
        connection.close()
        management.close()
    assert running.queue("orders-in").ready == 1
    assert running.queue("orders-out").ready == 1


def _renew_on(connection: BlockingConnection, token: str, then_wait: float = 0) -> None:
    """PUT /auth/tokens over a management pair of ``connection`` itself; expect 204, then let
    the connection take what else comes for ``then_wait`` seconds."""
    requests = connection.create_sender("/management", name="renewal")
    replies = connection.create_receiver("/management", name="renewal", credit=1)
    requests.send(
        Message(subject="PUT", address="/auth/tokens", body=token.encode(), reply_to="$me")
    )
    reply = replies.receive(timeout=10)
    assert reply.subject == "204"
    if then_wait:
        connection.wait(lambda: False, timeout=then_wait)


def test_a_password_login_renews_nothing_and_succeeds(
    make_server: Callable[..., RunningServer],
) -> None:
    running = _server(make_server)
    connection = _plain(running, "svc", "pw")
    try:
        _renew_on(connection, _token(sub="someone-else"))
        connection.create_sender("/queues/anything").send(Message(body="x"))
    finally:
        connection.close()
    assert running.queue("anything").ready == 1


def test_renewals_of_a_megabyte_are_refused_unread_and_others_are_served(
    make_server: Callable[..., RunningServer],
) -> None:
    # PyJWT checks a token's characters one by one, twice: a 1 MB renewal held the reactor
    # for about 0.6 s (eight answered in 4.5 s). Now one is refused before it is decoded.
    # The prober logs in anonymously, to its own queue only.
    anonymous = parse_users(
        {"anonymous": {"configure": "^prober$", "write": "^prober$", "read": "^prober$"}}
    )
    running = make_server(users={**_users(), **anonymous}, oauth2=_settings())
    header, _, signature = _token().encode().split(b".")
    body = header + b"." + b"A" * 1_000_000 + b"." + signature
    connection = _plain(running, "svc", _token())
    try:
        with Prober(running.url) as prober:
            prober.wait_rounds(2, timeout=30)
            before = len(prober.seen.rounds)
            requests = connection.create_sender("/management", name="renewal")
            replies = connection.create_receiver("/management", name="renewal", credit=8)
            for _ in range(8):
                requests.send(
                    Message(subject="PUT", address="/auth/tokens", body=body, reply_to="$me")
                )
            answers = [replies.receive(timeout=30) for _ in range(8)]
            prober.wait_rounds(len(prober.seen.rounds) + 3, timeout=30)
        rounds = prober.seen.rounds[before:]
        connection.create_sender("/queues/orders").send(Message(body="still in"))
    finally:
        connection.close()
    assert [(a.subject, "compact JWT" in str(a.body)) for a in answers] == [("401", True)] * 8
    assert prober.seen.failures == []
    assert len(rounds) >= 3
    assert running.queue("orders").ready == 1
