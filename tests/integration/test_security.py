"""Authentication (SASL PLAIN against hashed passwords, ANONYMOUS where allowed), authorisation
(configure / write / read patterns) and TLS, with real clients over loopback (issue 10 §4, §5)."""

from __future__ import annotations

import functools
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import RunningServer
from proton import ConnectionException, Message, SSLDomain, symbol, ubyte
from proton.utils import BlockingConnection, LinkDetached
from support.certificates import self_signed
from support.clients import publish
from support.frames import (
    AMQP_HEADER,
    SASL_FRAME,
    SASL_HEADER,
    described,
    encode_frame,
    parse_frame,
)
from support.polling import wait_until
from support.raw_client import ProtocolError, RawClient

from sluicegate.gateway import login as login_module
from sluicegate.gateway.rare_warning import CLIENT_BURST
from sluicegate.gateway.rules.auth import User, check_plain, hash_password, parse_users

ALICE_PASSWORD = "correct horse"


@functools.cache
def _users() -> dict[str, User]:
    """The test users, hashed once: each scrypt hash costs tens of milliseconds."""
    return parse_users(
        {
            "alice": {
                "password_hash": hash_password(ALICE_PASSWORD),
                "configure": "^(orders|inbox-[a-z]+)$",
                "write": "^orders$",
                "read": "^inbox-",
            },
            "root": {
                "password_hash": hash_password("root-pw"),
                "configure": ".*",
                "write": ".*",
                "read": ".*",
            },
        }
    )


def _connect(url: str, **options: Any) -> BlockingConnection:
    return BlockingConnection(url, timeout=10, **options)


def _plain(running: RunningServer, user: str, password: str) -> BlockingConnection:
    return _connect(
        running.url,
        user=user,
        password=password,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )


def _sasl_exchange(port: int, init: bytes) -> bytes:
    """Send a SASL header and ``init``; return every byte the server sent until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(SASL_HEADER + init)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _sasl_init(mechanism: str, response: bytes) -> bytes:
    body = described("sasl_init", mechanism=symbol(mechanism), initial_response=response)
    return encode_frame(0, body, frame_type=SASL_FRAME)


# -- authentication --------------------------------------------------------------------------


def test_plain_with_the_right_password_logs_in(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(users=_users())
    connection = _plain(running, "alice", ALICE_PASSWORD)
    try:
        sender = connection.create_sender("/queues/orders")
        sender.send(Message(body="paid"))
    finally:
        connection.close()
    assert running.queue("orders").ready == 1


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("mallory", "x"), ("", "")])
def test_plain_with_wrong_credentials_is_refused_and_nothing_else_leaks(
    make_server: Callable[..., RunningServer], user: str, password: str
) -> None:
    running = make_server(users=_users())
    with pytest.raises(ConnectionException, match="amqp:unauthorized-access"):
        _plain(running, user, password)
    answer = _sasl_exchange(running.port, _sasl_init("PLAIN", f"\0{user}\0{password}".encode()))
    # sasl-mechanisms, sasl-outcome{code = auth (1)}, then the end of the connection: no OPEN,
    # no additional data, no reason.
    assert answer.startswith(SASL_HEADER)
    buffer = bytearray(answer[len(SASL_HEADER) :])
    frames = []
    while (frame := parse_frame(buffer, 65536)) is not None:
        frames.append(frame)
    assert not buffer
    assert [f.performative for f in frames] == ["sasl_mechanisms", "sasl_outcome"]
    assert frames[1]["code"] == 1
    assert frames[1]["additional_data"] is None
    assert running.call(lambda: len(running.server.broker.connections)) == 0


def test_a_loop_of_refused_logins_writes_a_burst_of_lines_not_one_each(
    make_server: Callable[..., RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Three bursts' worth of refused logins, in less than two intervals: each is refused,
    and the log says so at most twice a burst, not once per attempt (gateway/rare_warning.py;
    the burst is the process's, so other tests' refusals may have taken some of it)."""
    running = make_server(users=_users())
    with caplog.at_level(logging.INFO, logger="sluicegate"):
        for _ in range(3 * CLIENT_BURST):
            answer = _sasl_exchange(running.port, _sasl_init("PLAIN", b"\0alice\0wrong"))
            assert answer.startswith(SASL_HEADER)
    refusals = [r for r in caplog.records if "login refused" in r.getMessage()]
    assert 1 <= len(refusals) <= 2 * CLIENT_BURST


