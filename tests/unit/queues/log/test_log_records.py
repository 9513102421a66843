"""Log records: every type round-trips, and damaged bytes are told apart (torn vs corrupt)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queues.codec import Symbol
from queues.log.records import (
    HEADER_SIZE,
    Arguments,
    Binding,
    CorruptRecord,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    MessagesChanged,
    QueueDeclared,
    QueueDeleted,
    RecordType,
    SegmentStart,
    TornRecord,
    decode_record,
    encode_binding,
    encode_exchange_declared,
    encode_exchange_deleted,
    encode_messages_changed,
    encode_queue_declared,
    encode_queue_deleted,
    encode_segment_start,
    enqueue_prefix,
    iter_records,
)


def test_every_record_type_round_trips() -> None:
    arguments: Arguments = {"x-queue-type": Symbol("stream"), "x-max-length-bytes": 1000}
    payload = b"\x00\x53\x77\xa1\x05hello"
    log = b"".join(
        [
            encode_segment_start(7, 42),
            encode_queue_declared("orders", arguments),
            encode_exchange_declared("amq.topic", "topic", {}),
            encode_binding("amq.topic", "orders", "a.*", {"x": True}, True),
            enqueue_prefix(42, "orders", 1_700_000_000_000, payload) + payload,
            encode_messages_changed(RecordType.ACQUIRE, [42]),
            encode_messages_changed(RecordType.SETTLE, [42, 43]),
            encode_binding("amq.topic", "orders", "a.*", {}, False),
            encode_exchange_deleted("amq.topic"),
            encode_queue_deleted("orders"),
        ]
    )
    records = [record for _, record in iter_records(log)]
    assert records[0] == SegmentStart(7, 42)
    assert records[1] == QueueDeclared("orders", arguments)
    assert records[2] == ExchangeDeclared("amq.topic", "topic", {})
    assert records[3] == Binding("amq.topic", "orders", "a.*", {"x": True}, True)
    enqueued = records[4]
    assert isinstance(enqueued, Enqueued)
    assert (enqueued.message_id, enqueued.queue, enqueued.timestamp) == (42, "orders", 1.7e12)
    assert bytes(enqueued.payload) == payload
    assert records[5] == MessagesChanged(RecordType.ACQUIRE, (42,))
    assert records[6] == MessagesChanged(RecordType.SETTLE, (42, 43))
    assert records[7] == Binding("amq.topic", "orders", "a.*", {}, False)
    assert records[8] == ExchangeDeleted("amq.topic")
    assert records[9] == QueueDeleted("orders")


def test_payload_offset_points_at_the_body_within_the_record() -> None:
    payload = b"body-bytes"
    record = enqueue_prefix(1, "q", 0, payload) + payload
    decoded, end = decode_record(record, 0)
    assert isinstance(decoded, Enqueued)
    assert end == len(record)
    assert record[decoded.payload_offset :] == payload


@given(st.binary(max_size=300), st.integers(0, 2**64 - 1), st.text(max_size=20))
def test_enqueue_round_trips_any_payload(payload: bytes, message_id: int, queue: str) -> None:
    record = enqueue_prefix(message_id, queue, 5, payload) + payload
    decoded, _ = decode_record(record, 0)
    assert isinstance(decoded, Enqueued)
    assert (decoded.message_id, decoded.queue, bytes(decoded.payload)) == (
        message_id,
        queue,
        payload,
    )


def test_a_record_cut_short_is_torn_at_every_length() -> None:
    record = encode_queue_declared("q", {"a": 1})
    for cut in range(len(record)):
        with pytest.raises(TornRecord):
            decode_record(record[:cut], 0)


@given(st.data())
def test_any_flipped_byte_is_detected(data: st.DataObject) -> None:
    payload = b"some message body"
    record = bytearray(enqueue_prefix(9, "queue", 1, payload) + payload)
    index = data.draw(st.integers(0, len(record) - 1))
    bit = data.draw(st.integers(0, 7))
    record[index] ^= 1 << bit
    # A flipped length may make the record look longer than the buffer (torn), or shorter or
    # impossible (corrupt); it never decodes.
    with pytest.raises((TornRecord, CorruptRecord)):
        decode_record(bytes(record), 0)


def test_an_unknown_type_with_a_valid_crc_is_corrupt() -> None:
    import struct
    import zlib

    typed = b"\x63body"
    record = struct.pack(">II", len(typed), zlib.crc32(typed)) + typed
    with pytest.raises(CorruptRecord, match="unknown record type 99"):
        decode_record(record, 0)


def test_an_absurd_length_is_corrupt_not_an_allocation() -> None:
    with pytest.raises(CorruptRecord, match="impossible record length"):
        decode_record(b"\xff\xff\xff\xff" + b"\x00" * (HEADER_SIZE - 4), 0)
