"""A ``mode=queue`` task's slice of a batch: decoded into record batches handed on one by one."""

from __future__ import annotations

from array import array

import pytest
from proton import Message

from sluicegate.spark.queue_source import QueuePartition, decode_partition
from sluicegate.spark.records import BATCH_ROWS, COLUMNS
from sluicegate.wire.errors import DecodeError


def _partition(first: int, payloads: list[bytes]) -> QueuePartition:
    return QueuePartition.pack(first, array("I", map(len, payloads)), b"".join(payloads))


def _encoded(index: int) -> bytes:
    message = Message(body=f"order-{index}".encode())
    message.inferred = True
    encoded: bytes = message.encode()
    return encoded


def test_rows_keep_their_seq_as_offset_across_batches() -> None:
    count = 2 * BATCH_ROWS + 7
    batches = list(decode_partition(_partition(41, [_encoded(i) for i in range(count)]), COLUMNS))
    assert [batch.num_rows for batch in batches] == [BATCH_ROWS, BATCH_ROWS, 7]
    offsets = [offset for batch in batches for offset in batch.column("offset").to_pylist()]
    assert offsets == list(range(41, 41 + count))
    bodies = [body for batch in batches for body in batch.column("body").to_pylist()]
    assert bodies == [f"order-{i}".encode() for i in range(count)]


def test_a_batch_is_handed_on_before_the_next_rows_are_decoded() -> None:
    """Spark takes a batch while the task decodes the next: the first comes out before the
    message after it is even looked at (here one that cannot be decoded)."""
    payloads = [_encoded(i) for i in range(BATCH_ROWS)] + [b"\x00not a message"]
    batches = decode_partition(_partition(1, payloads), ("offset",))
    assert next(batches).num_rows == BATCH_ROWS
    with pytest.raises(DecodeError):
        next(batches)
