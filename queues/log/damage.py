"""Damage found in the log, told apart from the torn tail a crash leaves (docs/durability.md).

A crash can only cut the log short where writing stopped: the last segment may end inside a
record (or with bytes that were never a record), with nothing valid after it, since the writer
fsyncs each segment before it writes the next. Everything else — a damaged record in an earlier
segment, valid records after a damaged one, a segment missing from the sequence, a log shorter
than a clean shutdown left it — is not a crash: it loses confirmed messages, so the server refuses
to start and says where, and only an operator's ``sluicegate log repair`` cuts it away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.queues.log.decoding import TornRecord, decode_record
from sluicegate.queues.log.records import HEADER_SIZE, KINDS, MAX_RECORD_SIZE, U32
from sluicegate.wire.errors import DecodeError


@dataclass(frozen=True, slots=True)
class Damage:
    """One place where the log is not what its writer left.

    ``offset`` is where the segment stops being readable (None for a missing segment);
    ``following`` counts the valid records found after it in the same segment.
    """

    segment: int
    offset: int | None
    reason: str
    following: int = 0
    # Bytes from ``offset`` to the end of the segment file: what cutting it there drops.
    dropped_bytes: int = 0
    # True for the last segment's end with nothing valid after it: what a crash leaves.
    torn: bool = False

    def describe(self) -> str:
        """One line naming the segment, the offset and what follows."""
        if self.offset is None:
            return f"segment {self.segment}: {self.reason}"
        return (
            f"segment {self.segment} at offset {self.offset}: {self.reason}; "
            f"{self.following} valid records follow in it ({self.dropped_bytes} bytes from there)"
        )


class LogDamaged(Exception):
    """The log has damage a crash cannot explain: recovery refuses to go on by itself."""

    def __init__(self, damages: Sequence[Damage], later_segments: dict[int, int]) -> None:
        lines = []
        for damage in damages:
            line = damage.describe()
            after = later_segments.get(damage.segment, 0)
            if after and damage.offset is not None:
                line += f", and {after} later segments"
            lines.append(line)
        super().__init__(
            "the log is damaged, not merely cut short by a crash: "
            + "; ".join(lines)
            + ". `sluicegate log check DIR` reports, `sluicegate log repair DIR` cuts it away"
        )
        self.damages = list(damages)


def records_after(data: bytes | memoryview, pos: int) -> int:
    """Valid records after the corrupt (not torn) record at ``pos``."""
    found = resync(data, pos)
    return 0 if found is None else found[1]


def resync(data: bytes | memoryview, pos: int) -> tuple[int, int] | None:
    """Where valid records start again after the corrupt record at ``pos``, and how many.

    A record found must start a run of valid records that reaches the end of the data (or a
    record cut short there): a run that breaks off is a coincidence inside some body, not the
    log going on. The damaged record's own length is tried first (a flipped bit in a body
    leaves it right); then every later offset. A record cut short by the end of the data is
    not searched: it runs to the end, so nothing of the log can follow it.
    """
    view = memoryview(data)
    size = len(view)
    if pos + HEADER_SIZE <= size:
        length = U32.unpack_from(view, pos)[0]
        if 0 < length <= MAX_RECORD_SIZE and pos + 8 + length < size:
            found = valid_run(view, pos + 8 + length)
            if found:
                return pos + 8 + length, found
    unpack = U32.unpack_from
    last = size - HEADER_SIZE
    start = pos + 1
    while start <= last:
        length = unpack(view, start)[0]
        if 0 < length <= size - start - 8 and view[start + 8] in KINDS:
            found = valid_run(view, start)
            if found:
                return start, found
        start += 1
    return None


def valid_run(data: bytes | memoryview, pos: int) -> int:
    """Records decoded one after another from ``pos`` to the end; 0 if the run breaks."""
    view = memoryview(data)
    count = 0
    size = len(view)
    while pos < size:
        try:
            _, pos = decode_record(view, pos)
        except TornRecord:
            return count
        except DecodeError:
            return 0
        count += 1
    return count
