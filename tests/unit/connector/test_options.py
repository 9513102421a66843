"""Strict option parsing: every mistake is an error that names the option."""

from __future__ import annotations

import pickle

import pytest

from sluicegate.spark.options import (
    AMQPS_PORT,
    DEFAULT_CREDIT,
    Mode,
    OffsetKind,
    OffsetSpec,
    OptionError,
    Secret,
    Tls,
    parse_read_options,
    parse_write_options,
)

BASE = {"url": "amqp://127.0.0.1:5673", "address": "/queues/q"}


def test_a_streaming_read_defaults_to_queue_mode_with_the_large_window() -> None:
    options = parse_read_options(BASE, streaming=True)
    assert options.mode is Mode.QUEUE
    assert options.credit == DEFAULT_CREDIT
    assert (options.endpoint.host, options.endpoint.port) == ("127.0.0.1", 5673)
    assert options.max_records_per_trigger is None


def test_the_default_window_holds_three_batches_of_max_records_per_trigger() -> None:
    """One batch in Spark's hands, the next ones arriving: a batch's credit returns at its
    commit."""
    large = parse_read_options({**BASE, "maxRecordsPerTrigger": "80000"}, streaming=True)
    assert large.credit == 3 * 80_000
    small = parse_read_options({**BASE, "maxRecordsPerTrigger": "1000"}, streaming=True)
    assert small.credit == DEFAULT_CREDIT
    given = {**BASE, "maxRecordsPerTrigger": "80000", "credit": "90000"}
    assert parse_read_options(given, streaming=True).credit == 90_000


def test_a_batch_read_defaults_to_browse() -> None:
    assert parse_read_options(BASE, streaming=False).mode is Mode.BROWSE


