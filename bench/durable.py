"""Durable-queue figures: throughput with fsync, RSS under a 1 GB backlog, recovery time.

Run from the repository root (a shared, loaded machine gives noisy numbers: run twice)::

    python bench/durable.py throughput   # 1 sender, 1 receiver, credit 100,000, 100-byte bodies
    python bench/durable.py backlog      # RSS of the server holding a 1 GB durable backlog
    python bench/durable.py recovery     # restart time over a log of 1,000,000 messages
    python bench/durable.py stream       # memory per message of a durable stream
    python bench/durable.py damaged      # recovery's scan past damage in a 16 MiB segment

``throughput`` runs the server in this process (to read its group-commit statistics) and the
clients in ``sluicegate quiver`` subprocesses; ``backlog`` and ``recovery`` run the server as a
subprocess (``python -m sluicegate serve``) whose RSS and start-up time are measured from outside.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from proton import Event, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from sluicegate.gateway.config import ServerConfig
from sluicegate.gateway.server import Server
from sluicegate.queues.log.segments import SegmentWriter, recover, segment_path
from sluicegate.queues.log.store import DEFAULT_SEGMENT_SIZE, MessageStore, write_now
from sluicegate.queues.message import Message as QueueMessage
from sluicegate.queues.queue_type import Clock
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.stream import StreamQueue

_SERVE = [sys.executable, "-m", "sluicegate", "serve", "--listen", "127.0.0.1:0"]
_SERVE += ["--metrics-listen", "off", "--http-api-listen", "off"]
_LISTENING = re.compile(r"^sluicegate listening on amqp://127\.0\.0\.1:(\d+)$")
MiB = 1024 * 1024


def throughput(count: int, body_size: int, credit: int, link_credit: int) -> None:
    """Durable end-to-end rate through an in-process server, and how fsyncs were grouped.

    A publisher has at most ``max_link_credit`` messages unconfirmed (credit follows
    confirmations), so one fsync covers at most that many of its messages.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    config = ServerConfig(
        listen="127.0.0.1:0",
        data_dir=data_dir,
        metrics_listen="off",
        http_api_listen="off",
        max_link_credit=link_credit,
    )
    server = Server(config)
    server.start()
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    output = data_dir / "quiver"
    try:
        url = f"amqp://127.0.0.1:{server.port}/durable-bench"
        command = [
            sys.executable,
            "-m",
            "sluicegate.cli.main",
            "quiver",
            url,
            "--count",
            str(count),
        ]
        command += ["--body-size", str(body_size), "--credit", str(credit), "--durable"]
        command += ["--json", "--output", str(output), "--timeout", "120"]
        started = time.monotonic()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        elapsed = time.monotonic() - started
        results = json.loads((output / "summary.json").read_text())
        writer = server.durability.statistics()
        print(f"durable throughput: {count} messages of {body_size} B, credit {credit}")
        print(f"  max_link_credit {link_credit}, quiver JSON: {json.dumps(results)}")
        print(f"  wall time incl. client start: {elapsed:.1f} s")
        print(
            f"  fsyncs {writer.fsyncs}, messages {writer.messages}, "
            f"mean {writer.messages / max(writer.fsyncs, 1):.0f} messages per fsync, "
            f"largest group {writer.largest_group}, bytes {writer.bytes_written}"
        )
    finally:
        server.request_shutdown()
        thread.join(30)
        shutil.rmtree(data_dir, ignore_errors=True)


class _Publisher(MessagingHandler):
    """Sends pre-encoded durable messages as fast as credit allows; counts confirmations.

    ``links`` senders share the work: the server confirms at most ``max_link_credit``
    messages per link per fsync, so more links fill each group commit further.
    """

    def __init__(self, url: str, address: str, count: int, body_size: int, links: int) -> None:
        super().__init__(auto_settle=True)
        self.url, self.address, self.count, self.links = url, address, count, links
        self.payload = Message(body=b"x" * body_size, durable=True).encode()
        self.sent = 0
        self.accepted = 0

    def on_start(self, event: Event) -> None:
        assert event.container is not None
        connection = event.container.connect(self.url, reconnect=False)
        for index in range(self.links):
            # Distinct names: two links of one name on a connection are a protocol error.
            event.container.create_sender(connection, self.address, name=f"backlog-{index}")

    def on_sendable(self, event: Event) -> None:
        sender = event.sender
        assert sender is not None
        while sender.credit > 0 and self.sent < self.count:
            sender.delivery(str(self.sent))
            sender.stream(self.payload)
            sender.advance()
            self.sent += 1

    def on_accepted(self, event: Event) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            assert event.connection is not None
            event.connection.close()


