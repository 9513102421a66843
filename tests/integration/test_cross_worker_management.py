"""Management of a queue on the worker that does not own it (issue 35, docs/workers.md): its
counts are the owner's, a purge purges there, and auto-delete and x-expires count consumers on
every worker. One server of two workers serves the module: each test uses queues of its own."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import Message
from proton.utils import BlockingConnection
from support.polling import wait_until
from support.ports import free_port
from support.process import serving
from support.raw_client import RawClient
from support.workers import blocking_on, children, connection_on, homed_on, worker_of

from sluicegate.clients.management import ManagementClient, Reply

# How long a deletion another worker makes may take to be seen, on a loaded machine.
GONE_WITHIN = 30.0


@dataclass(frozen=True)
class Workers:
    """A server of two workers: its AMQP port, worker pids by index, metrics and HTTP ports
    (both served by worker 0)."""

    port: int
    pids: list[int]
    metrics: int
    http: int

    def management(self, worker: int) -> ManagementClient:
        url = f"amqp://127.0.0.1:{self.port}"
        return connection_on(
            self.port,
            self.pids,
            self.pids[worker],
            lambda: ManagementClient(url),
            ManagementClient.close,
        )

    def connection(self, worker: int) -> BlockingConnection:
        return blocking_on(self.port, self.pids, self.pids[worker])


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    metrics, http = free_port(), free_port()
    data_dir = tmp_path_factory.mktemp("workers")
    options = ("--workers", "2", "--worker-handover", "false", "--data-dir", str(data_dir))
    listens = ("--metrics-listen", f"127.0.0.1:{metrics}", "--http-api-listen", f"127.0.0.1:{http}")
    with serving(*options, *listens) as (process, port):
        pids = sorted(children(process.pid), key=worker_of)
        yield Workers(port, pids, metrics, http)


def _http(workers: Workers, path: str, method: str = "GET", body: object = None) -> object:
    """The HTTP API's JSON answer (None for none; the status of a PUT); an error status raises
    HTTPError."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{workers.http}{path}",
        method=method,
        data=data,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        if method == "PUT":
            return response.status
        answer = response.read()
        return json.loads(answer) if answer else None


def _ready_gauge(workers: Workers, queue: str) -> float:
    url = f"http://127.0.0.1:{workers.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=20) as response:
        text = response.read().decode()
    labels = {"queue": queue, "vhost": "/"}
    return next(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sluicegate_queue_messages_ready" and sample.labels == labels
    )


def _described(client: ManagementClient, queue: str) -> Reply:
    return client.request("GET", f"/queues/{quote(queue, safe='')}")


def test_either_worker_shows_the_owners_counts_and_purges_there(workers: Workers) -> None:
    queue = homed_on(1, 2, "counted")
    with workers.management(0) as far, workers.management(1) as home:
        assert far.request("PUT", f"/queues/{queue}", {"durable": True}).status == 201
        for worker, count in ((0, 3), (1, 4)):
            publisher = workers.connection(worker)
            sender = publisher.create_sender(queue)
            for n in range(count):
                sender.send(Message(body=f"m{n}"))
            publisher.close()
        for client in (far, home):
            reply = _described(client, queue)
            assert reply.status == 200
            assert isinstance(reply.body, dict)
            assert reply.body["message_count"] == 7
        # Declaring it again where it does not live answers the owner's count too.
        again = far.request("PUT", f"/queues/{queue}", {"durable": True})
        assert again.status == 200
        assert isinstance(again.body, dict)
        assert again.body["message_count"] == 7
        # The HTTP API runs on worker 0, which holds a stand-in for the queue.
        shown = _http(workers, f"/api/queues/%2F/{queue}")
        assert isinstance(shown, dict)
        assert (shown["messages"], shown["messages_ready"]) == (7, 7)
        listed = _http(workers, "/api/queues/%2F")
        assert isinstance(listed, list)
        assert [q["messages"] for q in listed if q["name"] == queue] == [7]
        # One scrape counts the messages once, on their owner.
        assert _ready_gauge(workers, queue) == 7
        # A conditional deletion is decided on the owner's counts.
        with pytest.raises(urllib.error.HTTPError) as refused:
            _http(workers, f"/api/queues/%2F/{queue}?if-empty=true", "DELETE")
        refused.value.close()
        assert refused.value.code == 400
        # A purge where the queue does not live purges where it does.
        purged = far.request("DELETE", f"/queues/{queue}/messages")
        assert purged.status == 200
        assert purged.body == {"message_count": 7}
        reply = _described(home, queue)
        assert isinstance(reply.body, dict)
        assert reply.body["message_count"] == 0
        assert _http(workers, f"/api/queues/%2F/{queue}?if-empty=true", "DELETE") is None
        wait_until(lambda: _described(home, queue).status == 404, timeout=GONE_WITHIN)


