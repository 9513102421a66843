"""The log's files: one directory of numbered segment files, written at known offsets.

Every record's place (segment, offset) is decided before it is written, so a write that fails
halfway is simply written again at the same offset, and a reader can ``pread`` a message body
while the writer appends elsewhere. A segment is fsynced before the first write to the next one:
only the last segment can ever end torn (see :mod:`queues.log.recovery`).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Final

from sluicegate.queues.log.recovery import CleanShutdown, Recovery

SUFFIX: Final = ".seg"
# Written at a clean shutdown with where the log ends, removed when the log is opened again.
CLEAN_SHUTDOWN: Final = "clean-shutdown"
# pwritev takes at most IOV_MAX buffers per call (1024 on Linux); more is EINVAL.
_IOV_MAX: Final = 1024
# Zero-padded so that listing the directory sorts segments in log order.
_DIGITS: Final = 20


def segment_path(directory: Path, segment: int) -> Path:
    """The file of segment number ``segment``."""
    return directory / f"{segment:0{_DIGITS}d}{SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    """Segment numbers present in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(
        int(path.stem)
        for path in directory.iterdir()
        if path.suffix == SUFFIX and path.stem.isdigit()
    )


def read_segments(directory: Path) -> Iterator[tuple[int, bytes, bool]]:
    """Yield ``(number, contents, is_last)`` for each segment, oldest first."""
    numbers = list_segments(directory)
    for index, number in enumerate(numbers):
        yield number, segment_path(directory, number).read_bytes(), index == len(numbers) - 1


def recover(directory: Path) -> Recovery:
    """Replay every segment of ``directory``, noting what is damaged; change nothing."""
    recovery = Recovery()
    for number, data, last in read_segments(directory):
        recovery.segment(number, data, last)
    recovery.finish(list_segments(directory), read_clean_shutdown(directory))
    return recovery


def sync_directory(directory: Path) -> None:
    """Make file creations and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_clean_shutdown(directory: Path, end: CleanShutdown) -> None:
    """Record, durably, that the log ends at ``end`` and nothing after it is being written."""
    path = directory / CLEAN_SHUTDOWN
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, f"{end.segment} {end.length}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_directory(directory)


def read_clean_shutdown(directory: Path) -> CleanShutdown | None:
    """Where the last clean shutdown left the log's end, if the last stop was one."""
    try:
        text = (directory / CLEAN_SHUTDOWN).read_text()
    except FileNotFoundError:
        return None
    try:
        segment, length = (int(field) for field in text.split())
    except ValueError:
        raise OSError(f"{directory / CLEAN_SHUTDOWN} does not say where the log ends") from None
    return CleanShutdown(segment, length)


def remove_clean_shutdown(directory: Path) -> None:
    """The log is being written again: a crash from now on may leave a torn tail."""
    path = directory / CLEAN_SHUTDOWN
    if path.exists():
        path.unlink()
        sync_directory(directory)


def truncate_segment(directory: Path, segment: int, length: int) -> None:
    """Cut a segment's torn tail off, durably."""
    fd = os.open(segment_path(directory, segment), os.O_WRONLY)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """The writing side: used by one thread only (the log writer)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._newest = -1

    def write(self, segment: int, offset: int, buffers: Sequence[bytes]) -> None:
        """Write ``buffers`` at ``offset`` of ``segment``, however many calls it takes."""
        fd = self._fd(segment)
        self._dirty.add(segment)
        remaining = deque(memoryview(b) for b in buffers if b)
        while remaining:
            chunk = list(islice(remaining, _IOV_MAX))
            written = os.pwritev(fd, chunk, offset)
            offset += written
            while remaining and written >= len(remaining[0]):
                written -= len(remaining[0])
                remaining.popleft()
            if remaining and written:
                remaining[0] = remaining[0][written:]

    def sync(self) -> None:
        """fsync every segment written since the last sync."""
        for segment in sorted(self._dirty):
            fd = self._fds.get(segment)
            if fd is not None:
                os.fsync(fd)
        self._dirty.clear()

    def delete(self, segment: int) -> None:
        """Remove a segment that compaction freed."""
        fd = self._fds.pop(segment, None)
        if fd is not None:
            os.close(fd)
        self._dirty.discard(segment)
        segment_path(self.directory, segment).unlink(missing_ok=True)

    def close(self) -> None:
        """Close every file."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _fd(self, segment: int) -> int:
        fd = self._fds.get(segment)
        if fd is not None:
            return fd
        if segment > self._newest:
            # Everything before a new segment is durable before the segment exists: a crash can
            # then tear only the last segment.
            self.sync()
            for older in [s for s in self._fds if s < segment]:
                os.close(self._fds.pop(older))
        fd = os.open(segment_path(self.directory, segment), os.O_WRONLY | os.O_CREAT, 0o644)
        self._fds[segment] = fd
        if segment > self._newest:
            self._newest = segment
            sync_directory(self.directory)
        return fd


class SegmentReader:
    """The reading side: ``pread`` of message bodies, on the thread that owns the queues."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}

    def read(self, segment: int, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` of ``segment``."""
        data = os.pread(self._fd(segment), size, offset)
        if len(data) != size:
            raise OSError(f"segment {segment} ends before offset {offset + size}")
        return data

    def read_upto(self, segment: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset``: fewer where the file ends (records unwritten)."""
        return os.pread(self._fd(segment), size, offset)

    def _fd(self, segment: int) -> int:
        fd = self._fds.get(segment)
        if fd is None:
            fd = self._fds[segment] = os.open(segment_path(self.directory, segment), os.O_RDONLY)
        return fd

    def forget(self, segment: int) -> None:
        """Close a segment about to be deleted."""
        fd = self._fds.pop(segment, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every file."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
