"""The Prometheus endpoint: a scrape after a known workload shows exactly that workload."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Generator
from pathlib import Path

import pytest
from integration.conftest import RunningServer
from prometheus_client.parser import text_string_to_metric_families
from proton import Message
from proton.utils import BlockingConnection
from support.clients import publish
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.gateway.statistics import SLICE, ServerStatistics, gathering
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.session.unsettled import UNSETTLED_DELIVERY_COST
from sluicegate.session.waiting import WAITING_DELIVERY_COST
from sluicegate.wire.annotations import routing_annotations

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(running: RunningServer, path: str = "/metrics") -> Samples:
    """Fetch the endpoint and parse it with prometheus-client's own parser."""
    url = running.metrics_url.removesuffix("/metrics") + path
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def stored_size(body: bytes, queue: str) -> int:
    return len(Message(body=body).encode()) + len(routing_annotations("", queue))


def queue_value(samples: Samples, name: str, queue: str, vhost: str = "/") -> float:
    return samples[(name, (("queue", queue), ("vhost", vhost)))]


def test_scrape_after_a_known_workload(make_server: Callable[..., RunningServer]) -> None:
    running = make_server()
    publish(running.url, "/queues/m-one", [b"x" * 10] * 10)
    publish(running.url, "/queues/m-two", [b"y" * 7] * 5)
    # Exactly two deliveries from m-two, both accepted: the raw client grants credit 2, once.
    with RawClient.connect("127.0.0.1", running.port) as client:
        client.begin()
        handle = client.attach("m-two-consumer", "receiver", source="/queues/m-two")
        client.wait_attach(handle)
        client.flow(handle, link_credit=2)
        ids = []
        for _ in range(2):
            delivery = client.next_message()
            assert delivery is not None
            ids.append(delivery.delivery_id)
        client.disposition(ids[0], ids[1], state="accepted")
    wait_until(lambda: running.queue("m-two").acknowledged == 2)

    # A consumer that holds 4 deliveries unsettled while the scrape happens.
    connection = BlockingConnection(running.url)
    try:
        receiver = connection.create_receiver("/queues/m-one", credit=4)
        wait_until(lambda: running.queue("m-one").unacked == 4)
        wait_until(lambda: running.call(running.server.statistics).connections == 1)
        samples = scrape(running)
        assert queue_value(samples, "sluicegate_queue_messages_ready", "m-one") == 6
        assert queue_value(samples, "sluicegate_queue_messages_unacked", "m-one") == 4
        assert queue_value(samples, "sluicegate_queue_consumers", "m-one") == 1
        assert queue_value(samples, "sluicegate_queue_messages_ready_bytes", "m-one") > 0
        assert queue_value(samples, "sluicegate_queue_messages_ready", "m-two") == 3
        assert queue_value(samples, "sluicegate_queue_messages_unacked", "m-two") == 0
        assert queue_value(samples, "sluicegate_queue_consumers", "m-two") == 0
        assert queue_value(samples, "sluicegate_queue_messages_published_total", "m-one") == 10
        assert queue_value(samples, "sluicegate_queue_messages_acknowledged_total", "m-two") == 2
        assert samples[("sluicegate_messages_published_total", ())] == 15
        assert samples[("sluicegate_messages_delivered_total", ())] == 6
        assert samples[("sluicegate_connections", ())] == 1
        assert samples[("sluicegate_sessions", ())] == 1
        # Everything granted was delivered: nothing waits in the session, no request is open.
        assert samples[("sluicegate_session_outgoing_pending", ())] == 0
        assert samples[("sluicegate_session_outgoing_pending_max", ())] == 0
        assert samples[("sluicegate_credit_requests_in_flight", ())] == 0
        assert samples[("sluicegate_session_stashed_credit_requests", ())] == 0
        assert samples[("sluicegate_connection_reads_paused", ())] == 0
        assert samples[("sluicegate_connection_reads_paused_by_memory_budget", ())] == 0
        assert samples[("sluicegate_connection_reads_paused_by_account", ())] == 0
        assert samples[("sluicegate_connection_account_debt", ())] == 0
        assert samples[("sluicegate_connection_dead_letter_debt", ())] == 0
        assert samples[("sluicegate_consumer_links_held_for_dead_letters", ())] == 0
        # Held in memory: every message not yet settled for good, as the publisher encoded it
        # plus the annotations section consumers get, and what the queue spends to hold it
        # (queues/held_bytes.py), plus what each of the 4 unsettled deliveries costs.
        held = 10 * (stored_size(b"x" * 10, "m-one") + MESSAGE_OVERHEAD) + 3 * (
            stored_size(b"y" * 7, "m-two") + MESSAGE_OVERHEAD
        )
        held += 4 * UNSETTLED_DELIVERY_COST
        assert samples[("sluicegate_memory_budget_used_bytes", ())] == held
        assert samples[("sluicegate_memory_budget_blocked", ())] == 0
        assert samples[("process_resident_memory_bytes", ())] > 0
        receiver.link.close()
    finally:
        connection.close()
    wait_until(lambda: running.call(running.server.statistics).connections == 0)
    samples = scrape(running)
    assert samples[("sluicegate_connections", ())] == 0
    assert queue_value(samples, "sluicegate_queue_messages_ready", "m-one") == 10
    assert queue_value(samples, "sluicegate_queue_consumers", "m-one") == 0
    # Deleting a queue takes its series away but not what it counted from the totals.
    running.call(lambda: running.server.registry.delete_queue("m-two"))
    samples = scrape(running)
    assert ("sluicegate_queue_messages_ready", (("queue", "m-two"),)) not in samples
    assert samples[("sluicegate_messages_published_total", ())] == 15
    assert samples[("sluicegate_messages_delivered_total", ())] == 6


