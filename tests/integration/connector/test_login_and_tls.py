"""The connector's connections to a gateway that wants a password over TLS (no Spark here).

A real server with ``[users]``, anonymous logins off and an amqps:// listener; the connector's
own readers, called directly, read through TLS at volume. Spark's side is in
``test_spark_security.py``.
"""

from __future__ import annotations

import functools
import logging
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from integration.conftest import RunningServer
from pyspark.sql.types import BinaryType, StructField, StructType
from support.certificates import self_signed

from sluicegate.gateway.rules.auth import User, hash_password, parse_users
from sluicegate.spark.amqp import AmqpConnection, AuthenticationError
from sluicegate.spark.browse import browse
from sluicegate.spark.options import ReadOptions, parse_read_options, parse_write_options
from sluicegate.spark.records import COLUMNS
from sluicegate.spark.sink import check_sink_schema, send_partition
from sluicegate.spark.stream_source import OffsetRange, read_range
from sluicegate.transport.channel import TlsError

PASSWORD = "s3cret-Hors3"


@functools.cache
def _users() -> dict[str, User]:
    """One user allowed everything, hashed once (scrypt costs tens of milliseconds)."""
    return parse_users({"spark": {"password_hash": hash_password(PASSWORD)}})


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(tmp_path, "localhost", "DNS:localhost,IP:127.0.0.1")


@pytest.fixture
def secured(
    make_server: Callable[..., RunningServer], certificate: tuple[Path, Path], tmp_path: Path
) -> RunningServer:
    """A gateway that accepts only PLAIN logins, on a plain and an amqps:// listener."""
    cert, key = certificate
    return make_server(
        users=_users(),
        anonymous_login="off",
        tls_cert_file=cert,
        tls_key_file=key,
        tls_listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
    )


def _send(raw: dict[str, str], bodies: list[bytes]) -> int:
    """Send ``bodies`` with the connector's sink, outside Spark; how many were accepted."""
    batch = pa.RecordBatch.from_arrays([pa.array(bodies, pa.binary())], names=["body"])
    options = parse_write_options(raw, streaming=False)
    columns = check_sink_schema(StructType([StructField("body", BinaryType())]))
    return send_partition(options, columns, "test", iter([batch])).count


def _tls_options(running: RunningServer, ca: Path, **extra: str) -> ReadOptions:
    raw = {
        "url": f"amqps://127.0.0.1:{running.server.tls_port}",
        "address": "/queues/secured",
        "username": "spark",
        "password": PASSWORD,
        "tlsCaFile": str(ca),
        "connectAttempts": "6",
        "mode": "browse",
        **extra,
    }
    return parse_read_options(raw, streaming=False)


@pytest.fixture
def login_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.WARNING, logger="sluicegate.gate"):
        yield caplog


def test_a_browse_over_tls_with_a_password_reads_every_message(
    secured: RunningServer, certificate: tuple[Path, Path]
) -> None:
    """Enough 4 KiB messages that TLS records and proton's input buffer both fill up.

    The sink bursts them over TLS: the gateway once pushed a whole decrypted read into proton
    past its capacity and dropped the connection (gateway/gate.py now feeds it in pieces).
    """
    bodies = [bytes([n % 251]) * 4096 for n in range(3_000)]
    options = _tls_options(secured, certificate[0])
    raw = {
        "url": options.endpoint.url,
        "address": "/queues/secured",
        "username": "spark",
        "password": PASSWORD,
        "tlsCaFile": str(certificate[0]),
    }
    assert _send(raw, bodies) == 3_000
    batches = list(browse(options, COLUMNS))
    read = [body for batch in batches for body in batch.column("body").to_pylist()]
    assert read == bodies
    assert secured.queue("secured").ready == 3_000


def test_a_stream_range_and_the_sink_over_tls(
    secured: RunningServer, certificate: tuple[Path, Path]
) -> None:
    secured.call(
        lambda: secured.server.registry.declare_queue("events", {"x-queue-type": "stream"})
    )
    raw = {
        "url": f"amqps://localhost:{secured.server.tls_port}",
        "address": "/queues/events",
        "username": "spark",
        "password": PASSWORD,
        "tlsCaFile": str(certificate[0]),
    }
    payloads = [f"event-{n}".encode() for n in range(2_000)]
    assert _send(raw, payloads) == 2_000
    options = parse_read_options({**raw, "mode": "stream"}, streaming=False)
    rows = [
        row
        for batch in read_range(options, COLUMNS, OffsetRange(500, 1_500))
        for row in batch.select(["offset", "body"]).to_pylist()
    ]
    assert [row["offset"] for row in rows] == list(range(500, 1_500))
    assert [row["body"] for row in rows] == payloads[500:1_500]


