"""Log records: every type round-trips, and damaged bytes are told apart (torn vs corrupt)."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.queues.log.decoding import CorruptRecord, TornRecord, decode_record, iter_records
from sluicegate.queues.log.records import (
    HEADER_SIZE,
    Arguments,
    Binding,
    DeliveryCounts,
    Enqueued,
    ExchangeDeclared,
    ExchangeDeleted,
    MessagesChanged,
    QueueDeclared,
    QueueDeleted,
    RecordType,
    SegmentEnd,
    SegmentsDeleted,
    SegmentStart,
    encode_binding,
    encode_delivery_counts,
    encode_enqueue_shared,
    encode_exchange_declared,
    encode_exchange_deleted,
    encode_messages_changed,
    encode_queue_declared,
    encode_queue_deleted,
    encode_segment_end,
    encode_segment_start,
    encode_segments_deleted,
    enqueue_prefix,
)
from sluicegate.queues.log.recovery import Recovery, binding_key
from sluicegate.wire.amqp_types import Symbol
from sluicegate.wire.encoding import encode


def test_every_record_type_round_trips() -> None:
    arguments: Arguments = {"x-queue-type": Symbol("stream"), "x-max-length-bytes": 1000}
    payload = b"\x00\x53\x77\xa1\x05hello"
    log = b"".join(
        [
            encode_segment_start(7, 42, [2, 5]),
            encode_queue_declared("orders", arguments),
            encode_exchange_declared("amq.topic", "topic", {}),
            encode_binding("amq.topic", "orders", "a.*", {"x": True}, True),
            enqueue_prefix(42, "orders", 1_700_000_000_000, payload) + payload,
            encode_messages_changed(RecordType.ACQUIRE, [42]),
            encode_messages_changed(RecordType.SETTLE, [42, 43]),
            encode_binding("amq.topic", "orders", "a.*", {}, False),
            encode_exchange_deleted("amq.topic"),
            encode_queue_deleted("orders"),
            encode_enqueue_shared(43, "copies", 5, (7, 100, 11), 9, exchange="e", routing_key="k"),
            encode_delivery_counts([(42, 3), (43, 1)]),
            encode_segments_deleted([2, 5]),
            encode_segment_end(7),
        ]
    )
    records = [record for _, record in iter_records(log)]
    assert records[0] == SegmentStart(7, 42, (2, 5), after_end=True)
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
    shared = records[10]
    assert isinstance(shared, Enqueued)
    assert (shared.message_id, shared.queue, shared.timestamp, shared.expires) == (
        43,
        "copies",
        5,
        9,
    )
    assert (shared.exchange, shared.routing_key) == ("e", "k")
    assert (shared.body_segment, shared.body_offset, shared.body_length, shared.size) == (
        7,
        100,
        11,
        11,
    )
    assert records[11] == DeliveryCounts(((42, 3), (43, 1)))
    assert records[12] == SegmentsDeleted((2, 5))
    assert records[13] == SegmentEnd(7)


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


@given(st.text(max_size=20), st.text(max_size=300))
def test_enqueue_round_trips_its_exchange_and_routing_key(exchange: str, routing_key: str) -> None:
    payload = b"\x00\x53\x77\xa1\x01x"
    record = enqueue_prefix(3, "q", 5, payload, exchange=exchange, routing_key=routing_key)
    decoded, end = decode_record(record + payload, 0)
    assert isinstance(decoded, Enqueued)
    assert (decoded.exchange, decoded.routing_key) == (exchange, routing_key)
    assert (bytes(decoded.payload), end) == (payload, len(record) + len(payload))


def test_a_routing_key_longer_than_a_name_is_logged() -> None:
    routing_key = "k" * 70_000
    payload = b"body"
    record = enqueue_prefix(1, "q", 0, payload, exchange="e", routing_key=routing_key)
    decoded, _ = decode_record(record + payload, 0)
    assert isinstance(decoded, Enqueued)
    assert decoded.routing_key == routing_key


@pytest.mark.parametrize(
    ("auto_delete", "internal"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_exchange_flags_round_trip(auto_delete: bool, internal: bool) -> None:
    record = encode_exchange_declared(
        "x", "fanout", {"alternate-exchange": "ae"}, auto_delete=auto_delete, internal=internal
    )
    decoded, _ = decode_record(record, 0)
    assert decoded == ExchangeDeclared(
        "x", "fanout", {"alternate-exchange": "ae"}, auto_delete=auto_delete, internal=internal
    )


def _framed(kind: RecordType, body: bytes) -> bytes:
    """A record built by hand from its documented layout, as an older server wrote it."""
    typed = bytes((kind,)) + body
    return struct.pack(">II", len(typed), zlib.crc32(typed)) + typed


def test_unknown_exchange_flags_are_corrupt() -> None:
    body = b"\x00\x01x\x00\x06fanout\x04" + encode({})
    with pytest.raises(CorruptRecord, match="unknown exchange flags 0x04"):
        decode_record(_framed(RecordType.DECLARE_EXCHANGE_FLAGS, body), 0)


def test_format_1_records_still_decode() -> None:
    payload = b"\x00\x53\x77\xa1\x03old"
    enqueue = struct.pack(">QQQ", 7, 1000, 0) + b"\x00\x01q" + payload
    declared = b"\x00\x01x\x00\x05topic" + encode({})
    [(_, old_enqueue), (_, old_exchange)] = list(
        iter_records(
            _framed(RecordType.ENQUEUE, enqueue) + _framed(RecordType.DECLARE_EXCHANGE, declared)
        )
    )
    assert isinstance(old_enqueue, Enqueued)
    assert (old_enqueue.message_id, old_enqueue.queue, bytes(old_enqueue.payload)) == (
        7,
        "q",
        payload,
    )
    assert (old_enqueue.exchange, old_enqueue.routing_key) == ("", "")
    assert old_exchange == ExchangeDeclared("x", "topic", {})
    [(_, old_start)] = list(iter_records(_framed(RecordType.SEGMENT, struct.pack(">QQ", 3, 9))))
    assert old_start == SegmentStart(3, 9, None)


def test_a_binding_to_an_exchange_round_trips() -> None:
    record = encode_binding("a", "b", "k", {"x-match": "any"}, True, to_exchange=True)
    decoded, _ = decode_record(record, 0)
    assert decoded == Binding("a", "b", "k", {"x-match": "any"}, True, to_exchange=True)
    removal, _ = decode_record(encode_binding("a", "b", "k", {}, False, to_exchange=True), 0)
    assert removal == Binding("a", "b", "k", {}, False, to_exchange=True)


def test_an_unknown_binding_destination_is_corrupt() -> None:
    typed = bytes((RecordType.BIND_DESTINATION,)) + b"\x00\x01a\x07\x00\x01q\x00\x00\xc1\x01\x00"
    record = struct.pack(">II", len(typed), zlib.crc32(typed)) + typed
    with pytest.raises(CorruptRecord, match="unknown binding destination 7"):
        decode_record(record, 0)


def _by_key_binding(
    bound: bool, exchange: str, queue: str, key: str, arguments: Arguments
) -> bytes:
    """A binding record as servers wrote them before bindings were told apart by arguments."""
    names = b"".join(len(n).to_bytes(2, "big") + n.encode() for n in (exchange, queue, key))
    typed = bytes((RecordType.BIND if bound else RecordType.UNBIND,)) + names
    typed += encode(dict(arguments.items()))
    return struct.pack(">II", len(typed), zlib.crc32(typed)) + typed


def test_by_key_binding_records_keep_their_meaning() -> None:
    """Types 6 and 7: a BIND replaces the binding of the same ends and key, an UNBIND removes
    it whatever its arguments; the newer types tell bindings apart by their arguments."""
    log = b"".join(
        [
            encode_segment_start(1, 0, []),
            _by_key_binding(True, "e", "q", "k", {"a": 1}),
            _by_key_binding(True, "e", "q", "k", {"a": 2}),
            _by_key_binding(True, "e", "q", "other", {}),
        ]
    )
    recovery = Recovery()
    recovery.segment(1, log, last=False)
    assert recovery.state.bindings == {
        binding_key("e", "q", "k", {"a": 2}): {"a": 2},
        binding_key("e", "q", "other", {}): {},
    }
    more = b"".join(
        [
            encode_segment_start(2, 0, [1]),
            encode_binding("e", "q", "k", {"a": 3}, True),
            encode_binding("e", "q", "k", {"a": 3}, True, to_exchange=True),
            _by_key_binding(False, "e", "q", "k", {}),
        ]
    )
    recovery.segment(2, more, last=True)
    assert recovery.state.bindings == {
        binding_key("e", "q", "other", {}): {},
        binding_key("e", "q", "k", {"a": 3}, to_exchange=True): {"a": 3},
    }


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["orders", "q", "é" * 300]),
            st.sampled_from(["", "amq.topic"]),
            st.text(max_size=20) | st.just("k" * 600),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_enqueue_records_name_their_queue_exchange_and_key_however_often_repeated(
    names: list[tuple[str, str, str]],
) -> None:
    # The same names again (their encoding kept), and names too long to keep.
    for message_id, (queue, exchange, key) in enumerate(names + names):
        payload = b"body"
        record = enqueue_prefix(message_id, queue, 5, payload, exchange=exchange, routing_key=key)
        decoded, _ = decode_record(record + payload, 0)
        assert isinstance(decoded, Enqueued)
        assert (decoded.message_id, decoded.queue) == (message_id, queue)
        assert (decoded.exchange, decoded.routing_key) == (exchange, key)