def test_outgoing_pending_while_the_client_window_is_closed(
    make_server: Callable[..., RunningServer],
) -> None:
    """Deliveries the client's window holds back show in outgoing_pending, sum and max."""
    running = make_server()
    publish(running.url, "/queues/m-window", [b"z"] * 20)
    with RawClient.connect("127.0.0.1", running.port) as client:
        client.begin(incoming_window=5)
        handle = client.attach("window-consumer", "receiver", source="/queues/m-window")
        client.wait_attach(handle)
        client.flow(handle, link_credit=20)
        wait_until(lambda: running.queue("m-window").unacked == 20)
        wait_until(lambda: scrape(running)[("sluicegate_session_outgoing_pending", ())] == 16)
        samples = scrape(running)
    # 15 deliveries wait for the window, and behind them the queue's credit reply, whose link
    # therefore still counts a credit request in flight.
    assert samples[("sluicegate_sessions", ())] == 1
    assert samples[("sluicegate_session_outgoing_pending_max", ())] == 16
    assert samples[("sluicegate_credit_requests_in_flight", ())] == 1
    assert samples[("sluicegate_sessions_remote_window_closed", ())] == 1
    # Charged to the connection: each message's bytes and what the delivery itself costs.
    waiting = 15 * (stored_size(b"z", "m-window") + WAITING_DELIVERY_COST)
    assert samples[("sluicegate_session_outgoing_pending_bytes", ())] == waiting
    assert samples[("sluicegate_connection_outgoing_pending_paused", ())] == 0
    assert samples[("sluicegate_deferred_credit_requests", ())] == 0


def test_every_metric_is_documented(make_server: Callable[..., RunningServer]) -> None:
    running = make_server()
    publish(running.url, "/queues/m-docs", [b"d"])
    with urllib.request.urlopen(running.metrics_url, timeout=30) as response:
        families = {f.name for f in text_string_to_metric_families(response.read().decode())}
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    ours = sorted(name for name in families if name.startswith("sluicegate_"))
    assert len(ours) > 20
    assert [name for name in ours if f"`{name}" not in docs] == []


def test_metrics_can_be_turned_off(make_server: Callable[..., RunningServer]) -> None:
    running = make_server(metrics_listen="off")
    assert running.server.metrics_port == 0
    assert running.server.config.metrics_address is None


@pytest.mark.slow
def test_a_scrape_of_ten_thousand_queues_is_taken_a_slice_per_turn(
    make_server: Callable[..., RunningServer],
) -> None:
    """Reading 10,000 queues at once held the reactor some 200 ms (issue 17 §7): the snapshot
    is taken :data:`SLICE` queues per turn of the reactor, serving clients in between."""
    running = make_server()
    registry = running.server.registry
    running.call(
        lambda: [registry.declare_queue(f"s{n:05d}", durable=False) for n in range(10_000)]
    )
    server = running.server
    turns = 0

    def counted() -> Generator[None, None, ServerStatistics]:
        nonlocal turns
        steps = gathering(server.broker, server.tenancy)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                snapshot: ServerStatistics = done.value
                return snapshot
            turns += 1
            yield

    snapshot = server.call_in_turns(counted())
    assert len(snapshot.queues) == 10_000
    assert turns >= 10_000 // SLICE
    # Past PER_QUEUE_LIMIT queues, /metrics sums them per virtual host, as RabbitMQ's does;
    # /metrics/per-object still has each.
    assert publish(running.url, "/queues/s09999", ["one"]).outcomes == ["accepted"]
    summed = scrape(running)
    assert summed[("sluicegate_queue_messages_ready", (("vhost", "/"),))] == 1
    assert not any(labels and labels[0][0] == "queue" for _, labels in summed)
    per_object = scrape(running, "/metrics/per-object")
    assert queue_value(per_object, "sluicegate_queue_messages_ready", "s09999") == 1
