"""Damage found in the log, told apart from the torn tail a crash leaves (docs/durability.md).

A crash can only cut the log short where writing stopped: the last segment may end inside a
record (or with bytes that were never a record), with nothing valid after it, since the writer
fsyncs each segment before it writes the next. Everything else — a damaged record in an earlier
segment, valid records after a damaged one, a segment missing from the sequence, a log shorter
than a clean shutdown left it — is not a crash: it loses confirmed messages, so the server refuses
to start and says where, and only an operator's ``sluicegate log repair`` cuts it away.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Final, NamedTuple

from sluicegate.queues.log.decoding import (
    TornRecord,
    crc_matches,
    decode_fields,
    decode_record,
)
from sluicegate.queues.log.records import HEADER_SIZE, KINDS, MAX_RECORD_SIZE, RECORD_HEAD, U32
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
    # A file in the log directory that is not a segment (``segment`` is then -1).
    file: str | None = None

    def describe(self) -> str:
        """One line naming the segment, the offset and what follows."""
        if self.file is not None:
            return f"file {self.file!r}: {self.reason}"
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
    return 0 if found is None else found.records


# Bytes of records a search may check per byte of the data, and at least: the true records are
# checked once each; a plausible header in a body by chance is checked only when the headers it
# leads to run to the end, and its fields before its CRC, so random bodies cost a small part of
# this. Past it, a run whose headers reach the end counts as found unchecked: a body crafted to
# be checked again and again cannot make a search quadratic, and can only make recovery
# refuse, never cut.
_CHECKS_PER_BYTE: Final = 64
_CHECKS_AT_LEAST: Final = 1 << 20


class Resynced(NamedTuple):
    """Where valid records start again after damage, and how many run to the end."""

    offset: int
    records: int
    # Bytes of records whose CRC the search checked: the work it did.
    checked: int
    # False if the search ran out of its budget: ``records`` then counts plausible headers.
    verified: bool = True


def resync(data: bytes | memoryview, pos: int) -> Resynced | None:
    """Where valid records start again after the corrupt record at ``pos``, and how many.

    A record found must start a run of valid records that reaches the end of the data (or a
    record cut short there): a run that breaks off is a coincidence inside some body, not the
    log going on. The damaged record's own length is tried first (a flipped bit in a body
    leaves it right); then each later offset that could start a record, found by a search in C
    for a length no longer than the data and a known type (:func:`_plausible`), earliest
    first. Runs are followed header to header before any CRC is checked and each offset is
    judged once (:class:`_Runs`), so the work is linear in the data and bounded.
    """
    view = memoryview(data)
    size = len(view)
    runs = _Runs(view)
    starts: Iterable[int] = (match.start() for match in _plausible(size).finditer(view, pos + 1))
    if pos + HEADER_SIZE <= size:
        length = U32.unpack_from(view, pos)[0]
        if 0 < length <= MAX_RECORD_SIZE and pos + 8 + length < size:
            starts = chain((pos + 8 + length,), starts)
    for start in starts:
        found = runs.count(start)
        if found > 0:
            return Resynced(start, found, runs.checked, runs.checked <= runs.budget)
    return None


@functools.cache
def _headers(high: int) -> re.Pattern[bytes]:
    kinds = b"".join(re.escape(bytes((kind,))) for kind in sorted(KINDS))
    # A u32 length whose high byte is at most ``high``, a u32 CRC, a type byte (lookahead: the
    # headers found may overlap).
    lengths = re.escape(b"\x00") + b"-" + re.escape(bytes((high,)))
    return re.compile(b"(?=[" + lengths + b"].{7}[" + kinds + b"])", re.DOTALL)


def _plausible(size: int) -> re.Pattern[bytes]:
    """Record headers possible in ``size`` bytes: a length's high byte bounds its value."""
    return _headers(min(MAX_RECORD_SIZE, size) >> 24)


class _Runs:
    """For offsets of one segment: how many valid records run from each to the end, or -1.

    An offset's run is followed header to header (a length that fits, a known type) until it
    reaches the end, an offset already judged, or a header that cannot be; only a run that
    reaches the end has its records decoded, from the last back, each once. Past the budget
    the headers alone decide.
    """

    __slots__ = ("budget", "checked", "judged", "size", "view")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.size = len(view)
        self.judged: dict[int, int] = {}
        self.budget = max(_CHECKS_PER_BYTE * self.size, _CHECKS_AT_LEAST)
        self.checked = 0

    def count(self, pos: int) -> int:
        """Valid records from ``pos`` to the end (a record cut short there ends the run), or
        -1 if the run breaks."""
        view, size, judged = self.view, self.size, self.judged
        path: list[int] = []
        while True:
            known = judged.get(pos)
            if known is not None:
                result = known
                break
            if pos + HEADER_SIZE > size:
                result = 0
                break
            length, _, kind = RECORD_HEAD.unpack_from(view, pos)
            end = pos + 8 + length
            if length == 0 or length > MAX_RECORD_SIZE:
                result = -1
                break
            if end > size:
                result = 0
                break
            if kind not in KINDS:
                result = -1
                break
            path.append(pos)
            pos = end
        judged[pos] = result
        for start in reversed(path):
            if result >= 0:
                result = self._checked(start, result)
            judged[start] = result
        return result

    def _checked(self, pos: int, following: int) -> int:
        """The record at ``pos`` followed by ``following`` valid ones: their count, or -1.

        Its fields are decoded first: a plausible header inside a body by chance is rarely
        followed by fields that decode, so its length is seldom read for its CRC.
        """
        try:
            _, end, crc = decode_fields(self.view, pos)
        except DecodeError:
            return -1
        if self.checked + end - pos > self.budget:
            self.checked = self.budget + 1
            return following + 1
        self.checked += end - pos
        return following + 1 if crc_matches(self.view, pos, end, crc) else -1


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
