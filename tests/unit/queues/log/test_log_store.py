"""The store on real files: recovery, lazy bodies, compaction, torn tails and corruption."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from sluicegate.queues.log.bodies import CACHE_ENTRY_COST
from sluicegate.queues.log.placement import write_batches
from sluicegate.queues.log.recovery import ExchangeState, binding_key
from sluicegate.queues.log.segments import SegmentWriter, list_segments, segment_path
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.queues.message import ACQUIRED, ARCHIVED
from sluicegate.wire.amqp_types import Described, Symbol
from sluicegate.wire.annotations import routing_annotations
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import read_header


def _payload(i: int, size: int = 0) -> bytes:
    return encode(Described(0x77, f"m{i}" + "x" * size))


def _reopen(directory: Path, segment_size: int = 16 * 1024 * 1024) -> MessageStore:
    return MessageStore(directory, segment_size=segment_size)


def _bodies(messages: Iterable[StoredMessage]) -> list[bytes]:
    return [m.read() for m in messages]


def test_queues_and_messages_survive_a_reopen(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {"x-queue-type": Symbol("classic")})
    store.declare_exchange("e", "direct", {})
    store.bind("e", "q", "k", {})
    messages = [store.enqueue("q", _payload(i), 1000 + i) for i in range(5)]
    store.settled(messages[1])
    write_now(store, writer)
    store.close()

    again = _reopen(tmp_path)
    assert again.queues == {"q": {"x-queue-type": "classic"}}
    assert again.exchanges == {"e": ExchangeState("direct", {})}
    assert again.bindings == {binding_key("e", "q", "k", {}): {}}
    recovered = list(again.iter_recovered_messages("q"))
    assert _bodies(recovered) == [_payload(i) for i in (0, 2, 3, 4)]
    assert [m.timestamp for m in recovered] == [1000, 1002, 1003, 1004]
    # One read brought the four records back, and their bodies with them into the cache.
    assert again.statistics().page_reads == 1
    assert again.statistics().body_reads == 0


def test_unwritten_appends_are_lost_and_ids_never_reused(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    kept = store.enqueue("q", _payload(1), 0)
    write_now(store, writer)
    store.enqueue("q", _payload(2), 0)  # never written: the crash comes first
    again = _reopen(tmp_path)
    recovered = list(again.iter_recovered_messages("q"))
    assert [m.message_id for m in recovered] == [kept.message_id]
    assert again.next_id > kept.message_id


def test_an_acquired_message_comes_back_with_one_more_delivery_count(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    first, second, third = (store.enqueue("q", _payload(i), 0) for i in range(3))
    store.acquired(first)
    store.acquired(second)
    second.count_failed_delivery()
    store.acquired(third)
    store.returned(third, failed=False)
    write_now(store, writer)
    recovered = list(_reopen(tmp_path).iter_recovered_messages("q"))
    assert [read_header(m.read()).delivery_count for m in recovered] == [1, 1, 0]


def test_bodies_are_read_back_from_disk_once_out_of_the_cache(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, cache_bytes=0)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    message = store.enqueue("q", _payload(7, 1000), 0)
    assert message.read() == _payload(7, 1000)
    assert store.statistics().body_reads == 0
    write_now(store, writer)
    assert store.statistics().unwritten_messages == 0
    assert message.read() == _payload(7, 1000)
    assert store.statistics().body_reads == 1
    assert message.read_size() == len(_payload(7, 1000))


def test_compaction_deletes_settled_segments_and_keeps_live_ones(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, segment_size=4096)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    messages = [store.enqueue("q", _payload(i, 500), 0) for i in range(40)]
    write_now(store, writer)
    segments_full = len(list_segments(tmp_path))
    assert segments_full >= 5
    # Settle everything but the first and the last message.
    for message in messages[1:-1]:
        store.settled(message)
    write_now(store, writer)
    write_now(store, writer)
    on_disk = list_segments(tmp_path)
    assert len(on_disk) <= 4
    assert messages[0].segment in on_disk
    assert messages[-1].segment in on_disk
    recovered = list(_reopen(tmp_path, segment_size=4096).iter_recovered_messages("q"))
    assert [m.message_id for m in recovered] == [messages[0].message_id, messages[-1].message_id]


def test_declarations_survive_the_compaction_of_the_segment_that_made_them(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, segment_size=2048)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("kept", {"x-max-length": 5})
    store.declare_queue("gone", {})
    messages = [store.enqueue("kept", _payload(i, 400), 0) for i in range(20)]
    store.delete_queue("gone", [])
    for message in messages:
        store.settled(message)
    write_now(store, writer)
    write_now(store, writer)
    assert 1 not in list_segments(tmp_path)
    again = _reopen(tmp_path)
    assert again.queues == {"kept": {"x-max-length": 5}}


def test_a_deleted_queue_takes_its_messages(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    messages = [store.enqueue("q", _payload(i), 0) for i in range(3)]
    write_now(store, writer)
    store.delete_queue("q", messages)
    store.declare_queue("q", {})
    write_now(store, writer)
    again = _reopen(tmp_path)
    assert again.queues == {"q": {}}
    assert list(again.iter_recovered_messages("q")) == []


def test_a_torn_tail_is_truncated_and_everything_before_it_kept(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    for i in range(3):
        store.enqueue("q", _payload(i), 0)
    write_now(store, writer)
    path = segment_path(tmp_path, store.segment)
    whole = path.stat().st_size
    with path.open("ab") as file:
        file.write(b"\x00\x00\x01\x00\xde\xad")  # a record header cut by the crash
    again = _reopen(tmp_path)
    assert again.statistics().truncated_bytes == 6
    assert path.stat().st_size == whole
    assert _bodies(again.iter_recovered_messages("q")) == [_payload(i) for i in range(3)]


def test_a_batch_of_more_buffers_than_iov_max_is_written_whole(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    # Two buffers per message (record head and payload): far beyond IOV_MAX in one write.
    for i in range(3000):
        store.enqueue("q", _payload(i), 0)
    batch = store.take_batch()
    assert max(len(buffers) for _, _, buffers in batch.writes) > 1024
    write_batches(writer, [batch])
    store.written(batch)
    recovered = list(_reopen(tmp_path).iter_recovered_messages("q"))
    assert len(recovered) == 3000
    assert recovered[-1].read() == _payload(2999)


def test_recovered_messages_keep_their_exchange_and_routing_key(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    store.enqueue("q", _payload(0), 0, exchange="orders", routing_key="eu.paris")
    store.enqueue("q", _payload(1), 0)
    held = store.enqueue("q", _payload(2), 0, exchange="orders", routing_key="us.nyc")
    held.state = ACQUIRED
    # Archived as it went to a pre-settled consumer, then returned: logged again (relog).
    held.state = ARCHIVED
    store.returned(held, False)
    write_now(store, writer)
    store.close()

    recovered = list(_reopen(tmp_path).iter_recovered_messages("q"))
    assert [(m.exchange, m.routing_key) for m in recovered] == [
        ("orders", "eu.paris"),
        ("", ""),
        ("orders", "us.nyc"),
    ]
    # Copies for other queues (fan-out, dead letters) keep them too.
    copy = recovered[0].copy()
    assert (copy.exchange, copy.routing_key) == ("orders", "eu.paris")


def test_exchange_flags_survive_a_reopen_and_a_segment_snapshot(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, segment_size=4096)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    store.declare_exchange("hidden", "topic", {"alternate-exchange": "ae"}, internal=True)
    store.declare_exchange("temp", "fanout", {}, auto_delete=True)
    store.declare_exchange("plain", "direct", {})
    # Redeclaring with other flags logs the new declaration.
    store.declare_exchange("plain", "direct", {}, auto_delete=True, internal=True)
    expected = {
        "hidden": ExchangeState("topic", {"alternate-exchange": "ae"}, internal=True),
        "temp": ExchangeState("fanout", {}, auto_delete=True),
        "plain": ExchangeState("direct", {}, auto_delete=True, internal=True),
    }
    # Enough messages to roll into later segments, whose snapshots repeat the declarations;
    # settling them lets compaction delete the segment that logged the declarations first.
    for i in range(20):
        store.settled(store.enqueue("q", _payload(i, 500), 0))
        write_now(store, writer)
    assert 1 not in list_segments(tmp_path)
    store.close()

    again = _reopen(tmp_path)
    assert again.exchanges == expected


def test_a_log_in_format_1_recovers(tmp_path: Path) -> None:
    # Written by the encoder before exchanges carried flags and enqueues their routing:
    # exchange 'orders' (topic, alternate-exchange 'ae'), queue 'q' dead-lettering to 'dlx',
    # binding orders -> q 'eu.#', one message published to 'orders' with key 'eu.paris'.
    fixture = Path(__file__).parent / "data" / "format1" / "00000000000000000001.seg"
    (tmp_path / fixture.name).write_bytes(fixture.read_bytes())

    store = MessageStore(tmp_path)
    assert store.exchanges == {"orders": ExchangeState("topic", {"alternate-exchange": "ae"})}
    assert store.queues == {"q": {"x-queue-type": "classic", "x-dead-letter-exchange": "dlx"}}
    assert store.bindings == {binding_key("orders", "q", "eu.#", {}): {}}
    [message] = list(store.iter_recovered_messages("q"))
    assert (message.message_id, message.timestamp) == (0, 1234)
    assert message.read().endswith(encode(Described(0x77, "legacy")))
    # Format 1 did not log the routing; the message keeps its annotations as published.
    assert (message.exchange, message.routing_key) == ("", "")
    assert message.read().startswith(routing_annotations("orders", "eu.paris"))
    # New records go after it in the new format, and both recover together.
    writer = SegmentWriter(tmp_path)
    store.declare_exchange("orders-internal", "direct", {}, internal=True)
    store.enqueue("q", _payload(1), 0, exchange="orders", routing_key="eu.lyon")
    write_now(store, writer)
    store.close()
    again = _reopen(tmp_path)
    assert again.exchanges["orders-internal"] == ExchangeState("direct", {}, internal=True)
    assert [(m.exchange, m.routing_key) for m in again.iter_recovered_messages("q")] == [
        ("", ""),
        ("orders", "eu.lyon"),
    ]


def test_bindings_by_arguments_and_to_exchanges_survive_a_reopen_and_a_roll(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path, segment_size=4096)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    for name in ("h", "x", "gone"):
        store.declare_exchange(name, "headers" if name == "h" else "fanout", {})
    store.bind("h", "q", "", {"x-match": "any", "a": 1})
    store.bind("h", "q", "", {"x-match": "any", "a": 2})
    store.bind("x", "h", "", {}, to_exchange=True)
    store.bind("gone", "h", "", {}, to_exchange=True)
    store.bind("x", "gone", "", {}, to_exchange=True)
    store.unbind("h", "q", "", {"x-match": "any", "a": 2})
    store.delete_exchange("gone")
    expected = {
        binding_key("h", "q", "", {"x-match": "any", "a": 1}): {"x-match": "any", "a": 1},
        binding_key("x", "h", "", {}, to_exchange=True): {},
    }
    assert store.bindings == expected
    # Enough settled messages to roll segments and compact away the one the bindings were
    # logged in: what is left holds them as a snapshot.
    for index in range(40):
        store.settled(store.enqueue("q", _payload(index) * 20, index))
    write_now(store, writer)
    write_now(store, writer)
    assert list_segments(tmp_path)[0] > 1
    store.close()
    assert _reopen(tmp_path).bindings == expected


def test_a_body_routed_to_many_queues_is_written_once_and_every_copy_recovers(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path, segment_size=4096)
    writer = SegmentWriter(tmp_path)
    queues = [f"q{i}" for i in range(50)]
    for queue in queues:
        store.declare_queue(queue, {})
    body = _payload(0, size=3000)
    placed = store.statistics().bytes_placed
    copies = [store.enqueue(queue, body, 7) for queue in queues]
    write_now(store, writer)
    written = store.statistics().bytes_placed - placed
    # One body, and a small reference record per other queue, all in the body's segment.
    assert len(body) < written < len(body) + 100 * len(queues)
    assert {copy.segment for copy in copies} == {copies[0].segment}
    assert [copy.read() for copy in copies] == [body] * len(queues)
    # The holder of the body settles first: the references keep its segment.
    store.settled(copies[0])
    store.enqueue(queues[0], _payload(1, size=3000), 8)
    write_now(store, writer)
    assert segment_path(tmp_path, copies[0].segment).exists()

    again = _reopen(tmp_path, segment_size=4096)
    for queue in queues[1:]:
        [recovered] = again.iter_recovered_messages(queue)
        assert recovered.read() == body
    # One read of the shared body serves every queue from the cache.
    assert again.statistics().body_reads == 1
    writer = SegmentWriter(tmp_path)
    for queue in queues[1:]:
        store.settled(next(c for c in copies if c.queue == queue))
    store.enqueue(queues[0], _payload(2, size=3000), 9)
    write_now(store, writer)
    store.enqueue(queues[0], _payload(3, size=3000), 9)
    write_now(store, writer)
    assert not segment_path(tmp_path, copies[0].segment).exists()


def test_a_delivery_count_survives_a_restart_and_the_compaction_that_counted_it(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path, segment_size=4096)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    held = store.enqueue("q", _payload(0), 0)
    copy = store.enqueue("q", _payload(1), 0, delivery_count=4)
    write_now(store, writer)

    def fill() -> None:
        for i in range(20):
            store.settled(store.enqueue("q", _payload(i, size=500), 0))
            write_now(store, writer)

    fill()
    store.acquired(held)
    held.count_failed_delivery()
    held.count_failed_delivery()
    counted = store.segment
    write_now(store, writer)
    fill()
    assert not segment_path(tmp_path, counted).exists()
    recovered = list(_reopen(tmp_path, segment_size=4096).iter_recovered_messages("q"))
    assert [m.message_id for m in recovered] == [held.message_id, copy.message_id]
    assert [read_header(m.read()).delivery_count for m in recovered] == [2, 4]


def test_a_delivery_held_across_the_compaction_of_its_acquisition_comes_back_counted(
    tmp_path: Path,
) -> None:
    """Two messages are held by a consumer while the segments that recorded their acquisition
    (and the failed delivery before one of them) roll and are compacted; after a crash each
    comes back with exactly one more failed delivery."""
    store = MessageStore(tmp_path, segment_size=4096)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    held = store.enqueue("q", _payload(0), 0)
    failed = store.enqueue("q", _payload(1), 0)
    write_now(store, writer)

    def fill() -> None:
        for i in range(20):
            store.settled(store.enqueue("q", _payload(i, size=500), 0))
            write_now(store, writer)

    fill()
    store.acquired(failed)
    failed.count_failed_delivery()
    fill()
    store.acquired(held)
    store.acquired(failed)
    acquired_in = store.segment
    write_now(store, writer)
    fill()
    assert not segment_path(tmp_path, acquired_in).exists()
    writer.close()
    store.close()
    recovered = list(_reopen(tmp_path, segment_size=4096).iter_recovered_messages("q"))
    assert [m.message_id for m in recovered] == [held.message_id, failed.message_id]
    assert [read_header(m.read()).delivery_count for m in recovered] == [1, 2]


def test_the_body_cache_counts_each_body_with_its_entry(tmp_path: Path) -> None:
    """100 small bodies written: the cache keeps as many as their bytes *and* their entries'
    cost fit in its size (16 MiB of 100-byte bodies were 45 MiB of memory, issue 31), where
    their bytes alone would let it keep 2.6 times as many."""
    bodies = [_payload(n, 100) for n in range(100)]
    shortest, longest = min(map(len, bodies)), max(map(len, bodies))
    size = 20 * (longest + CACHE_ENTRY_COST)
    store = MessageStore(tmp_path, cache_bytes=size)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("q", {})
    for body in bodies:
        store.enqueue("q", body, 0)
    write_now(store, writer)
    stats = store.statistics()
    assert 20 <= stats.cached_bodies <= size // (shortest + CACHE_ENTRY_COST)
    assert stats.cached_bytes + stats.cached_bodies * CACHE_ENTRY_COST <= size


def test_an_emptied_streams_offset_survives_reopens_compaction_and_goes_with_its_queue(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path, segment_size=2048)
    writer = SegmentWriter(tmp_path)
    store.declare_queue("s", {"x-queue-type": "stream"})
    store.declare_queue("other", {})
    assert store.stream_offset("s") == 0
    # Not a queue the log knows: nothing logged.
    store.stream_emptied("unknown", 7)
    store.stream_emptied("s", 12)
    # Traffic settled, so that compaction deletes the segment of the record.
    messages = [store.enqueue("other", _payload(i, 400), 0) for i in range(20)]
    for message in messages:
        store.settled(message)
    write_now(store, writer)
    write_now(store, writer)
    assert 1 not in list_segments(tmp_path)
    again = _reopen(tmp_path)
    assert (again.stream_offset("s"), again.stream_offset("unknown")) == (12, 0)
    again.delete_queue("s", [])
    again.declare_queue("s", {"x-queue-type": "stream"})
    write_now(again, SegmentWriter(tmp_path))
    assert _reopen(tmp_path).stream_offset("s") == 0
