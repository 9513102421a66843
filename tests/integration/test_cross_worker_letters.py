"""A consumer on one worker rejecting the messages of a queue another worker owns is held by
the dead letters its rejections make there, as by a local queue's (issue 31, docs/workers.md).

The queue on worker 1 dead-letters into a fanout bound to 40 queues of worker 1; its messages
fill most of worker 1's share of the memory budget, so the copies soon wait for room (a letter's
copies share its payload: what grows is each copy's overhead, 39 x 384 bytes a letter).
The consumer on worker 0 rejects everything. The owner charges the letters to the consumer and
reports what it owes (session/channel/owner.py); worker 0 charges it to the consumer's link,
which is held at the connection's limit (``account_limit``). Before, nothing was charged on
worker 0: the consumer took and rejected every message of the queue, each one's letter waiting
on worker 1.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from proton import Event, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from support.polling import wait_until
from support.process import serving
from support.workers import (
    ATTEMPTS,
    blocking_on,
    children,
    connect,
    connection_on,
    homed_on,
    worker_of,
)

from sluicegate.clients.management import ManagementClient
from sluicegate.gateway.events import delivery_of

# The queue's messages: 6 MB of the 8 MiB a worker has of a 16 MiB budget over two.
MESSAGES: Final = 1_500
BODY: Final = "x" * 4_000
# The fanout's queues: enough that 1,500 letters' copies outgrow the room the queue leaves.
FANNED: Final = 40
# The connection's dead-letter debt limit, and the consumer's prefetch.
LIMIT: Final = 20
PREFETCH: Final = 20


class _Rejecter(MessagingHandler):
    """Rejects every message of its queue, once told to consume (:attr:`go`); counts them."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(prefetch=PREFETCH, auto_accept=False)
        self.url = url
        self.queue = queue
        self.received = 0
        self.opened = threading.Event()
        self.go = threading.Event()
        self.consuming = False
        self.stopping = threading.Event()

    def on_start(self, event: Event) -> None:
        self.connection = event.container.connect(self.url)
        event.container.schedule(0.05, self)

    def on_connection_opened(self, event: Event) -> None:
        self.opened.set()

    def on_timer_task(self, event: Event) -> None:
        if self.stopping.is_set():
            self.connection.close()
            event.container.stop()
            return
        if self.go.is_set() and not self.consuming:
            self.consuming = True
            event.container.create_receiver(self.connection, f"/queues/{self.queue}")
        event.container.schedule(0.05, self)

    def on_message(self, event: Event) -> None:
        self.received += 1
        self.reject(delivery_of(event))


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[int, list[int]]]:
    options = (
        "--workers",
        "2",
        "--worker-handover",
        "false",
        "--data-dir",
        str(tmp_path),
        "--metrics-listen",
        "off",
    )
    budget = ("--memory-budget", "16MiB", "--account-limit", str(LIMIT))
    with serving(*options, "--http-api-listen", "off", *budget) as (process, port):
        yield port, sorted(children(process.pid), key=worker_of)


@pytest.mark.slow
def test_a_consumer_rejecting_another_workers_messages_is_held_by_its_letters_there(
    two_workers: tuple[int, list[int]],
) -> None:
    port, pids = two_workers
    queue = homed_on(1, 2, "rejected")
    fanned = [homed_on(1, 2, f"fanned{n}") for n in range(FANNED)]
    with connection_on(
        port,
        pids,
        pids[1],
        lambda: ManagementClient(f"amqp://127.0.0.1:{port}"),
        ManagementClient.close,
    ) as client:
        exchange = {"type": "fanout", "durable": False, "internal": False, "arguments": {}}
        assert client.request("PUT", "/exchanges/cw-fan", exchange).status == 204
        arguments = {"x-dead-letter-exchange": "cw-fan"}
        body = {"durable": False, "arguments": arguments}
        assert client.request("PUT", f"/queues/{queue}", body).status == 201
        for name in fanned:
            assert client.request("PUT", f"/queues/{name}", {"durable": False}).status == 201
            binding = {"source": "cw-fan", "destination_queue": name, "arguments": {}}
            assert client.request("POST", "/bindings", binding).status == 204
        publisher = blocking_on(port, pids, pids[1])
        sender = publisher.create_sender(f"/queues/{queue}")
        for _ in range(MESSAGES):
            sender.send(Message(body=BODY))
        publisher.close()
        rejecter, thread = _rejecter_on(port, pids, queue)
        try:
            rejecter.go.set()
            wait_until(lambda: rejecter.received > 0, 30)
            # Held: the count stops well short of the queue's messages (the letters stored
            # before the budget was full, the limit and a prefetch; without the charge, all).
            stopped = _settled(rejecter)
            assert stopped < MESSAGES // 2, f"{stopped} of {MESSAGES} taken and rejected"
            # The letters go nowhere once their queues are gone: repaid, and it goes on.
            for name in fanned:
                assert client.request("DELETE", f"/queues/{name}").status == 200
            wait_until(lambda: rejecter.received > stopped, 30)
        finally:
            rejecter.stopping.set()
            thread.join(10)


def _rejecter_on(port: int, pids: list[int], queue: str) -> tuple[_Rejecter, threading.Thread]:
    """A rejecter whose connection worker 0 accepted, not consuming yet."""
    for _ in range(ATTEMPTS):
        rejecter = _Rejecter(f"amqp://127.0.0.1:{port}", queue)
        thread = threading.Thread(target=Container(rejecter).run, daemon=True)

        def opened(rejecter: _Rejecter = rejecter, thread: threading.Thread = thread) -> None:
            thread.start()
            assert rejecter.opened.wait(10)

        _, owner = connect(port, pids, opened)
        if owner == pids[0]:
            return rejecter, thread
        rejecter.stopping.set()
        thread.join(10)
    raise AssertionError(f"no connection reached worker 0 in {ATTEMPTS} attempts")


def _settled(rejecter: _Rejecter) -> int:
    """What the rejecter received once a second went by without one more."""
    last = -1
    while rejecter.received != last:
        last = rejecter.received
        time.sleep(1)
    return last
