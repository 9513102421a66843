"""Durability for the server: the store under ``--data-dir``, its writer thread, recovery.

Persistent messages (header ``durable = true``) published to durable queues are appended to the
log as they arrive; the publisher's delivery waits in the current batch and is confirmed (its
``accepted`` sent, its link's credit renewed) only when the writer thread reports the fsync
that covers it. Everything else stays in memory and is confirmed at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, TextIO, cast

from sluicegate.gateway.confirming import Pending, confirm
from sluicegate.gateway.log_writer import Committed, FaultHook, LogWriter, WriterStatistics
from sluicegate.gateway.rules.vhost_log import split_logged_name
from sluicegate.queues.log.store import MessageStore
from sluicegate.queues.log.stored import StoredMessage
from sluicegate.queues.message import Message
from sluicegate.queues.registry import QueueRegistry

if TYPE_CHECKING:
    from sluicegate.gateway.wakeup import Wakeup

log = logging.getLogger("sluicegate.log")

# How long shutdown waits for the last batches before it gives up on a failing disk.
STOP_TIMEOUT: Final = 10.0
LOG_DIRECTORY: Final = "log"


class DataDirLocked(OSError):
    """Another server already uses the data directory."""


class VhostNotConfigured(ValueError):
    """The log holds what a virtual host the configuration no longer declares had."""


class Durability:
    """The durable store of one server and the confirmations waiting for its fsyncs."""

    def __init__(
        self,
        data_dir: Path,
        wakeup: Wakeup,
        *,
        segment_size: int,
        cache_bytes: int,
        fault: FaultHook | None = None,
    ) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = lock_data_dir(data_dir)
        directory = data_dir / LOG_DIRECTORY
        self.store = MessageStore(directory, segment_size=segment_size, cache_bytes=cache_bytes)
        torn = self.store.recovered.torn_tail
        if torn is not None:
            log.warning(
                "the log ended torn by a crash: cut %d bytes from segment %d at offset %s "
                "(written after the last fsync, never confirmed)",
                torn.dropped_bytes,
                torn.segment,
                torn.offset,
            )
        self.writer = LogWriter(directory, wakeup, self._committed, self._set_failing, fault)
        self._waiting: list[Pending] = []
        # True while the disk refuses writes: publishers to durable queues get no credit.
        self.failing = False

    def recover(self, registries: Mapping[str, QueueRegistry]) -> None:
        """Declare every durable exchange, queue and binding again and put the messages back.

        Each goes to the registry of its virtual host (``registries`` by name); one the
        configuration does not declare stops the server rather than losing its messages.
        Nothing is read: classic queues get pages pointing at the records, paged in on demand.
        """
        store = self.store
        logged_vhosts = {split_logged_name(name)[0] for name in (*store.exchanges, *store.queues)}
        missing = sorted(logged_vhosts - set(registries))
        if missing:
            self.store.close()
            self._lock.close()
            raise VhostNotConfigured(
                f"the log holds queues or exchanges of virtual host {missing[0]!r}, which the "
                f"configuration does not declare: add a [vhosts.{missing[0]}] table"
            )

        def registry_of(logged: str) -> tuple[QueueRegistry, str]:
            vhost, name = split_logged_name(logged)
            return registries[vhost], name

        for logged, declared in list(store.exchanges.items()):
            registry, name = registry_of(logged)
            registry.declare_exchange(
                name,
                declared.kind,
                auto_delete=declared.auto_delete,
                internal=declared.internal,
                arguments=declared.arguments,
            )
        for logged, arguments in list(store.queues.items()):
            registry, name = registry_of(logged)
            registry.recover_queue(name, arguments)
        for key, arguments in list(store.bindings.items()):
            registry, exchange = registry_of(key.exchange)
            destination = split_logged_name(key.destination)[1]
            registry.bind(exchange, destination, key.key, arguments, to_exchange=key.to_exchange)

    def start(self) -> None:
        """Start the writer thread."""
        self.writer.start()

    def persist(self, queue: str, message: Message, pending: Pending) -> StoredMessage:
        """Append a persistent message; ``pending`` is confirmed after the covering fsync."""
        stored = self.store.enqueue(
            queue,
            message.payload,
            int(time.time() * 1000),
            message.expires,
            exchange=message.exchange,
            routing_key=message.routing_key,
            delivery_count=message.delivery_count,
        )
        self._waiting.append(pending)
        return stored

    def withdraw(self, message: StoredMessage) -> None:
        """The queue refused the message just persisted: archive it, confirm nobody for it."""
        self._waiting.pop()
        message.discard()

    def flush(self) -> None:
        """Hand what was appended since the last flush to the writer thread."""
        store = self.store
        if store.pending:
            self.writer.submit(store.take_batch(), self._waiting)
            self._waiting = []

    def _committed(self, group: Committed) -> None:
        """On the reactor thread: batches are durable; confirm their publishers."""
        store = self.store
        for batch, token in group:
            store.written(batch)
            for pending in cast("list[Pending]", token):
                confirm(pending)

    def _set_failing(self, failing: bool) -> None:
        self.failing = failing

    def statistics(self) -> WriterStatistics:
        """The writer's group-commit figures."""
        return self.writer.statistics()

    def close(self) -> None:
        """Write what is pending, stop the writer, release the directory."""
        self.flush()
        self.writer.stop(STOP_TIMEOUT)
        self.store.close(clean=not self.writer.abandoned)
        self._lock.close()


def lock_data_dir(data_dir: Path) -> TextIO:
    """Hold an exclusive lock on the data directory for the life of the server."""
    file = (data_dir / "lock").open("a")
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        raise DataDirLocked(f"{data_dir} is in use by another sluicegate server") from None
    file.truncate(0)
    file.write(f"{os.getpid()}\n")
    file.flush()
    return file
