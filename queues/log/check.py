"""``sluicegate log check`` and ``log repair``: what is wrong with a log, and cutting it away.

Checking changes nothing. Repairing cuts every damaged segment at its damage, says exactly what
that dropped (bytes, messages by queue, settlements, other records) and which segments are
missing, then opens the log once to start a fresh segment whose header names the segments that
remain: the server starts on it again. A dropped settlement brings its message back (a
duplicate); a dropped enqueue loses its message: the operator decides, not the server.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sluicegate.queues.log.damage import Damage, resync
from sluicegate.queues.log.decoding import iter_records
from sluicegate.queues.log.records import Enqueued, MessagesChanged, RecordType
from sluicegate.queues.log.recovery import RecoveredState
from sluicegate.queues.log.segments import (
    CLEAN_SHUTDOWN,
    SegmentWriter,
    clean_shutdown_unreadable,
    max_segment_file,
    read_clean_shutdown,
    recover,
    remove_clean_shutdown,
    segment_path,
    sync_directory,
    truncate_segment,
)
from sluicegate.queues.log.store import DEFAULT_SEGMENT_SIZE, MessageStore, write_now
from sluicegate.wire.errors import DecodeError

# What a repair appends to a stray file's name: it no longer ends like a segment.
STRAY_SUFFIX: Final = ".stray"


@dataclass(slots=True)
class LogReport:
    """What a check found, and what a repair did."""

    directory: Path
    state: RecoveredState
    clean_shutdown: bool
    # One line per thing a repair did.
    repaired: list[str] = field(default_factory=list)
    # Damage a repair left for the operator: it cannot cut what it cannot read.
    left: list[str] = field(default_factory=list)
    # The clean-shutdown marker says nothing readable: ignored, the stop taken for a crash.
    marker_ignored: bool = False

    @property
    def startable(self) -> bool:
        """True if the server starts on the log as it is (a torn tail it cuts by itself)."""
        return not self.state.refused

    def lines(self) -> list[str]:
        """A human report: each segment, then each damage with what follows it."""
        state = self.state
        lines = [f"log {self.directory}: {len(state.sizes)} segments"]
        lines += [
            f"  segment {number}: {size} bytes, {state.records.get(number, 0)} valid records"
            for number, size in sorted(state.sizes.items())
        ]
        later = state.later_segments()
        torn = state.torn_tail
        if torn is not None:
            lines.append(
                f"torn tail (a crash): segment {torn.segment} from offset {torn.offset}, "
                f"{torn.dropped_bytes} bytes the next start cuts"
            )
        for damage in state.refused:
            line = "DAMAGED " + damage.describe()
            if damage.offset is not None and later.get(damage.segment):
                line += f", and {later[damage.segment]} later segments"
            lines.append(line)
        if not state.damages:
            closed = "closed cleanly" if self.clean_shutdown else "not closed cleanly (a crash)"
            lines.append(f"no damage; {closed}")
        if self.marker_ignored:
            lines.append(f"ignored: the {CLEAN_SHUTDOWN} marker does not say where the log ends")
        lines.extend(self.repaired)
        lines.extend(self.left)
        return lines


def check(directory: Path, segment_size: int = DEFAULT_SEGMENT_SIZE) -> LogReport:
    """Replay the log of ``segment_size`` segments and report; nothing is changed."""
    state = recover(directory, segment_size).state
    return LogReport(
        directory,
        state,
        read_clean_shutdown(directory) is not None,
        marker_ignored=clean_shutdown_unreadable(directory),
    )


def repair(directory: Path, segment_size: int = DEFAULT_SEGMENT_SIZE) -> LogReport:
    """Cut every damage away and make the log startable again; report what was dropped."""
    report = check(directory, segment_size)
    if not report.state.damages:
        return report
    largest = max_segment_file(segment_size)
    report.left = [
        f"NOT REPAIRED segment {damage.segment}: larger than any segment, so not read; "
        "truncate it to its data or move it away, then repair again (nothing was changed)"
        for damage in report.state.damages
        if damage.file is None and _file_size(directory, damage.segment) > largest
    ]
    if report.left:
        return report
    for damage in report.state.damages:
        if damage.file is not None:
            report.repaired.append(_set_aside(directory, damage.file))
        else:
            report.repaired.append(_cut(directory, damage))
    remove_clean_shutdown(directory)
    store = MessageStore(directory, segment_size=segment_size, repair=True)
    writer = SegmentWriter(directory)
    write_now(store, writer)
    writer.close()
    store.close(clean=True)
    report.repaired.append(
        f"repaired: segment {store.segment} starts the log again, naming the segments that remain"
    )
    return report


def _file_size(directory: Path, segment: int) -> int:
    path = segment_path(directory, segment)
    return path.stat().st_size if path.is_file() else 0


def _set_aside(directory: Path, name: str) -> str:
    """Rename a stray file so that it is not taken for a segment; nothing is deleted."""
    aside = f"{name}{STRAY_SUFFIX}"
    os.rename(directory / name, directory / aside)
    sync_directory(directory)
    return f"renamed {name!r} to {aside!r}: not a segment, nothing of it was read"


def _cut(directory: Path, damage: Damage) -> str:
    """Cut one damaged segment at its damage; say what that dropped."""
    if damage.offset is None:
        return f"segment {damage.segment} is missing: whatever it held is lost"
    path = segment_path(directory, damage.segment)
    if not path.exists():
        return f"segment {damage.segment} is missing: whatever it held is lost"
    data = path.read_bytes()
    if damage.offset and damage.offset >= len(data):
        # Already this short (an earlier damage of the same segment was cut before it):
        # truncating to the offset would lengthen the segment again, with zeros.
        return f"segment {damage.segment}: nothing past offset {damage.offset} to cut"
    dropped = _dropped(data, damage.offset)
    truncate_segment(directory, damage.segment, damage.offset)
    if not damage.offset:
        return f"removed segment {damage.segment}: dropped {len(data)} bytes, {dropped}"
    return (
        f"cut segment {damage.segment} at offset {damage.offset}: dropped "
        f"{len(data) - damage.offset} bytes, {dropped}"
    )


def _dropped(data: bytes, offset: int) -> str:
    """The records from ``offset`` on, by what they meant: what cutting there loses."""
    if offset >= len(data):
        return "no records"
    counts: Counter[str] = Counter({"unreadable record": 1})
    messages: Counter[str] = Counter()
    found = resync(data, offset)
    if found is not None:
        try:
            for _, record in iter_records(data, found.offset):
                if isinstance(record, Enqueued):
                    messages[record.queue] += 1
                elif isinstance(record, MessagesChanged) and record.kind is RecordType.SETTLE:
                    counts["settlements (those messages may be delivered again)"] += len(
                        record.message_ids
                    )
                else:
                    counts[f"{type(record).__name__} records"] += 1
        except DecodeError:
            counts["unreadable record"] += 1
    parts = [f"{count} {what}" for what, count in sorted(counts.items())]
    parts += [f"{count} messages of queue '{queue}'" for queue, count in sorted(messages.items())]
    return ", ".join(parts)