def test_a_wrong_password_fails_at_once_naming_the_condition_and_never_the_password(
    secured: RunningServer, certificate: tuple[Path, Path], login_log: pytest.LogCaptureFixture
) -> None:
    options = _tls_options(secured, certificate[0], password="not-" + PASSWORD)
    with pytest.raises(AuthenticationError, match="amqp:unauthorized-access") as refused:
        AmqpConnection.open(options.endpoint)
    message = str(refused.value)
    assert "'spark'" in message
    assert PASSWORD not in message
    assert "not-" not in message
    # Refused once, not retried connectAttempts times: a password does not get better.
    refusals = [r for r in login_log.records if "login refused" in r.getMessage()]
    assert len(refusals) == 1


def test_without_credentials_an_anonymous_login_is_refused_where_the_gateway_allows_none(
    secured: RunningServer,
) -> None:
    options = parse_read_options(
        {"url": secured.url, "address": "/queues/secured", "mode": "browse"}, streaming=False
    )
    with pytest.raises(AuthenticationError, match="amqp:unauthorized-access") as refused:
        AmqpConnection.open(options.endpoint)
    assert "anonymously" in str(refused.value)


def test_plain_on_a_plain_listener_logs_in(secured: RunningServer) -> None:
    raw = {"url": secured.url, "address": "/queues/plain", "username": "spark"}
    assert _send({**raw, "password": PASSWORD}, [b"x"]) == 1
    assert secured.queue("plain").ready == 1


def test_a_certificate_from_an_unknown_issuer_is_refused_with_the_reason(
    secured: RunningServer, tmp_path: Path
) -> None:
    stranger, _ = self_signed(tmp_path, "stranger", "DNS:localhost")
    options = _tls_options(secured, stranger)
    with pytest.raises(TlsError, match="self-signed certificate") as refused:
        AmqpConnection.open(options.endpoint)
    assert str(secured.server.tls_port) in str(refused.value)


def test_a_certificate_for_another_host_name_is_refused_unless_the_check_is_off(
    make_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path, "elsewhere", "DNS:elsewhere.example")
    running = make_server(
        users=_users(), tls_cert_file=cert, tls_key_file=key, tls_listen="127.0.0.1:0"
    )
    with pytest.raises(TlsError, match=r"mismatch, certificate is not valid for '127\.0\.0\.1'"):
        AmqpConnection.open(_tls_options(running, cert).endpoint)
    options = _tls_options(running, cert, tlsVerifyHostname="false")
    AmqpConnection.open(options.endpoint).close()


def test_tls_to_a_plain_listener_fails_instead_of_hanging(secured: RunningServer) -> None:
    raw = {"url": secured.url, "address": "/queues/x", "tls": "true", "mode": "browse"}
    with pytest.raises(TlsError, match="TLS handshake"):
        AmqpConnection.open(parse_read_options(raw, streaming=False).endpoint)


def test_the_options_travel_to_executors_with_the_password_but_never_show_it(
    secured: RunningServer, certificate: tuple[Path, Path]
) -> None:
    options = _tls_options(secured, certificate[0])
    assert PASSWORD not in repr(options)
    assert PASSWORD not in str(options.endpoint)
    shipped = pickle.loads(pickle.dumps(options))
    assert shipped == options
    AmqpConnection.open(shipped.endpoint).close()


def test_a_missing_ca_file_is_named_before_anything_connects(tmp_path: Path) -> None:
    raw = {
        "url": "amqps://127.0.0.1:1",
        "address": "/queues/x",
        "tlsCaFile": str(tmp_path / "missing.pem"),
        "mode": "browse",
    }
    with pytest.raises(TlsError, match="option tlsCaFile: cannot load"):
        AmqpConnection.open(parse_read_options(raw, streaming=False).endpoint)
