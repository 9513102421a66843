"""``sluicegate log check`` and ``log repair``: what is wrong with a log, and cutting it away.

Checking changes nothing. Repairing cuts every damaged segment at its damage, says exactly what
that dropped (bytes, messages by queue, settlements, other records) and which segments are
missing, then opens the log once to start a fresh segment whose header names the segments that
remain: the server starts on it again. A dropped settlement brings its message back (a
duplicate); a dropped enqueue loses its message: the operator decides, not the server.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sluicegate.queues.log.damage import Damage, resync
from sluicegate.queues.log.decoding import iter_records
from sluicegate.queues.log.records import Enqueued, MessagesChanged, RecordType
from sluicegate.queues.log.recovery import RecoveredState
from sluicegate.queues.log.segments import (
    SegmentWriter,
    read_clean_shutdown,
    recover,
    remove_clean_shutdown,
    segment_path,
    truncate_segment,
)
from sluicegate.queues.log.store import MessageStore, write_now
from sluicegate.wire.errors import DecodeError


@dataclass(slots=True)
class LogReport:
    """What a check found, and what a repair did."""

    directory: Path
    state: RecoveredState
    clean_shutdown: bool
    # One line per thing a repair did.
    repaired: list[str] = field(default_factory=list)

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
        lines.extend(self.repaired)
        return lines


def check(directory: Path) -> LogReport:
    """Replay the log and report; nothing is changed."""
    state = recover(directory).state
    return LogReport(directory, state, read_clean_shutdown(directory) is not None)


def repair(directory: Path) -> LogReport:
    """Cut every damage away and make the log startable again; report what was dropped."""
    report = check(directory)
    if not report.state.damages:
        return report
    for damage in report.state.damages:
        report.repaired.append(_cut(directory, damage))
    remove_clean_shutdown(directory)
    store = MessageStore(directory, repair=True)
    writer = SegmentWriter(directory)
    write_now(store, writer)
    writer.close()
    store.close(clean=True)
    report.repaired.append(
        f"repaired: segment {store.segment} starts the log again, naming the segments that remain"
    )
    return report


def _cut(directory: Path, damage: Damage) -> str:
    """Cut one damaged segment at its damage; say what that dropped."""
    if damage.offset is None:
        return f"segment {damage.segment} is missing: whatever it held is lost"
    path = segment_path(directory, damage.segment)
    if not path.exists():
        return f"segment {damage.segment} is missing: whatever it held is lost"
    data = path.read_bytes()
    dropped = _dropped(data, damage.offset)
    truncate_segment(directory, damage.segment, damage.offset)
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