def _serve(data_dir: Path) -> tuple[subprocess.Popen[str], int, float]:
    started = time.monotonic()
    process = subprocess.Popen(
        [*_SERVE, "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    match = _LISTENING.match(process.stdout.readline().rstrip("\n"))
    if match is None:
        process.kill()
        raise SystemExit("the server did not start")
    return process, int(match.group(1)), time.monotonic() - started


def _rss(pid: int) -> tuple[int, int]:
    """Current and peak resident set size in bytes (VmRSS, VmHWM)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    process.wait(60)


def backlog(total: int, body_size: int, links: int) -> None:
    """Publish ``total`` bytes of durable messages nobody consumes; report the server's RSS."""
    data_dir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    count = total // body_size
    process, port, _ = _serve(data_dir)
    try:
        idle, _ = _rss(process.pid)
        publisher = _Publisher(f"amqp://127.0.0.1:{port}", "backlog", count, body_size, links)
        started = time.monotonic()
        Container(publisher).run()
        elapsed = time.monotonic() - started
        if publisher.accepted != count:
            raise SystemExit(f"only {publisher.accepted} of {count} messages were confirmed")
        rss, peak = _rss(process.pid)
        disk = sum(p.stat().st_size for p in (data_dir / "log").iterdir())
        size = count * body_size / MiB
        print(f"durable backlog: {count} messages of {body_size} B ({size:.0f} MiB)")
        print(f"  published and confirmed in {elapsed:.1f} s ({count / elapsed:.0f} msg/s)")
        print(f"  log on disk {disk / MiB:.0f} MiB")
        print(f"  server RSS idle {idle / MiB:.0f} MiB, after {rss / MiB:.0f} MiB")
        print(f"  server peak RSS {peak / MiB:.0f} MiB")
    finally:
        _stop(process)
    process, port, startup = _serve(data_dir)
    try:
        rss, peak = _rss(process.pid)
        print(f"  restart over it: ready in {startup:.1f} s")
        print(f"  RSS after the restart {rss / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB")
    finally:
        _stop(process)
        shutil.rmtree(data_dir, ignore_errors=True)


def recovery(count: int, body_size: int) -> None:
    """Write a log of ``count`` live messages with the store itself, then time a server start."""
    data_dir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    directory = data_dir / "log"
    store = MessageStore(directory)
    writer = SegmentWriter(directory)
    store.declare_queue("recovered", {})
    payload = Message(body=b"x" * body_size, durable=True).encode()
    for index in range(count):
        store.enqueue("recovered", payload, index)
        if index % 10_000 == 9_999:
            write_now(store, writer)
    write_now(store, writer)
    store.close()
    writer.close()
    disk = sum(p.stat().st_size for p in directory.iterdir())
    process, _, startup = _serve(data_dir)
    try:
        rss, peak = _rss(process.pid)
        print(f"recovery: {count} messages of {body_size} B, log {disk / MiB:.0f} MiB")
        print(f"  process start to listening (includes the Python start): {startup:.1f} s")
        print(f"  server RSS after recovery {rss / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB")
    finally:
        _stop(process)
        shutil.rmtree(data_dir, ignore_errors=True)


def stream(count: int, body_size: int) -> None:
    """Append ``count`` messages to a durable stream in this process; report memory per message.

    Through the registry and the store as the gateway does (stamp the offset, log the stamped
    bytes, append the stored copy), with a group commit every 10,000 messages.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    store = MessageStore(data_dir)
    writer = SegmentWriter(data_dir)
    registry = QueueRegistry(Clock(0), store=store)
    queue = registry.declare_queue("stream", {"x-queue-type": "stream"})
    assert isinstance(queue, StreamQueue)
    payload = Message(body=b"x" * body_size, durable=True).encode()
    gc.collect()
    before, _ = _rss(os.getpid())
    started = time.monotonic()
    for index in range(count):
        stamped = queue.as_stored(QueueMessage(payload))
        queue.enqueue(store.enqueue("stream", stamped.payload, index))
        if index % 10_000 == 9_999:
            write_now(store, writer)
    gc.collect()
    after, _ = _rss(os.getpid())
    print(
        f"durable stream: {count} messages of {body_size} B in {time.monotonic() - started:.0f} s"
    )
    print(
        f"  RSS grew {(after - before) / MiB:.0f} MiB ({(after - before) / count:.0f} B a message)"
    )
    print(f"  the memory budget counts {registry.held.total / MiB:.0f} MiB")
    store.close()
    writer.close()
    shutil.rmtree(data_dir, ignore_errors=True)


def _damaged_segment(directory: Path, body_size: int) -> tuple[Path, list[int]]:
    """A 16 MiB segment of live messages (one of them of 8 MiB), closed after a crash: its
    path and where each record starts."""
    store = MessageStore(directory)
    writer = SegmentWriter(directory)
    store.declare_queue("q", {})
    payload = Message(body=b"x" * body_size, durable=True).encode()
    large = Message(body=os.urandom(8 * MiB), durable=True).encode()
    starts = []
    index = 0
    while store.placement.offset + 2 * len(payload) < 16 * MiB:
        message = store.enqueue("q", large if index == 1000 else payload, index)
        starts.append(message.record)
        index += 1
    write_now(store, writer)
    store.close()
    writer.close()
    return segment_path(directory, store.segment), starts


def damaged(body_size: int) -> None:
    """Time recovery's scan for valid records after damage no crash explains, or after a torn
    tail, in a 16 MiB segment: an 8 MiB record whose length is damaged (valid records follow),
    and a tail of 8 MiB of zeros or of random bytes (a crash on a file system that leaves
    them; nothing valid follows)."""
    root = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
    path, starts = _damaged_segment(root / "original", body_size)
    whole = path.read_bytes()
    cut = starts[len(starts) // 2]
    faults = {
        "length of an 8 MiB record damaged": whole[: starts[1000]]
        + b"\x7f"
        + whole[starts[1000] + 1 :],
        "8 MiB of zeros after the last record": whole[:cut] + bytes(8 * MiB),
        # Starting with a length no record has: a search follows, not a record cut short.
        "8 MiB of random bytes after the last record": whole[:cut]
        + b"\xff"
        + os.urandom(8 * MiB - 1),
    }
    print(f"damaged: a segment of {len(whole) / MiB:.0f} MiB, {len(starts)} records")
    started, cpu = time.monotonic(), time.process_time()
    recover(root / "original", DEFAULT_SEGMENT_SIZE)
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    print(f"  undamaged: recovered in {elapsed:.2f} s ({cpu:.2f} s CPU)")
    for name, data in faults.items():
        directory = root / "copy"
        shutil.copytree(root / "original", directory)
        segment_path(directory, 1).write_bytes(data)
        started, cpu = time.monotonic(), time.process_time()
        state = recover(directory, DEFAULT_SEGMENT_SIZE).state
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
        [damage] = state.damages
        print(
            f"  {name}: recovered in {elapsed:.2f} s ({cpu:.2f} s CPU), {damage.following} "
            f"valid records follow ({'torn tail' if damage.torn else 'refused'})"
        )
        shutil.rmtree(directory)
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "figure", choices=["throughput", "backlog", "recovery", "stream", "damaged"]
    )
    parser.add_argument("--count", type=int, help="messages (default: per figure)")
    parser.add_argument("--body-size", type=int, help="bytes per body (default: per figure)")
    parser.add_argument("--credit", type=int, default=100_000)
    parser.add_argument("--max-link-credit", type=int, default=170, help="the server's setting")
    parser.add_argument("--backlog-bytes", type=int, default=1024 * MiB)
    parser.add_argument("--links", type=int, default=1, help="backlog: publishing links")
    args = parser.parse_args()
    if args.figure == "throughput":
        throughput(args.count or 100_000, args.body_size or 100, args.credit, args.max_link_credit)
    elif args.figure == "backlog":
        backlog(args.backlog_bytes, args.body_size or 4096, args.links)
    elif args.figure == "stream":
        stream(args.count or 1_000_000, args.body_size or 100)
    elif args.figure == "damaged":
        damaged(args.body_size or 100)
    else:
        recovery(args.count or 1_000_000, args.body_size or 100)


if __name__ == "__main__":
    main()