def _users_and_anonymous() -> dict[str, User]:
    """The test users and an anonymous user who may read ``public``."""
    return {
        **_users(),
        **parse_users({"anonymous": {"configure": "", "write": "", "read": "^public$"}}),
    }


def test_a_loopback_listener_offers_anonymous_and_plain(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(users=_users_and_anonymous())
    with RawClient.connect(running.host, running.port) as anonymous:
        anonymous.begin()
    with RawClient.connect(running.host, running.port, plain=("root", "root-pw")) as root:
        root.begin()
    with RawClient.connect(running.host, running.port, sasl=False) as _:
        pass  # a client without SASL is an anonymous one, allowed here
    with socket.create_connection((running.host, running.port), timeout=10) as sock:
        sock.sendall(SASL_HEADER)
        buffer = bytearray()
        while (frame := parse_frame(buffer[len(SASL_HEADER) :], 65536)) is None:
            buffer += sock.recv(65536)
    assert frame["sasl_server_mechanisms"] == ["PLAIN", "ANONYMOUS"]


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"anonymous_login": "off"}, id="anonymous_login-off"),
        pytest.param({}, id="users-without-an-anonymous-user"),
        pytest.param({"anonymous_login": "on"}, id="on-but-users-without-an-anonymous-user"),
    ],
)
def test_anonymous_logins_are_refused_where_off_or_once_users_exist(
    make_server: Callable[..., RunningServer], settings: dict[str, str]
) -> None:
    """Secure by default: once users are configured, an anonymous client needs a user too."""
    users = _users_and_anonymous() if settings == {"anonymous_login": "off"} else _users()
    running = make_server(users=users, **settings)
    with pytest.raises(ProtocolError, match="does not offer SASL ANONYMOUS"):
        RawClient.connect(running.host, running.port)
    answer = _sasl_exchange(running.port, _sasl_init("ANONYMOUS", b""))
    outcome = described("sasl_outcome", code=ubyte(1))
    assert answer.endswith(encode_frame(0, outcome, frame_type=SASL_FRAME))
    # §5.3.1: a client that skips SASL gets the SASL header, then the connection ends.
    with socket.create_connection((running.host, running.port), timeout=10) as sock:
        sock.sendall(AMQP_HEADER)
        assert sock.recv(100) == SASL_HEADER
        assert sock.recv(100) == b""
    with RawClient.connect(running.host, running.port, plain=("root", "root-pw")) as root:
        root.begin()


def test_anonymous_loopback_means_only_on_a_loopback_listener() -> None:
    from sluicegate.gateway.listener import anonymous_allowed

    assert anonymous_allowed("loopback", "127.0.0.1")
    assert anonymous_allowed("loopback", "::1")
    assert anonymous_allowed("loopback", "localhost")
    assert not anonymous_allowed("loopback", "0.0.0.0")
    assert not anonymous_allowed("loopback", "10.1.2.3")
    assert anonymous_allowed("on", "0.0.0.0")
    assert not anonymous_allowed("off", "127.0.0.1")


# -- authorisation ---------------------------------------------------------------------------


def test_forbidden_attaches_are_refused_and_the_connection_carries_on(
    make_server: Callable[..., RunningServer],
) -> None:
    running = make_server(users=_users())
    with RawClient.connect(running.host, running.port, plain=("alice", ALICE_PASSWORD)) as alice:
        alice.begin()
        refusals = {
            "write elsewhere": alice.attach("w", "sender", target="/queues/inbox-alice"),
            "read elsewhere": alice.attach("r", "receiver", source="/queues/orders"),
            "declare elsewhere": alice.attach("c", "receiver", source="/queues/inbox-other!"),
        }
        # "inbox-other!" fails configure, not read: it does not exist and alice may not declare it.
        for what, handle in refusals.items():
            attached = alice.wait_attach(handle)
            assert attached.error is not None, what
            assert attached.error["condition"] == "amqp:unauthorized-access", what
        exchange = alice.wait_attach(alice.attach("x", "sender", target="/exchanges/amq.topic/k"))
        assert exchange.error is not None
        assert exchange.error["condition"] == "amqp:unauthorized-access"
        assert "exchange 'amq.topic'" in exchange.error["description"]
        relay = alice.wait_attach(alice.attach("null", "sender"))
        assert relay.error is not None
        assert relay.error["condition"] == "amqp:unauthorized-access"
        allowed = alice.attach("ok", "sender", target="/queues/orders")
        assert alice.wait_attach(allowed).error is None
        alice.wait_credit(allowed)
        delivery = alice.send(allowed, Message(body="fine").encode())
        outcome = alice.wait_outcomes([delivery])[delivery]
        assert outcome is not None
        assert outcome.name == "accepted"
        reader = alice.attach("in", "receiver", source="/queues/inbox-alice")
        assert alice.wait_attach(reader).error is None
    assert running.queue("orders").ready == 1
    assert running.call(lambda: running.server.registry.get("inbox-other!")) is None


