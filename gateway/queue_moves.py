"""``sluicegate placement move``: queues of workers a server no longer has, moved to its workers.

A queue lives on one worker and its messages in that worker's log (``<data>/worker-K/log``,
docs/workers.md); a server started with fewer workers than the placement file needs refuses to
start. This moves each such queue to the worker the placement hash proposes among the ``N``
left (``Homes.rehome``), in an order that loses no confirmed message if it is interrupted:

1. every worker directory is locked as a server locks it (a running server refuses the move);
2. each queue's declaration, bindings and messages are copied into its new worker's log and
   fsynced (a copy left by an interrupted move is deleted first: the placement file still
   names the old worker, so that copy was never served);
3. the placement file is replaced atomically (written aside, fsynced, renamed);
4. the old workers' directories are renamed ``retired-worker-K``, kept for the operator to
   remove; nothing reads them again.

With ``N = 1`` the data directory then takes a single server's layout (``worker-0``'s log and
files moved up), as ``sluicegate serve --workers 1`` reads it. A stream moves as any queue: each
message's bytes carry its offset (``x-stream-offset``, stamped as it was appended), its arrival
time is copied with it, and the messages are copied in order with none left out, so the stream
recovered on its new worker starts at its first message's offset and numbers the rest as
before (queues/stream.py, ``StreamQueue.restore``): a reader attaching at an offset gets the
same messages. A stream retention emptied has no message to say its offset: its stream-offset
record is copied, and it goes on there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from sluicegate.gateway.durability import LOG_DIRECTORY, lock_data_dir
from sluicegate.gateway.queue_homes_file import PLACEMENT_FILE
from sluicegate.gateway.rules.vhost_log import logged_name
from sluicegate.gateway.supervisor import worker_dir
from sluicegate.gateway.worker_metrics import PORT_FILE
from sluicegate.queues.log.segments import SegmentWriter
from sluicegate.queues.log.store import MessageStore, StoredMessage, write_now
from sluicegate.queues.queue_homes import Homes

# Messages copied between two fsyncs of the new log: bounds what the copy holds in memory
# (bodies wait in the store until written) to a batch, as the server's group commit does.
COPY_BATCH: Final = 1024
RETIRED_PREFIX: Final = "retired-"
# A worker's files that a single server does not take over: its lock, and the port of its
# metrics endpoint that worker 0 scraped (gateway/worker_metrics.py).
_LEFT_BEHIND: Final = ("lock", PORT_FILE)


class MoveRefused(Exception):
    """The move cannot be made as asked; nothing was changed."""


def move_queues(data_dir: Path, workers: int, segment_size: int) -> list[str]:
    """Move the queues of workers beyond ``workers`` to the remaining ones; what was done, a
    line each. Raises :class:`MoveRefused` (nothing changed), DataDirLocked (a server runs)
    or OSError."""
    if workers < 1:
        raise MoveRefused("a server has at least one worker")
    if not data_dir.is_dir():
        raise MoveRefused(f"{data_dir} is not a data directory")
    dirs = sorted(
        (path for path in data_dir.glob("worker-*") if path.is_dir()),
        key=lambda path: _index(path.name),
    )
    single = (data_dir / LOG_DIRECTORY).exists()
    if single and (workers != 1 or not dirs):
        raise MoveRefused(f"{data_dir} holds a single server's log: no worker to move off")
    with contextlib.ExitStack() as locks:
        locks.enter_context(lock_data_dir(data_dir))
        for directory in dirs:
            locks.enter_context(lock_data_dir(directory))
        if single:
            # A move to one worker was interrupted while the layout changed: finish it.
            return _single_layout(data_dir)
        placement = data_dir / PLACEMENT_FILE
        text = placement.read_text() if placement.exists() else ""
        homes = Homes.replay(text, workers)
        moves = homes.rehome()
        report = _copy(data_dir, moves, segment_size)
        if moves:
            _replace(placement, homes.compacted())
        for directory in dirs:
            if _index(directory.name) >= workers:
                retired = directory.with_name(RETIRED_PREFIX + directory.name)
                directory.rename(retired)
                report.append(f"retired {directory.name} as {retired.name}: remove it once checked")
        if workers == 1:
            report.extend(_single_layout(data_dir))
        _sync(data_dir)
    return report or ["nothing to move"]


def _index(name: str) -> int:
    return int(name.removeprefix("worker-"))


def _copy(data_dir: Path, moves: list[tuple[str, str, int, int]], segment_size: int) -> list[str]:
    """Copy each moved queue into its new worker's log, fsynced."""
    report: list[str] = []
    sources: dict[int, MessageStore] = {}
    targets: dict[int, tuple[MessageStore, SegmentWriter]] = {}
    try:
        for vhost, name, old, new in moves:
            if old not in sources:
                sources[old] = _open(worker_dir(data_dir, old), segment_size)
            if new not in targets:
                directory = worker_dir(data_dir, new)
                store = _open(directory, segment_size)
                targets[new] = (store, SegmentWriter(directory / LOG_DIRECTORY))
            store, writer = targets[new]
            copied = _copy_queue(sources[old], store, writer, logged_name(vhost, name))
            report.append(
                f"moved queue '{name}' (vhost '{vhost}') from worker {old} to worker {new}: "
                f"{copied} durable messages"
            )
        for store, writer in targets.values():
            write_now(store, writer)
    finally:
        for store, writer in targets.values():
            writer.close()
            store.close(clean=not store.pending)
        for source in sources.values():
            source.close(clean=not source.pending)
    return report


