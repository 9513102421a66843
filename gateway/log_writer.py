"""The log writer: a thread that writes the store's batches and covers them with one fsync.

Group commit: while one fsync runs, the reactor keeps placing records; the next time round the
thread takes every batch that waits and writes them all before a single fsync, so the number of
fsyncs per second adapts to the disk, not to the message rate. Completions go back to the
reactor thread through :class:`gateway.wakeup.Wakeup`; nothing here touches proton.

A failing write (ENOSPC, EIO) is retried with exponential backoff (tenacity) until it succeeds:
every record has a fixed place, so the whole group is written again at the same offsets and
fsynced again (after a failed fsync the kernel may have dropped the dirty pages). Meanwhile
nothing is confirmed, so publishers to durable queues run out of credit
(docs/inbound-flow-control.md) and resume when the disk does.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeAlias

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_exponential,
)

from sluicegate.queues.log.placement import WriteBatch, write_batches
from sluicegate.queues.log.segments import SegmentWriter

if TYPE_CHECKING:
    from sluicegate.gateway.wakeup import Wakeup

log = logging.getLogger("sluicegate.log")

# A test's way to make the disk fail: called before each attempt with the bytes about to be
# written; raising OSError makes the attempt fail as a real write or fsync would.
FaultHook: TypeAlias = Callable[[int], None]
# What the reactor thread gets back: the batches now durable, each with its caller's token.
Committed: TypeAlias = list[tuple[WriteBatch, object]]

# Backoff between attempts on a failing disk: quick at first (a transient EIO), then at most
# every two seconds (a full disk waits for an operator).
_RETRY_FIRST: Final = 0.01
_RETRY_MAX: Final = 2.0
_STOP: Final = object()


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """Group-commit figures: how many fsyncs and how much each one covered."""

    fsyncs: int
    batches: int
    messages: int
    bytes_written: int
    # The most messages one fsync covered.
    largest_group: int
    failed_attempts: int
    failing: bool


class LogWriter:
    """The thread that owns the writing side of the log."""

    def __init__(
        self,
        directory: Path,
        wakeup: Wakeup,
        on_committed: Callable[[Committed], None],
        on_failing: Callable[[bool], None],
        fault: FaultHook | None = None,
    ) -> None:
        self._directory = directory
        self._wakeup = wakeup
        self._on_committed = on_committed
        self._on_failing = on_failing
        self._fault = fault
        self._inbox: queue.SimpleQueue[tuple[WriteBatch, object] | object] = queue.SimpleQueue()
        # Set to give up retrying at shutdown: what is not durable by then was never confirmed.
        self._abandon = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluicegate-log", daemon=True)
        self._fsyncs = 0
        self._batches = 0
        self._messages = 0
        self._bytes = 0
        self._largest = 0
        self._failed_attempts = 0
        self._failing = False
        self._quiet = False
        # True once shutdown gave up on a failing disk: the log then ends torn, not clean.
        self.abandoned = False

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, batch: WriteBatch, token: object) -> None:
        """Queue a batch; ``token`` comes back with it once it is durable."""
        self._inbox.put((batch, token))

    def stop(self, timeout: float) -> None:
        """Write what is queued, then end; give up retrying a failing disk after ``timeout``.

        Nothing is reported to the reactor any more: it is shutting down.
        """
        self._quiet = True
        self._inbox.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abandon.set()
            self._thread.join()

    def statistics(self) -> WriterStatistics:
        """A snapshot (read from another thread: each field is one atomic read)."""
        return WriterStatistics(
            fsyncs=self._fsyncs,
            batches=self._batches,
            messages=self._messages,
            bytes_written=self._bytes,
            largest_group=self._largest,
            failed_attempts=self._failed_attempts,
            failing=self._failing,
        )

    def _run(self) -> None:
        writer = SegmentWriter(self._directory)
        try:
            stopping = False
            while not stopping:
                items = [self._inbox.get()]
                while True:
                    try:
                        items.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                group: Committed = []
                for item in items:
                    if item is _STOP:
                        stopping = True
                    else:
                        assert isinstance(item, tuple)
                        group.append(item)
                if group and self._commit(writer, group):
                    self._post(partial(self._on_committed, group))
        finally:
            writer.close()

    def _commit(self, writer: SegmentWriter, group: Committed) -> bool:
        batches = [batch for batch, _ in group]
        size = sum(batch.size for batch in batches)
        retrying = Retrying(
            retry=retry_if_exception_type(OSError),
            wait=wait_exponential(multiplier=_RETRY_FIRST, max=_RETRY_MAX),
            stop=stop_when_event_set(self._abandon),
            before_sleep=self._failed,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    if self._fault is not None:
                        self._fault(size)
                    write_batches(writer, batches)
        except OSError as error:
            self.abandoned = True
            log.error("giving up on %d unconfirmed bytes at shutdown: %s", size, error)
            return False
        self._fsyncs += 1
        self._batches += len(batches)
        self._bytes += size
        messages = sum(len(batch.messages) for batch in batches)
        self._messages += messages
        self._largest = max(self._largest, messages)
        if self._failing:
            self._failing = False
            log.warning("the log is writable again")
            self._post(partial(self._on_failing, False))
        return True

    def _post(self, callback: Callable[[], None]) -> None:
        if not self._quiet:
            self._wakeup.call_soon(callback)

    def _failed(self, state: RetryCallState) -> None:
        self._failed_attempts += 1
        if not self._failing:
            self._failing = True
            outcome = state.outcome
            error = outcome.exception() if outcome is not None else None
            log.error("cannot write the log (%s): publishers wait, retrying", error)
            self._post(partial(self._on_failing, True))
