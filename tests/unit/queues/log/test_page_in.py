"""Paging in: records that repeat the last one's names are read without decoding them again,
and still every record is checked (CRC, type, id) and every field comes back as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.queues.log.paged import DiskPage
from sluicegate.queues.log.recovery import LogCorrupted
from sluicegate.queues.log.segments import SegmentWriter, segment_path
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.wire.sections import read_header

# (exchange, routing key, expiry) of each message: runs of the same names, a change of
# routing key and of exchange, one with no routing at all.
_ROUTES = [
    ("orders", "eu", None),
    ("orders", "eu", 9_000),
    ("orders", "eu", None),
    ("orders", "us", None),
    ("orders", "us", 8_000),
    ("", "", None),
    ("audit", "eu", None),
    ("orders", "eu", None),
]


def _payload(i: int) -> bytes:
    return encode(Described(0x77, f"body {i} " + "x" * (i * 7)))


def _filled(tmp_path: Path) -> tuple[MessageStore, DiskPage, list[StoredMessage]]:
    store = MessageStore(tmp_path, cache_bytes=0)
    store.declare_queue("q", {})
    pager = store.pager("q")
    written: list[StoredMessage] = []
    tail = None
    for i, (exchange, key, expires) in enumerate(_ROUTES):
        message = store.enqueue(
            "q", _payload(i), 1_000 + i, expires, exchange=exchange, routing_key=key
        )
        written.append(message)
        page = pager.append(tail, message)
        tail = page if page is not None else tail
    write_now(store, SegmentWriter(tmp_path))
    assert isinstance(tail, DiskPage)
    assert tail.count == len(_ROUTES)
    return store, tail, written


def test_a_page_reads_back_every_field_as_written(tmp_path: Path) -> None:
    store, page, written = _filled(tmp_path)
    read = store.page_in(page, None)
    assert [(m.message_id, m.timestamp, m.expires, m.exchange, m.routing_key) for m in read] == [
        (m.message_id, m.timestamp, m.expires, m.exchange, m.routing_key) for m in written
    ]
    assert [(m.record, m.record_end, m.offset, m.length) for m in read] == [
        (m.record, m.record_end, m.offset, m.length) for m in written
    ]
    assert [m.read() for m in read] == [_payload(i) for i in range(len(_ROUTES))]


def test_a_queue_ttl_caps_each_expiry_from_its_arrival(tmp_path: Path) -> None:
    store, page, _ = _filled(tmp_path)
    read = store.page_in(page, 7_002)
    assert [m.expires for m in read] == [
        min(e, 1_000 + i + 7_002) if e is not None else 1_000 + i + 7_002
        for i, (_, _, e) in enumerate(_ROUTES)
    ]


@pytest.mark.parametrize("where", ["names", "body"])
def test_a_damaged_record_after_one_with_the_same_names_is_refused(
    tmp_path: Path, where: str
) -> None:
    store, page, written = _filled(tmp_path)
    damaged = written[2]  # its names repeat those of the two records before it
    at = damaged.record + 40 if where == "names" else damaged.offset + 3
    path = segment_path(tmp_path, damaged.segment)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupted):
        store.page_in(page, None)


def test_a_page_naming_another_message_is_refused(tmp_path: Path) -> None:
    store, page, _ = _filled(tmp_path)
    page.ids[3] += 1  # the record at that offset is the message before
    with pytest.raises(LogCorrupted, match="is not there"):
        store.page_in(page, None)


def test_a_shared_body_in_a_run_of_the_same_names_is_read_from_its_holder(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path, cache_bytes=0)
    store.declare_queue("q", {})
    pager = store.pager("q")
    body = _payload(1)
    messages = [
        store.enqueue("q", _payload(0), 0, exchange="e", routing_key="k"),
        store.enqueue("q", body, 0, exchange="e", routing_key="k"),
        store.enqueue("q", body, 0, exchange="e", routing_key="k"),  # refers to the one before
        store.enqueue("q", _payload(3), 0, exchange="e", routing_key="k"),
    ]
    tail = None
    for message in messages:
        tail = pager.append(tail, message) or tail
    write_now(store, SegmentWriter(tmp_path))
    assert messages[2].shared
    assert isinstance(tail, DiskPage)
    read = store.page_in(tail, None)
    assert [m.read() for m in read] == [_payload(0), body, body, _payload(3)]
    assert read[2].shared
    assert (read[2].offset, read[2].length) == (read[1].offset, read[1].length)


def _one_page(store: MessageStore, tmp_path: Path, queue: str, count: int) -> DiskPage:
    """``count`` messages of ``queue`` in one page, written (their bodies then cached)."""
    pager = store.pager(queue)
    tail = None
    for i in range(count):
        tail = pager.append(tail, store.enqueue(queue, _payload(i), 0)) or tail
    write_now(store, SegmentWriter(tmp_path))
    assert isinstance(tail, DiskPage)
    return tail


def test_a_body_sent_to_its_consumer_leaves_the_cache_and_is_read_again_if_it_comes_back(
    tmp_path: Path,
) -> None:
    store = MessageStore(tmp_path)
    store.declare_queue("q", {})
    tail = _one_page(store, tmp_path, "q", 6)
    total = sum(len(_payload(i)) for i in range(6))
    assert store.statistics().cached_bytes == total
    read = store.page_in(tail, None)
    # The cached bodies moved onto their messages, still counted in the cache's bytes.
    assert (store.statistics().cached_bodies, store.statistics().cached_bytes) == (0, total)
    for message in read:
        message.acquire()
    assert [m.send() for m in read] == [_payload(i) for i in range(6)]
    assert store.statistics().cached_bytes == 0
    assert store.statistics().body_reads == 0
    released, failed = read[1], read[4]
    released.release()
    failed.count_failed_delivery()
    failed.release()
    # Back in the queue: read from the log again, whole, the failed one counted.
    assert released.send() == _payload(1)
    again = failed.send()
    assert read_header(again).delivery_count == 1
    assert again.endswith(_payload(4))
    assert store.statistics().body_reads == 2


def test_bodies_read_with_a_page_stay_within_the_cache_and_leave_it_when_sent_or_settled(
    tmp_path: Path,
) -> None:
    sizes = [len(_payload(i)) for i in range(8)]
    # Room for the first three bodies of the page only.
    store = MessageStore(tmp_path, cache_bytes=sum(sizes[:3]))
    store.declare_queue("q", {})
    store.declare_queue("other", {})
    tail = _one_page(store, tmp_path, "q", 8)
    # The cache now holds bodies of another queue, written later: the page-in evicts them.
    store.enqueue("other", b"z" * sizes[0], 0)
    write_now(store, SegmentWriter(tmp_path))
    read = store.page_in(tail, None)
    assert [m.loaded is not None for m in read] == [True] * 3 + [False] * 5
    assert store.statistics().cached_bytes == store.bodies.cache_bytes
    assert store.statistics().cached_bodies == 0
    for message in read:
        message.acquire()
    read[0].archive()  # settled before it was sent: its body leaves the cache
    assert store.statistics().cached_bytes == sum(sizes[1:3])
    assert [m.send() for m in read[1:]] == [_payload(i) for i in range(1, 8)]
    assert store.statistics().cached_bytes == 0
    assert store.statistics().body_reads == 5


def test_a_restored_stream_keeps_no_body_of_its_pages(tmp_path: Path) -> None:
    store = MessageStore(tmp_path)
    store.declare_queue("s", {"x-queue-type": "stream"})
    _one_page(store, tmp_path, "s", 4)
    store.close()
    again = MessageStore(tmp_path)
    entries = again.stream_entries("s")
    for message in again.iter_recovered_messages("s"):
        entries.append(message)
    assert again.statistics().cached_bytes == 0


def test_bodies_of_paged_in_messages_dropped_unsent_leave_the_cache_with_them(
    tmp_path: Path,
) -> None:
    """A deleted queue's deliveries still waiting in a session are dropped unsent: their
    bodies stop counting against the cache when the messages go."""
    store = MessageStore(tmp_path)
    store.declare_queue("q", {})
    read = store.page_in(_one_page(store, tmp_path, "q", 6), None)
    read[0].acquire()
    read[0].send()
    assert store.statistics().cached_bytes == sum(len(_payload(i)) for i in range(1, 6))
    del read
    assert store.statistics().cached_bytes == 0