def test_a_deletion_where_the_queue_does_not_live_answers_the_owners_count(
    workers: Workers,
) -> None:
    """The owner deletes the queue and counts what it deleted; the deletion reaches the asking
    worker before its answer, so neither worker shows the queue once the reply is in."""
    amqp_queue, http_queue = homed_on(1, 2, "deleted-far"), homed_on(1, 2, "deleted-http")
    with workers.management(0) as far, workers.management(1) as home:
        for queue, count in ((amqp_queue, 5), (http_queue, 3)):
            assert far.request("PUT", f"/queues/{queue}", {"durable": True}).status == 201
            publisher = workers.connection(0)
            sender = publisher.create_sender(queue)
            for n in range(count):
                sender.send(Message(body=f"m{n}"))
            publisher.close()
        deleted = far.request("DELETE", f"/queues/{amqp_queue}")
        assert deleted.status == 200
        assert deleted.body == {"message_count": 5}
        assert _described(far, amqp_queue).status == 404
        assert _described(home, amqp_queue).status == 404
        # A second deletion finds nothing, as on one worker.
        assert far.request("DELETE", f"/queues/{amqp_queue}").body == {"message_count": 0}
        # The HTTP API (worker 0) answers once the owner deleted it.
        assert _http(workers, f"/api/queues/%2F/{http_queue}", "DELETE") is None
        assert _described(home, http_queue).status == 404
        with pytest.raises(urllib.error.HTTPError) as gone:
            _http(workers, f"/api/queues/%2F/{http_queue}")
        gone.value.close()
        assert gone.value.code == 404


