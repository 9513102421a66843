"""Which worker process of ``sluicegate serve --workers N`` serves a client connection.

The kernel spreads connections over the workers (SO_REUSEPORT); a test that needs a given
worker connects until that one accepted, telling by which worker holds the socket of the
connection's port (``/proc``), as an operator would with ``ss -p``.
"""

from __future__ import annotations

import contextlib
import os
import re
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from proton import Message, Timeout
from proton.utils import BlockingConnection, BlockingSender, SendException

from sluicegate.queues.queue_homes import proposed_home
from support.polling import wait_until
from support.ports import free_port
from support.process import serving

C = TypeVar("C")
# Connections tried before a test gives up reaching one worker: with two workers, 200 all
# landing on the other happen 1 time in 2**200.
ATTEMPTS = 200


def children(pid: int) -> list[int]:
    """The worker processes of the supervisor ``pid``, in the order they were forked."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def tcp_entries() -> list[tuple[int, int, int]]:
    """(local port, remote port, inode) of every established IPv4 TCP socket."""
    entries = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] != "01":
            continue
        local = int(fields[1].rsplit(":", 1)[1], 16)
        remote = int(fields[2].rsplit(":", 1)[1], 16)
        entries.append((local, remote, int(fields[9])))
    return entries


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def client_ports(port: int) -> set[int]:
    """Local ports of the connections to ``port`` on this machine."""
    return {local for local, remote, _ in tcp_entries() if remote == port}


def serving_worker(port: int, local: int, workers: list[int]) -> int | None:
    """The worker process that holds the server's end of the connection from ``local``."""
    inodes = {inode for here, there, inode in tcp_entries() if (here, there) == (port, local)}
    return next((pid for pid in workers if inodes & socket_inodes(pid)), None)


def connect(port: int, workers: list[int], opened: Callable[[], C]) -> tuple[C, int]:
    """A connection ``opened`` makes to the server, and the worker process that accepted it."""
    connection, owner, _ = connect_from(port, workers, opened)
    return connection, owner


def connect_from(port: int, workers: list[int], opened: Callable[[], C]) -> tuple[C, int, int]:
    """:func:`connect`, with the connection's local port (for :func:`serving_worker`)."""
    before = client_ports(port)
    connection = opened()
    (mine,) = client_ports(port) - before
    owners: list[int] = []

    def accepted() -> bool:
        inodes = {
            inode for local, remote, inode in tcp_entries() if (local, remote) == (port, mine)
        }
        owners[:] = [pid for pid in workers if inodes & socket_inodes(pid)]
        return bool(owners)

    wait_until(accepted)
    return connection, owners[0], mine


def connection_on(
    port: int,
    workers: list[int],
    wanted: int,
    opened: Callable[[], C],
    close: Callable[[C], None],
) -> C:
    """Connect with ``opened`` until the kernel hands a connection to worker ``wanted``."""
    for _ in range(ATTEMPTS):
        connection, owner = connect(port, workers, opened)
        if owner == wanted:
            return connection
        close(connection)
    raise AssertionError(f"no connection reached worker {wanted} in {ATTEMPTS} attempts")


def placed_on(
    port: int,
    workers: list[int],
    wanted: int,
    opened: Callable[[], C],
    close: Callable[[C], None],
) -> tuple[C, int]:
    """:func:`connection_on`, with the connection's local port."""
    for _ in range(ATTEMPTS):
        connection, owner, local = connect_from(port, workers, opened)
        if owner == wanted:
            return connection, local
        close(connection)
    raise AssertionError(f"no connection reached worker {wanted} in {ATTEMPTS} attempts")


def worker_of(pid: int) -> int:
    """The index of the worker ``pid`` is: the worker-K directory its log lock is in."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            match = re.search(r"/worker-(\d+)/", os.readlink(fd))
            if match is not None:
                return int(match.group(1))
    raise AssertionError(f"process {pid} holds nothing in a worker directory")


def blocking_on(port: int, workers: list[int], wanted: int) -> BlockingConnection:
    """A proton blocking connection served by worker process ``wanted``."""
    return connection_on(
        port,
        workers,
        wanted,
        lambda: BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=20),
        BlockingConnection.close,
    )


def homed_on(home: int, workers: int, prefix: str = "placed") -> str:
    """A queue name of the default virtual host the placement hash puts on worker ``home``."""
    return next(
        name
        for name in (f"{prefix}-{n}" for n in range(1000))
        if proposed_home("/", name, workers) == home
    )


@contextlib.contextmanager
def metered_workers(data_dir: Path, budget: str, *extra: str) -> Iterator[tuple[int, list[int]]]:
    """``serve --workers 2`` with ``budget`` and a metrics endpoint, so that each worker's own
    budget can be read (:func:`budget_used`): the port and the workers' processes by index;
    ``extra``: more options."""
    # The channel is what these tests weigh: no connection is handed over to its queue's
    # worker (docs/workers.md#handing-a-connection-over).
    options = ("--workers", "2", "--worker-handover", "false", "--data-dir", str(data_dir))
    budgets = ("--memory-budget", budget)
    metrics = ("--metrics-listen", f"127.0.0.1:{free_port()}", "--http-api-listen", "off")
    with serving(*options, *budgets, *metrics, *extra) as (process, port):
        yield port, sorted(children(process.pid), key=worker_of)


def own_sample(data_dir: Path, worker: int, name: str) -> float:
    """Worker ``worker``'s own sample of ``name`` (1 or more: worker 0's endpoint adds up
    every worker's), from the port it leaves in ``worker-K/metrics.port``."""
    metrics_port = (data_dir / f"worker-{worker}" / "metrics.port").read_text().strip()
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} sample")


def budget_used(data_dir: Path, worker: int) -> float:
    """What worker ``worker`` says its own memory budget counts."""
    return own_sample(data_dir, worker, "sluicegate_memory_budget_used_bytes")


# Seconds a send may wait for its settlement before the sender counts as held: the budget
# answers a publish it stores at once, so three seconds without one is a hold, not a slow host.
HELD_AFTER = 3


def send_until_held(sender: BlockingSender, body: bytes | str) -> int:
    """Send ``body`` until the budget holds the sender (its settlement never comes): how many
    were settled."""
    stored = 0
    while True:
        try:
            sender.send(Message(body=body), timeout=HELD_AFTER)
        except (Timeout, SendException):
            return stored
        stored += 1


def drained(connection: BlockingConnection, queue: str, credit: int) -> int:
    """Read ``queue`` until a second passes with nothing, accepting each message: how many it
    gave (the letters tests' count of what arrived once a worker let go)."""
    receiver = connection.create_receiver(f"/queues/{queue}", credit=credit)
    count = 0
    try:
        while True:
            receiver.receive(timeout=1)
            receiver.accept()
            count += 1
    except Timeout:
        pass
    receiver.close()  # type: ignore[no-untyped-call]
    return count