def test_option_names_are_case_insensitive_as_spark_passes_them() -> None:
    options = parse_read_options({**BASE, "maxrecordspertrigger": "7"}, streaming=True)
    assert options.max_records_per_trigger == 7


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"maxRecordPerTrigger": "10"}, "maxRecordPerTrigger"),
        ({"credit": "lots"}, "credit"),
        ({"credit": "0"}, "credit"),
        ({"mode": "drain"}, "mode"),
        ({"startingOffsets": "yesterday"}, "startingOffsets"),
        ({"maxBytesPerTrigger": "-1"}, "maxBytesPerTrigger"),
        ({"endingOffsets": "10"}, "endingOffsets"),  # batch only
        ({"url": "http://127.0.0.1"}, "url"),
        ({"url": "amqp://127.0.0.1/queues/q"}, "url"),
        ({"address": " "}, "address"),
    ],
)
def test_a_bad_streaming_option_is_named(extra: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        parse_read_options({**BASE, **extra}, streaming=True)


def test_a_destructive_batch_read_is_refused() -> None:
    with pytest.raises(OptionError, match="browse"):
        parse_read_options({**BASE, "mode": "queue"}, streaming=False)


def test_a_queue_only_option_is_refused_for_a_stream_read() -> None:
    with pytest.raises(OptionError, match="credit does not apply"):
        parse_read_options({**BASE, "mode": "stream", "credit": "10"}, streaming=True)


def test_offset_specs() -> None:
    assert OffsetSpec.parse("o", "EARLIEST") == OffsetSpec(OffsetKind.EARLIEST)
    assert OffsetSpec.parse("o", "42") == OffsetSpec(OffsetKind.OFFSET, 42)
    assert OffsetSpec.parse("o", "2026-11-22T10:00:00+00:00") == OffsetSpec(
        OffsetKind.TIMESTAMP, 1_795_341_600_000
    )
    with pytest.raises(OptionError, match="time zone"):
        OffsetSpec.parse("o", "2026-11-22T10:00:00")


def test_a_streaming_write_takes_sparks_checkpoint_location_but_a_batch_write_does_not() -> None:
    parse_write_options({**BASE, "checkpointLocation": "/tmp/x"}, streaming=True)
    with pytest.raises(OptionError, match="checkpointlocation"):
        parse_write_options({**BASE, "checkpointlocation": "/tmp/x"}, streaming=False)
    with pytest.raises(OptionError, match="credit"):
        parse_write_options({**BASE, "credit": "10"}, streaming=True)


# -- logins and TLS ----------------------------------------------------------------------------


def test_credentials_and_tls_from_an_amqps_url() -> None:
    raw = {
        "url": "amqps://broker.example",
        "address": "/queues/q",
        "username": "spark",
        "password": "pa55",
        "tlsCaFile": "/etc/ca.pem",
    }
    endpoint = parse_read_options(raw, streaming=True).endpoint
    assert endpoint.port == AMQPS_PORT
    assert endpoint.tls == Tls(ca_file="/etc/ca.pem", verify_hostname=True)
    assert endpoint.credentials is not None
    assert endpoint.credentials.username == "spark"
    assert endpoint.credentials.password.reveal() == "pa55"
    assert endpoint.url == "amqps://broker.example:5671"
    ipv6 = parse_read_options({**raw, "url": "amqps://[::1]:5999"}, streaming=True).endpoint
    assert (ipv6.host, ipv6.url) == ("::1", "amqps://[::1]:5999")


def test_tls_true_on_an_amqp_url_keeps_an_explicit_port() -> None:
    endpoint = parse_write_options({**BASE, "tls": "TRUE"}, streaming=False).endpoint
    assert (endpoint.port, endpoint.tls) == (5673, Tls(ca_file=None, verify_hostname=True))
    endpoint = parse_write_options(
        {"url": "amqp://h", "address": "/q", "tls": "true", "tlsVerifyHostname": "false"},
        streaming=False,
    ).endpoint
    assert (endpoint.port, endpoint.tls) == (AMQPS_PORT, Tls(None, verify_hostname=False))
    plain = parse_write_options({**BASE, "tls": "false"}, streaming=False).endpoint
    assert plain.tls is None
    assert plain.credentials is None


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"password": "x"}, "option username is required"),
        ({"username": "spark"}, "option password is required"),
        ({"username": "a\0b", "password": "x"}, "NUL"),
        ({"tls": "maybe"}, "option tls: expected true or false"),
        ({"tlsCaFile": "/ca.pem"}, "tlsCaFile applies only with TLS"),
        ({"tlsVerifyHostname": "false"}, "tlsVerifyHostname applies only with TLS"),
        ({"tls": "true", "tlsVerifyHostname": "sometimes"}, "tlsVerifyHostname"),
        ({"tls": "true", "tlsCaFile": " "}, "tlsCaFile"),
        ({"url": "amqps://h", "tls": "false"}, "contradicts"),
        ({"tlsCertFile": "/c.pem"}, "tlsCertFile"),  # the gateway asks for no client certificate
    ],
)
def test_a_bad_login_or_tls_option_is_named(extra: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        parse_read_options({**BASE, **extra}, streaming=True)


def test_the_password_never_shows_in_a_repr_or_an_error() -> None:
    secret = "hunter2-Very-Secret"
    options = parse_read_options({**BASE, "username": "u", "password": secret}, streaming=True)
    assert secret not in repr(options)
    assert secret not in str(options.endpoint.credentials)
    assert f"{options.endpoint.credentials}".count("***") == 1
    assert pickle.loads(pickle.dumps(options)) == options
    for url in (f"amqp://u:{secret}@h", f"amqps://u:{secret}@h/queues/q", f"ftp://u:{secret}@h"):
        with pytest.raises(OptionError, match="option url") as refused:
            parse_read_options({**BASE, "url": url}, streaming=True)
        assert secret not in str(refused.value)
    with pytest.raises(OptionError) as refused:
        parse_read_options(
            {**BASE, "username": "u", "password": secret, "credit": "x"}, streaming=True
        )
    assert secret not in str(refused.value)


def test_a_secret_compares_and_hashes_by_value_without_showing_it() -> None:
    assert Secret("a") == Secret("a") != Secret("b")
    assert hash(Secret("a")) == hash(Secret("a"))
    assert str(Secret("a")) == repr(Secret("a")) == "Secret('***')"