def _at_once(
    clients: tuple[ManagementClient, ManagementClient], queue: str, bodies: list[object]
) -> list[Reply]:
    """Each client declares ``queue`` with its body, both released at the same instant."""
    start = threading.Barrier(2)
    replies: dict[int, Reply] = {}

    def declare(worker: int) -> None:
        start.wait()
        replies[worker] = clients[worker].request("PUT", f"/queues/{queue}", bodies[worker])

    threads = [threading.Thread(target=declare, args=(worker,)) for worker in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [replies[0], replies[1]]


def test_declarations_made_at_once_on_two_workers_are_judged_by_the_owner(
    workers: Workers,
) -> None:
    """Each worker declares the same new queue at the same instant with its own arguments: the
    owner judges both, so exactly one wins and the other is refused with 409, as on one
    worker, and both workers then show the winner's arguments. Matching ones both succeed."""
    with workers.management(0) as zero, workers.management(1) as one:
        clients = (zero, one)
        for round_ in range(6):
            queue = homed_on(round_ % 2, 2, f"raced-{round_}")
            bodies: list[object] = [
                {"durable": True, "arguments": {"x-max-length": 10 + worker}} for worker in (0, 1)
            ]
            replies = _at_once(clients, queue, bodies)
            assert sorted(reply.status for reply in replies) == [201, 409], replies
            winner = 0 if replies[0].status == 201 else 1
            for client in clients:
                shown = _described(client, queue)
                assert isinstance(shown.body, dict)
                assert shown.body["arguments"] == {"x-max-length": 10 + winner}
            # The loser's declaration, made again, is refused again; the winner's is idempotent.
            loser = clients[1 - winner]
            assert loser.request("PUT", f"/queues/{queue}", bodies[1 - winner]).status == 409
            assert loser.request("PUT", f"/queues/{queue}", bodies[winner]).status == 200
            assert zero.request("DELETE", f"/queues/{queue}").status == 200
        # The same declaration from both at once: both succeed, one queue.
        queue = homed_on(1, 2, "raced-alike")
        body = {"durable": True, "arguments": {"x-max-length": 5}}
        statuses = sorted(reply.status for reply in _at_once(clients, queue, [body, body]))
        assert statuses in ([200, 201], [201, 201])
        assert zero.request("DELETE", f"/queues/{queue}").status == 200
        # Over the HTTP API (worker 0) too: judged by worker 1, which owns the queue.
        queue = homed_on(1, 2, "declared-http")
        path = f"/api/queues/%2F/{queue}"
        assert _http(workers, path, "PUT", {"arguments": {"x-max-length": 3}}) == 201
        assert _http(workers, path, "PUT", {"arguments": {"x-max-length": 3}}) == 204
        with pytest.raises(urllib.error.HTTPError) as refused:
            _http(workers, path, "PUT", {"arguments": {"x-max-length": 4}})
        refused.value.close()
        assert refused.value.code == 400
        shown = _described(one, queue)
        assert isinstance(shown.body, dict)
        assert shown.body["arguments"] == {"x-max-length": 3}
        assert zero.request("DELETE", f"/queues/{queue}").status == 200


def _arguments(client: ManagementClient, queue: str) -> object:
    shown = _described(client, queue)
    assert shown.status == 200, shown
    assert isinstance(shown.body, dict)
    return shown.body["arguments"]


def _attach_and_declare_at_once(workers: Workers, one: ManagementClient, queue: str) -> int:
    """A publisher attaching on worker 0 declares ``queue`` with the defaults while management
    on worker 1 declares it with arguments: both workers are stopped while each is sent its
    request, then let go together, so that their declarations cross on the channel. The
    status of the management declaration."""
    port, pids = workers.port, workers.pids
    attacher = connection_on(
        port, pids, pids[0], lambda: RawClient.connect("127.0.0.1", port), RawClient.abort
    )
    try:
        attacher.begin()
        replies: list[Reply] = []
        body = {"durable": True, "arguments": {"x-max-length": 7}}
        declare = threading.Thread(
            target=lambda: replies.append(one.request("PUT", f"/queues/{queue}", body))
        )
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            handle = attacher.attach("raced", "sender", target=f"/queues/{queue}")
            declare.start()
            # Time for the request to reach worker 1's socket; if it has not, the two
            # declarations cross less tightly, and what the test checks still holds.
            time.sleep(0.2)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        declare.join()
        assert attacher.wait_attach(handle).error is None
    finally:
        attacher.abort()
    (reply,) = replies
    return reply.status


def _shows(client: ManagementClient, queue: str, arguments: object) -> bool:
    return _arguments(client, queue) == arguments


def test_an_attach_that_declares_a_queue_yields_to_the_owners_declaration(
    workers: Workers,
) -> None:
    """An attach on one worker and a management declaration with other arguments on the
    queue's worker at once: whichever the owner made first stands on both workers, the
    management declaration's (201) or the attach's defaults (then 409 for the arguments),
    never the attach's on one worker and the arguments on the other."""
    with workers.management(0) as zero, workers.management(1) as one:
        for round_ in range(4):
            queue = homed_on(1, 2, f"attach-raced-{round_}")
            status = _attach_and_declare_at_once(workers, one, queue)
            assert status in (201, 409)
            wanted = {"x-max-length": 7} if status == 201 else {}
            assert _arguments(one, queue) == wanted
            # Worker 0 takes the owner's declaration once it crosses.
            wait_until(partial(_shows, zero, queue, wanted), timeout=GONE_WITHIN)
            assert zero.request("DELETE", f"/queues/{queue}").status == 200


def _consumer_count(client: ManagementClient, queue: str) -> int | None:
    reply = _described(client, queue)
    if reply.status == 404:
        return None
    assert reply.status == 200, reply
    assert isinstance(reply.body, dict)
    count = reply.body["consumer_count"]
    assert isinstance(count, int)
    return count


def test_an_auto_delete_queue_goes_when_its_last_consumer_leaves_whichever_worker(
    workers: Workers,
) -> None:
    queue = homed_on(1, 2, "fleeting")
    with workers.management(0) as far:
        declared = far.request("PUT", f"/queues/{queue}", {"durable": False, "auto_delete": True})
        assert declared.status == 201
        on_far, on_home = workers.connection(0), workers.connection(1)
        first = on_far.create_receiver(queue, credit=0, name="first")
        local = on_home.create_receiver(queue, credit=0, name="local")
        last = on_far.create_receiver(queue, credit=0, name="last")
        wait_until(lambda: _consumer_count(far, queue) == 3)
        # A consumer on the other worker leaves: two remain, one of them on the owner.
        first.close()  # type: ignore[no-untyped-call]
        assert _consumer_count(far, queue) == 2
        # The owner's own consumer leaves: one remains, on the other worker.
        local.close()  # type: ignore[no-untyped-call]
        assert _consumer_count(far, queue) == 1
        # The last leaves, from the other worker: the owner deletes the queue everywhere.
        last.close()  # type: ignore[no-untyped-call]
        wait_until(lambda: _consumer_count(far, queue) is None, timeout=GONE_WITHIN)
        on_far.close()
        on_home.close()


def test_a_remote_consumer_keeps_an_x_expires_queue_until_it_leaves(workers: Workers) -> None:
    queue = homed_on(1, 2, "leased")
    expires = 500
    body = {"durable": False, "arguments": {"x-expires": expires}}
    with workers.management(0) as far:
        on_far = workers.connection(0)
        for attempt in range(5):
            assert far.request("PUT", f"/queues/{queue}", body).status == 201
            holder = on_far.create_receiver(queue, credit=0, name=f"holder-{attempt}")
            # An attach to a queue that expired first declares it anew, without x-expires.
            described = _described(far, queue).body
            assert isinstance(described, dict)
            if described["arguments"] == {"x-expires": expires}:
                break
            holder.close()  # type: ignore[no-untyped-call]
            assert far.request("DELETE", f"/queues/{queue}").status == 200
        else:
            pytest.fail("the queue expired before its consumer attached, five times")
        # Held on the owner by a consumer of the other worker, for several times its x-expires.
        time.sleep(4 * expires / 1000)
        assert _consumer_count(far, queue) == 1
        holder.close()  # type: ignore[no-untyped-call]
        # Watched through listings: reading the queue's own counts is use, and would keep it.
        wait_until(lambda: queue not in _listed(far), timeout=GONE_WITHIN)
        on_far.close()


def _listed(client: ManagementClient) -> list[str]:
    reply = client.request("GET", "/queues")
    assert isinstance(reply.body, list)
    return [str(item["name"]) for item in reply.body]
