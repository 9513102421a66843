"""Token renewals are verified on the login workers, not the reactor (gateway/renewal.py).

A raw client renews over its own ``/management`` pair, so that two requests reach the server in
one read: the first is being verified when the second is handled, whatever the machine's speed
(a verdict comes back through the reactor's wake-up, in a later pass).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import proton
from integration.conftest import RunningServer
from integration.test_token_logins import _server, _token
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.gateway.state import ConnectionState


def _renewal(token: str, message_id: str) -> bytes:
    message = proton.Message(
        id=message_id, subject="PUT", address="/auth/tokens", body=token.encode(), reply_to="$me"
    )
    encoded: bytes = message.encode()
    return encoded


@contextmanager
def _pair(running: RunningServer, token: str, name: str) -> Iterator[tuple[RawClient, int]]:
    """A raw connection logged in with ``token`` and its management pair: (client, requests)."""
    client = RawClient.connect(running.host, running.port, plain=("svc", token), container_id=name)
    with client:
        client.begin()
        requests = client.attach("renewal", "sender", target="/management")
        replies = client.attach("renewal", "receiver", source="/management")
        client.wait_attach(requests)
        client.wait_attach(replies)
        client.flow(replies, link_credit=8)
        client.wait_credit(requests)
        yield client, requests


def _reply(client: RawClient) -> proton.Message:
    delivery = client.next_message(timeout=10)
    assert delivery is not None
    message = proton.Message()
    message.decode(delivery.payload)
    return message


def test_a_renewal_sent_while_another_verifies_is_refused_and_replies_keep_their_order(
    make_server: Callable[..., RunningServer],
) -> None:
    running = _server(make_server)
    with _pair(running, _token(), "renews-twice") as (client, requests):
        with client.corked():
            client.send(requests, _renewal(_token(lifetime=120), "first"))
            client.send(requests, _renewal(_token(lifetime=180), "second"))
        first, second = _reply(client), _reply(client)
        assert (first.correlation_id, first.subject) == ("first", "204")
        assert (second.correlation_id, second.subject) == ("second", "503")
        assert "being verified" in str(second.body)
        # Once answered, the next is verified; a token that does not verify says why.
        client.send(requests, _renewal(_token(lifetime=240), "third"))
        third = _reply(client)
        assert (third.correlation_id, third.subject) == ("third", "204")
        client.send(requests, _renewal(_token(sub="svc", aud="elsewhere"), "fourth"))
        fourth = _reply(client)
        assert (fourth.correlation_id, fourth.subject) == ("fourth", "401")
        assert "invalid token: " in str(fourth.body)
        client.send(requests, _renewal(_token(sub="someone-else"), "fifth"))
        fifth = _reply(client)
        assert fifth.subject == "401"
        assert "not 'svc'" in str(fifth.body)


def test_a_connection_closed_while_its_renewal_verifies_leaves_nothing(
    make_server: Callable[..., RunningServer],
) -> None:
    running = _server(make_server)
    broker = running.server.broker

    def state_of(name: str) -> ConnectionState | None:
        for state in broker.connections:
            assert isinstance(state, ConnectionState)
            if state.connection.remote_container == name:
                return state
        return None

    def record() -> weakref.ref[ConnectionState]:
        state = state_of("leaves-verifying")
        assert state is not None
        return weakref.ref(state)

    with _pair(running, _token(), "leaves-verifying") as (client, requests):
        state = running.call(record)
        client.send(requests, _renewal(_token(lifetime=120), "renewal"))
    wait_until(lambda: running.call(lambda: state_of("leaves-verifying")) is None)
    wait_until(lambda: running.call(lambda: not broker.links._renewing))
    # Freed by reference counting: no verdict, ticket or reply keeps it.
    wait_until(lambda: running.call(state) is None)
    assert running.call(lambda: running.server.logins.statistics().waiting) == 0
