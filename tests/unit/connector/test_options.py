"""Strict option parsing: every mistake is an error that names the option."""

from __future__ import annotations

import pytest

from spark.options import (
    DEFAULT_CREDIT,
    Mode,
    OffsetKind,
    OffsetSpec,
    OptionError,
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
