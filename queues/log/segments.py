"""The log's files: one directory of numbered segment files, written at known offsets.

Every record's place (segment, offset) is decided before it is written, so a write that fails
halfway is simply written again at the same offset, and a reader can ``pread`` a message body
while the writer appends elsewhere. A segment is fsynced before the first write to the next one:
only the last segment can ever end torn (see :mod:`queues.log.recovery`).
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Final

from sluicegate.queues.log.records import MAX_RECORD_SIZE
from sluicegate.queues.log.recovery import CleanShutdown, Recovery

SUFFIX: Final = ".seg"
# Written at a clean shutdown with where the log ends, removed when the log is opened again.
CLEAN_SHUTDOWN: Final = "clean-shutdown"
# pwritev takes at most IOV_MAX buffers per call (1024 on Linux); more is EINVAL.
_IOV_MAX: Final = 1024
# Zero-padded so that listing the directory sorts segments in log order.
_DIGITS: Final = 20
# The only names read as segments: what segment_path writes, in ASCII digits. Any other name
# with the suffix (``2.seg`` beside ``00000000000000000002.seg``, ``².seg``, which
# ``str.isdigit`` accepts) is a stray, reported, never read.
_NAME: Final = re.compile(rf"[0-9]{{{_DIGITS}}}{re.escape(SUFFIX)}", re.ASCII)
# A marker the server wrote: two numbers in ASCII digits.
_MARKER: Final = re.compile(rb"([0-9]{1,20}) ([0-9]{1,20})\n?", re.ASCII)
# The longest marker the server writes: two 20-digit numbers, a space and a newline.
_MARKER_BYTES: Final = 42
# Offsets within a segment are u32s in pages and recovery: a segment ends within one record
# (or one fan-out: a body and its references) past its size, so 2 GiB segments keep them
# under 4 GiB.
MAX_SEGMENT_SIZE: Final = 2 * 1024 * 1024 * 1024
# Reading bodies back (SegmentReader). A window grows from FIRST_WINDOW_BYTES (a page: a read
# elsewhere in the log costs what reading the body alone did) by doubling while reads follow on,
# up to WINDOW_BYTES: some 500 messages of 200 bytes per pread, after which the system call is
# a small share of a message's cost and a larger window would only copy more per read.
FIRST_WINDOW_BYTES: Final = 4096
WINDOW_BYTES: Final = 128 * 1024
# Windows kept, one per place read at once (a stream's readers at their offsets, classic queues'
# consumers): at most WINDOWS * WINDOW_BYTES (1 MiB) in memory. With more places than that read
# in turn, each window still serves a session's batch of deliveries before it is replaced.
WINDOWS: Final = 8
# Bodies larger than this are read alone: a pread of their own costs little beside copying them,
# and they would push the windows of small ones out.
LARGE_READ: Final = 16 * 1024


def segment_path(directory: Path, segment: int) -> Path:
    """The file of segment number ``segment``."""
    return directory / f"{segment:0{_DIGITS}d}{SUFFIX}"


def scan(directory: Path) -> tuple[list[int], list[str]]:
    """Segment numbers present in ``directory``, oldest first, and the stray names: files with
    the segment suffix whose names are not what the server writes."""
    if not directory.is_dir():
        return [], []
    numbers: list[int] = []
    strays: list[str] = []
    for path in directory.iterdir():
        name = path.name
        if _NAME.fullmatch(name):
            numbers.append(int(name.removesuffix(SUFFIX)))
        elif name.endswith(SUFFIX):
            strays.append(name)
    return sorted(numbers), sorted(strays)


def list_segments(directory: Path) -> list[int]:
    """Segment numbers present in ``directory``, oldest first."""
    return scan(directory)[0]


def max_segment_file(segment_size: int) -> int:
    """The largest segment file a log of ``segment_size`` segments holds: a segment ends within
    one record past its size (placement.py). A larger one, such as a sparse file, is refused
    unread rather than read into memory."""
    return segment_size + MAX_RECORD_SIZE


def read_segments(directory: Path, max_file: int) -> Iterator[tuple[int, bytes, bool, int]]:
    """Yield ``(number, contents, is_last, file_size)`` for each segment, oldest first; a file
    over ``max_file`` bytes yields no contents."""
    numbers = list_segments(directory)
    for index, number in enumerate(numbers):
        with segment_path(directory, number).open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            data = file.read() if size <= max_file else b""
        yield number, data, index == len(numbers) - 1, size


def recover(directory: Path, segment_size: int) -> Recovery:
    """Replay every segment of ``directory``, noting what is damaged; change nothing."""
    recovery = Recovery()
    max_file = max_segment_file(segment_size)
    for number, data, last, size in read_segments(directory, max_file):
        if size > max_file:
            recovery.oversized(number, size, max_file)
        else:
            recovery.segment(number, data, last)
    numbers, strays = scan(directory)
    recovery.finish(numbers, read_clean_shutdown(directory), strays)
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
    """Where the last clean shutdown left the log's end, if the last stop was one.

    A marker that is not what the server writes says nothing: the stop is taken for a crash,
    which trusts nothing but the segments (:func:`clean_shutdown_unreadable` reports it).
    """
    try:
        with (directory / CLEAN_SHUTDOWN).open("rb") as file:
            text = file.read(_MARKER_BYTES)
    except FileNotFoundError:
        return None
    match = _MARKER.fullmatch(text)
    if match is None:
        return None
    return CleanShutdown(int(match[1]), int(match[2]))


def clean_shutdown_unreadable(directory: Path) -> bool:
    """True if a clean-shutdown marker is there but does not say where the log ends."""
    return (directory / CLEAN_SHUTDOWN).exists() and read_clean_shutdown(directory) is None


def remove_clean_shutdown(directory: Path) -> None:
    """The log is being written again: a crash from now on may leave a torn tail."""
    path = directory / CLEAN_SHUTDOWN
    if path.exists():
        path.unlink()
        sync_directory(directory)


def truncate_segment(directory: Path, segment: int, length: int) -> None:
    """Cut a segment's torn tail off, durably.

    Cut to nothing (its header torn), the segment is removed: left empty, it would lie before
    the next segment opened, where an empty segment is damage (queues/log/recovery.py).
    """
    if not length:
        segment_path(directory, segment).unlink()
        sync_directory(directory)
        return
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


class _Window:
    """Bytes of one segment read at once: ``data`` holds the segment's bytes ``start:end``."""

    __slots__ = ("data", "end", "segment", "span", "start")

    def __init__(self, segment: int, start: int, data: bytes, span: int) -> None:
        self.segment = segment
        self.start = start
        self.end = start + len(data)
        self.data = data
        # The bytes asked for: fewer come back at the end of what is written.
        self.span = span