def test_the_anonymous_user_of_the_config_limits_anonymous_clients(
    make_server: Callable[..., RunningServer],
) -> None:
    users = parse_users({"anonymous": {"configure": "", "write": "^public$", "read": ""}})
    running = make_server(users=users)
    with RawClient.connect(running.host, running.port) as client:
        client.begin()
        refused = client.attach("r", "receiver", source="/queues/public")
        attached = client.wait_attach(refused)
        assert attached.error is not None
        assert attached.error["condition"] == "amqp:unauthorized-access"


# -- TLS -------------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1."""
    return self_signed(tmp_path, "localhost", "DNS:localhost,IP:127.0.0.1")


def _client_domain(cert: Path) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(cert))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, str(cert))
    return domain


def test_amqps_with_a_certificate_from_the_config(
    make_server: Callable[..., RunningServer], certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    running = make_server(
        users=_users(), tls_cert_file=cert, tls_key_file=key, tls_listen="127.0.0.1:0"
    )
    port = running.server.tls_port
    assert port is not None
    url = f"amqps://localhost:{port}"
    connection = _connect(
        url,
        ssl_domain=_client_domain(cert),
        user="root",
        password="root-pw",
        allowed_mechs="PLAIN",
    )
    try:
        sender = connection.create_sender("/queues/secret")
        for n in range(200):
            sender.send(Message(body=f"s{n}" * 1000))
        receiver = connection.create_receiver("/queues/secret", credit=50)
        bodies = []
        for _ in range(200):
            bodies.append(receiver.receive(timeout=10).body)
            receiver.accept()
    finally:
        connection.close()
    assert bodies == [f"s{n}" * 1000 for n in range(200)]
    assert running.queue("secret").ready == 0


def test_a_burst_over_tls_reaches_the_queue_whole(
    make_server: Callable[..., RunningServer], certificate: tuple[Path, Path]
) -> None:
    """One TLS read decrypts more than proton's input capacity: it is fed in pieces, not
    refused (proton raised OverflowError and the connection was dropped)."""
    cert, key = certificate
    running = make_server(
        users=_users(), tls_cert_file=cert, tls_key_file=key, tls_listen="127.0.0.1:0"
    )
    bodies = [bytes([n % 251]) * 4096 for n in range(2_000)]
    published = publish(
        f"amqps://localhost:{running.server.tls_port}",
        "/queues/burst",
        bodies,
        connect={
            "ssl_domain": _client_domain(cert),
            "user": "root",
            "password": "root-pw",
            "allowed_mechs": "PLAIN",
        },
    )
    assert published.outcomes == ["accepted"] * 2_000
    assert running.queue("burst").ready == 2_000


def test_plain_text_on_the_amqps_port_gets_nowhere(
    make_server: Callable[..., RunningServer], certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    running = make_server(tls_cert_file=cert, tls_key_file=key, tls_listen="127.0.0.1:0")
    port = running.server.tls_port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(SASL_HEADER)
        answer = sock.recv(100)
    assert SASL_HEADER not in answer
    # The plain listener still serves.
    with RawClient.connect(running.host, running.port) as client:
        client.begin()


def test_a_password_check_does_not_hold_up_other_clients(
    make_server: Callable[..., RunningServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check runs on a login thread: here it waits until another client was served."""

    running = make_server(users=_users_and_anonymous())
    others_served = threading.Event()
    threads: list[str] = []

    def slow_check(users: Mapping[str, User], name: str, password: bytes) -> User | None:
        threads.append(threading.current_thread().name)
        assert others_served.wait(30), "the reactor was blocked by the password check"
        return check_plain(users, name, password)

    monkeypatch.setattr(login_module, "check_plain", slow_check)
    result: list[RawClient] = []
    login = threading.Thread(
        target=lambda: result.append(
            RawClient.connect(running.host, running.port, plain=("root", "root-pw"), timeout=60)
        )
    )
    login.start()
    try:
        wait_until(lambda: bool(threads))
        with RawClient.connect(running.host, running.port) as anonymous:
            anonymous.begin()
        others_served.set()
        login.join(timeout=60)
        assert len(result) == 1
        result[0].begin()
    finally:
        others_served.set()
        for client in result:
            client.abort()
    assert threads[0].startswith("sluicegate-login")


# RabbitMQ names a certificate's user by its subject, last RDN first (RFC 4514).
CLIENT_SUBJECT = "O=client,CN=localhost"


def _external_server(
    make_server: Callable[..., RunningServer], tmp_path: Path, certificate: tuple[Path, Path]
) -> tuple[RunningServer, Path, Path]:
    cert, key = certificate
    client_cert, client_key = self_signed(
        tmp_path, "client", "DNS:client", subject="/CN=localhost/O=client"
    )
    users = {
        **_users(),
        **parse_users(
            {CLIENT_SUBJECT: {"password_hash": "", "configure": "", "write": "", "read": "^inbox-"}}
        ),
    }
    running = make_server(
        users=users,
        tls_cert_file=cert,
        tls_key_file=key,
        tls_listen="127.0.0.1:0",
        tls_ca_file=client_cert,
    )
    return running, client_cert, client_key


def _external(running: RunningServer, server_cert: Path, client: tuple[Path, Path]) -> Any:
    domain = _client_domain(server_cert)
    domain.set_credentials(str(client[0]), str(client[1]), None)
    return _connect(
        f"amqps://localhost:{running.server.tls_port}", ssl_domain=domain, allowed_mechs="EXTERNAL"
    )


def test_external_logs_in_as_the_user_its_certificate_names(
    make_server: Callable[..., RunningServer], tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    running, client_cert, client_key = _external_server(make_server, tmp_path, certificate)
    connection = _external(running, certificate[0], (client_cert, client_key))
    try:
        names = running.call(
            lambda: [c.user.name for c in running.server.broker.connections if c.user]
        )
        assert names == [CLIENT_SUBJECT]
        running.call(lambda: running.server.registry.declare_queue("inbox-x"))
        connection.create_receiver("/queues/inbox-x", credit=1)
        with pytest.raises(LinkDetached, match="unauthorized-access"):
            connection.create_sender("/queues/orders")
    finally:
        connection.close()


def test_external_without_a_user_for_the_certificate_or_without_one_is_refused(
    make_server: Callable[..., RunningServer], tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    running, _, _ = _external_server(make_server, tmp_path, certificate)
    # A certificate the server's CAs do not vouch for: no EXTERNAL for it.
    stranger = self_signed(tmp_path, "stranger", "DNS:x", subject="/CN=localhost/O=client")
    with pytest.raises(ConnectionException, match=r"unauthorized-access|SSL"):
        _external(running, certificate[0], stranger)
    # No certificate at all: EXTERNAL is not offered; PLAIN still works on the same listener.
    with pytest.raises(ConnectionException):
        _connect(
            f"amqps://localhost:{running.server.tls_port}",
            ssl_domain=_client_domain(certificate[0]),
            allowed_mechs="EXTERNAL",
        )
    _connect(
        f"amqps://localhost:{running.server.tls_port}",
        ssl_domain=_client_domain(certificate[0]),
        user="root",
        password="root-pw",
        allowed_mechs="PLAIN",
    ).close()
    # The certificate's user has no password: PLAIN never logs it in.
    with pytest.raises(ConnectionException, match="unauthorized-access"):
        _connect(
            f"amqps://localhost:{running.server.tls_port}",
            ssl_domain=_client_domain(certificate[0]),
            user=CLIENT_SUBJECT,
            password="",
            allowed_mechs="PLAIN",
        )
