"""The placement file every worker of a server shares: each queue's home, recorded once.

``<data_dir>/placement`` holds one JSON line per queue placed or forgotten
(queues/queue_homes.py). A worker reads and appends it under an exclusive ``flock``, so two
workers declaring the same new queue at once record one home: the second finds the first's
line. A line torn by a worker killed while appending is cut off by the next writer, under the
lock, before it appends. Each append is fsynced: a queue's home outlives any crash that its
messages outlive.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeAlias

from sluicegate.queues.queue_homes import Homes

PLACEMENT_FILE: Final = "placement"
# A change to the homes: the home it gives and the record to append, if any.
_Change: TypeAlias = Callable[[], tuple[int, str | None]]


class HomesFile:
    """The homes of every queue, as far as this worker has read the shared file."""

    def __init__(self, data_dir: Path, workers: int) -> None:
        self.path = data_dir / PLACEMENT_FILE
        self.homes = Homes(workers)
        # Bytes of whole lines read so far.
        self._read = 0

    def place(self, vhost: str, name: str) -> int:
        """The queue's recorded home, recording the proposed one if it has none."""
        known = self.homes.home(vhost, name)
        if known is not None:
            return known
        return self._locked(lambda: self.homes.place(vhost, name))

    def forget(self, vhost: str, name: str) -> None:
        """The queue was deleted: its record goes (a new queue of the name is placed anew)."""
        self._locked(lambda: (0, self.homes.forget(vhost, name)))

    def _locked(self, change: _Change) -> int:
        """Read what others appended, apply ``change`` and append its record, under the lock."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            text = os.pread(fd, size - self._read, self._read).decode()
            self._read += len(text[: self.homes.read(text)].encode())
            if self._read < size:
                # A line torn by a worker that died appending: never confirmed, cut off.
                os.ftruncate(fd, self._read)
            home, record = change()
            if record is not None:
                encoded = record.encode()
                os.pwrite(fd, encoded, self._read)
                os.fsync(fd)
                self._read += len(encoded)
            return home
        finally:
            os.close(fd)