# What no segment is: the window a reader starts with, which serves nothing.
_NO_WINDOW: Final = _Window(-1, 0, b"", 0)


class SegmentReader:
    """The reading side: ``pread`` of message bodies, on the thread that owns the queues.

    Readers mostly read on in log order (a stream reader, a classic queue's consumers): a
    read that follows on from the last one takes a *window* of the bytes after it, twice as
    large each time up to :data:`WINDOW_BYTES`, and the next bodies are sliced out of it, one
    ``pread`` for hundreds of small messages instead of one each. A read elsewhere starts again
    with :data:`FIRST_WINDOW_BYTES`, so scattered reads cost little more than before. A window
    holds only bytes that were there when it was read (a ``pread`` stops at the file's end)
    and, with ``durable_end`` set, none past the first record not yet durable: segments are
    append-only, so what a window holds stays true, and it never serves bytes read before
    they were written. Windows go with their segment (:meth:`forget`).
    """

    def __init__(
        self, directory: Path, durable_end: Callable[[int], int | None] | None = None
    ) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}
        # Where the durable bytes of a segment end, None for all the file has (a segment
        # this run no longer writes); set by the owner of the unwritten bodies.
        self.durable_end = durable_end
        # The window read or used last, then the others, most recent first.
        self._last = _NO_WINDOW
        self._windows: list[_Window] = []
        # System calls made to read bodies: a test's and a benchmark's count.
        self.preads = 0

    def read(self, segment: int, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` of ``segment``."""
        window = self._last
        if window.segment == segment and window.start <= offset and offset + size <= window.end:
            at = offset - window.start
            return window.data[at : at + size]
        return self._read(segment, offset, size)

    def _read(self, segment: int, offset: int, size: int) -> bytes:
        end = offset + size
        windows = self._windows
        follows: _Window | None = None
        for window in windows:
            if window.segment != segment or window.start > offset:
                continue
            if end <= window.end:
                windows.remove(window)
                windows.insert(0, window)
                self._last = window
                at = offset - window.start
                return window.data[at : at + size]
            if offset <= window.end + window.span:
                follows = window
        if size > LARGE_READ:
            # Large bodies gain nothing from a window and would crowd the small ones out.
            return self._exactly(segment, offset, size, self._pread(segment, offset, size))
        span = FIRST_WINDOW_BYTES
        if follows is not None:
            windows.remove(follows)
            span = min(2 * follows.span, WINDOW_BYTES)
        asked = span
        durable_end = self.durable_end
        limit = None if durable_end is None else durable_end(segment)
        if limit is not None:
            span = min(span, limit - offset)
        data = self._exactly(segment, offset, size, self._pread(segment, offset, max(span, size)))
        window = self._last = _Window(segment, offset, data, asked)
        windows.insert(0, window)
        del windows[WINDOWS:]
        return data[:size]

    def _pread(self, segment: int, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset``: fewer where the file ends."""
        self.preads += 1
        return os.pread(self._fd(segment), size, offset)

    @staticmethod
    def _exactly(segment: int, offset: int, size: int, data: bytes) -> bytes:
        if len(data) < size:
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
        """Close a segment about to be deleted, and drop its windows."""
        fd = self._fds.pop(segment, None)
        if fd is not None:
            os.close(fd)
        self._windows = [w for w in self._windows if w.segment != segment]
        if self._last.segment == segment:
            self._last = _NO_WINDOW

    def close(self) -> None:
        """Close every file."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._windows = []
        self._last = _NO_WINDOW
