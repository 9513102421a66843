"""Where each record goes: the segment and offset decided when it is appended, in batches.

The place of every record is fixed the moment it is appended, so the ledger knows each
message's segment at once and a failed write can be repeated in place. Appends collect into a
:class:`WriteBatch`; the gateway's log writer writes a batch (or several) and covers them with
one fsync (:func:`write_batches`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from sluicegate.queues.log.ledger import SegmentLedger
from sluicegate.queues.log.records import encode_segment_end, encode_segment_start

# MAX_SEGMENT_SIZE lives with the files it bounds; placement is where its users look for it.
from sluicegate.queues.log.segments import MAX_SEGMENT_SIZE as MAX_SEGMENT_SIZE
from sluicegate.queues.log.segments import SegmentWriter, sync_directory
from sluicegate.queues.log.stored import StoredMessage

# Large enough that rolling (an fsync and a topology snapshot) is rare, small enough that
# compaction frees disk in useful steps and recovery reads one segment at a time in memory.
DEFAULT_SEGMENT_SIZE: Final = 16 * 1024 * 1024


@dataclass(slots=True)
class WriteBatch:
    """Records placed since the last batch, for the log writer to write and fsync."""

    # (segment, offset, buffers): the buffers are written contiguously at the offset.
    writes: list[tuple[int, int, list[bytes]]] = field(default_factory=list)
    # Segments compaction freed: deleted after this batch is durable.
    deletions: list[int] = field(default_factory=list)
    # Messages whose bodies this batch writes: they leave memory once it is written.
    messages: list[StoredMessage] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes the batch writes."""
        return sum(len(b) for _, _, buffers in self.writes for b in buffers)


class Placement:
    """The log's end as the reactor thread sees it: the active segment, its offset, the batch,
    and the id the next message logged gets (every segment's header names it).

    ``snapshot`` gives the records every segment starts with after its header (the topology
    and the delivery counts), so that compaction may delete any older segment. ``unclosed``
    are the segments, with their lengths, that have no end record yet.
    """

    def __init__(
        self,
        segment: int,
        segment_size: int,
        ledger: SegmentLedger,
        next_id: int,
        snapshot: Callable[[], list[bytes]],
        unclosed: Sequence[tuple[int, int]] = (),
    ) -> None:
        if not 0 < segment_size <= MAX_SEGMENT_SIZE:
            raise ValueError(f"segment size must be 1 to {MAX_SEGMENT_SIZE} bytes")
        self.segment = segment
        self.segment_size = segment_size
        self.ledger = ledger
        self.next_id = next_id
        self._snapshot = snapshot
        self.offset = 0
        self._snapshot_end = 0
        self.batch = WriteBatch()
        self.placed = 0
        # Close the segments left without their end record (the one a crash or a stop left
        # last, those a repair cut) before this segment's header says they have it.
        for number, length in unclosed:
            end = encode_segment_end(number)
            self.batch.writes.append((number, length, [end]))
            self.placed += len(end)
        self.start_segment()

    def append(self, buffers: list[bytes], *, roll: bool = True) -> tuple[int, int]:
        """Place ``buffers`` as one contiguous run; return its (segment, offset).

        ``roll=False`` keeps them in the active segment whatever its size: a reference
        must lie in the segment of the body it names.
        """
        size = sum(len(b) for b in buffers)
        if roll and self.offset + size > self.segment_size and self.offset > self._snapshot_end:
            end = encode_segment_end(self.segment)
            self._place([end], len(end))
            self.segment += 1
            self.start_segment()
        segment, offset = self.segment, self.offset
        self._place(buffers, size)
        return segment, offset

    def take(self) -> WriteBatch:
        """The batch placed so far; a new one starts."""
        batch = self.batch
        self.batch = WriteBatch()
        return batch

    @property
    def pending(self) -> bool:
        """True if anything waits to be written."""
        return bool(self.batch.writes)

    def _place(self, buffers: list[bytes], size: int) -> None:
        writes = self.batch.writes
        # Placement within a segment is contiguous: a batch's last write in the current
        # segment ends where the next record goes, so it grows instead of adding a write.
        if writes and writes[-1][0] == self.segment:
            writes[-1][2].extend(buffers)
        else:
            writes.append((self.segment, self.offset, list(buffers)))
        self.offset += size
        self.placed += size

    def start_segment(self) -> None:
        """Open a segment with its header (naming the older segments on disk) and a snapshot."""
        self.offset = 0
        older = self.ledger.segments
        self.ledger.open_segment(self.segment)
        records = [encode_segment_start(self.segment, self.next_id, older)]
        records += self._snapshot()
        for record in records:
            self._place([record], len(record))
        self._snapshot_end = self.offset


def write_batches(writer: SegmentWriter, batches: list[WriteBatch]) -> None:
    """Write ``batches`` and cover them with one fsync, then delete the segments they freed.

    Deletions wait for the fsync (the settlements that free a segment are in the batch) and are
    made durable before the next batch, so a crash never brings back an older segment after a
    newer one that settled its messages is gone.
    """
    for batch in batches:
        for segment, offset, buffers in batch.writes:
            writer.write(segment, offset, buffers)
    writer.sync()
    deleted = False
    for batch in batches:
        for segment in batch.deletions:
            writer.delete(segment)
            deleted = True
    if deleted:
        sync_directory(writer.directory)