def _open(directory: Path, segment_size: int) -> MessageStore:
    log = directory / LOG_DIRECTORY
    log.mkdir(parents=True, exist_ok=True)
    return MessageStore(log, segment_size=segment_size)


def _copy_queue(
    source: MessageStore, target: MessageStore, writer: SegmentWriter, logged: str
) -> int:
    """One queue's declaration, the bindings to it and its messages, from ``source`` to
    ``target``; how many messages."""
    if logged in target.queues:
        # A copy an interrupted move left: never served (the placement named the old worker).
        target.delete_queue(logged, list(_messages(target, logged)))
    arguments = source.queues.get(logged)
    if arguments is None:
        # Not durable: nothing of it is logged, only its home moves.
        return 0
    target.declare_queue(logged, arguments)
    # A stream retention emptied says where it goes on by this record alone (its messages,
    # once there are, say it again): docs/durability.md.
    offset = source.stream_offset(logged)
    if offset:
        target.stream_emptied(logged, offset)
    for key, binding in source.bindings.items():
        if key.destination != logged or key.to_exchange:
            continue
        exchange = source.exchanges.get(key.exchange)
        if exchange is not None and key.exchange not in target.exchanges:
            target.declare_exchange(
                key.exchange,
                exchange.kind,
                exchange.arguments,
                auto_delete=exchange.auto_delete,
                internal=exchange.internal,
            )
        target.bind(key.exchange, logged, key.key, binding)
    count = 0
    for message in _messages(source, logged):
        target.enqueue(
            logged,
            source.body(message),
            message.timestamp,
            message.expires,
            exchange=message.exchange,
            routing_key=message.routing_key,
            delivery_count=message.delivery_count,
        )
        count += 1
        if count % COPY_BATCH == 0:
            write_now(target, writer)
    return count


def _messages(store: MessageStore, logged: str) -> Iterator[StoredMessage]:
    return store.iter_recovered_messages(logged)


def _replace(path: Path, text: str) -> None:
    """Write ``path`` anew, atomically: aside, fsynced, renamed over it."""
    aside = path.with_name(path.name + ".new")
    with aside.open("w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    aside.replace(path)
    _sync(path.parent)


def _single_layout(data_dir: Path) -> list[str]:
    """A server of one worker is a single server: ``worker-0``'s files move up, the placement
    file goes (a single server neither reads nor needs it)."""
    worker = worker_dir(data_dir, 0)
    if not worker.exists():
        return []
    for entry in sorted(worker.iterdir()):
        if entry.name not in _LEFT_BEHIND:
            entry.rename(data_dir / entry.name)
    for name in _LEFT_BEHIND:
        (worker / name).unlink(missing_ok=True)
    worker.rmdir()
    (data_dir / PLACEMENT_FILE).unlink(missing_ok=True)
    return [f"{data_dir} now has a single server's layout (serve it with --workers 1)"]


def _sync(directory: Path) -> None:
    """Make the renames in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
