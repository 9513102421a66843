"""Queue semantics through a real server with real proton clients: TTL, dead-lettering, lock
expiry, filters, browse, exchanges, overflow, single active consumer."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import pytest
from integration.conftest import RunningServer
from proton import (
    Array,
    Delivery,
    Described,
    Endpoint,
    Message,
    Timeout,
    decimal32,
    decimal128,
    symbol,
    ulong,
)
from proton.reactor import Copy, Filter, Selector
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached, SendException
from support.clients import consume, publish
from support.polling import wait_until

from sluicegate.gateway.rules.definitions import (
    BindingDefinition,
    ExchangeDefinition,
    QueueDefinition,
)


def _declare(
    server: RunningServer,
    queue: str,
    arguments: Mapping[str, object] | None = None,
) -> None:
    server.call(lambda: server.server.registry.declare_queue(queue, arguments))


def _dead_letter_setup(server: RunningServer, prefix: str) -> str:
    """A fanout dead-letter exchange ``PREFIX-dlx`` bound to queue ``PREFIX-dlq``."""
    registry = server.server.registry

    def declare() -> None:
        registry.declare_queue(f"{prefix}-dlq")
        registry.declare_exchange(f"{prefix}-dlx", "fanout")
        registry.bind(f"{prefix}-dlx", f"{prefix}-dlq")

    server.call(declare)
    return f"{prefix}-dlx"


def _receive_all(receiver: BlockingReceiver, timeout: float = 0.5) -> list[Message]:
    """Receive and accept until nothing arrives for ``timeout`` seconds."""
    received: list[Message] = []
    while True:
        try:
            message = receiver.receive(timeout=timeout)
        except Timeout:
            return received
        receiver.accept()
        received.append(message)


def _deaths(message: Message) -> list[dict[object, object]]:
    annotations: dict[object, object] = dict(message.annotations or {})
    deaths = annotations.get(symbol("x-opt-deaths"))
    # RabbitMQ's form: an AMQP array of maps.
    assert isinstance(deaths, Array)
    assert all(isinstance(entry, dict) for entry in deaths.elements)
    return list(deaths.elements)


# -- TTL and dead-lettering ------------------------------------------------------------------


def test_message_ttl_expires_into_the_dead_letter_queue(server: RunningServer) -> None:
    dlx = _dead_letter_setup(server, "ttl")
    _declare(server, "ttl-work", {"x-dead-letter-exchange": dlx})
    outcomes = publish(
        server.url,
        "/queues/ttl-work",
        messages=[Message(body="short", ttl=0.1), Message(body="long")],
    ).outcomes
    assert outcomes == ["accepted", "accepted"]
    wait_until(lambda: server.queue("ttl-dlq").ready == 1)
    # The expired message is never delivered; the other one is.
    assert consume(server.url, "/queues/ttl-work", 1).bodies == ["long"]
    [dead] = consume(server.url, "/queues/ttl-dlq", 1).messages
    assert dead.body == "short"
    [death] = _deaths(dead)
    assert death[symbol("reason")] == "expired"
    assert death[symbol("queue")] == "ttl-work"
    assert death[symbol("count")] == 1
    assert dead.annotations is not None
    assert dead.annotations[symbol("x-first-death-queue")] == "ttl-work"
    stats = server.queue("ttl-work")
    assert (stats.expired, stats.dead_lettered, stats.ready) == (1, 1, 0)


def test_decimals_travel_unchanged_through_dead_lettering(server: RunningServer) -> None:
    """Valid AMQP the server never interprets (decimals) is accepted and kept exactly, also in
    the message annotations the dead-lettering rewrites."""
    dlx = _dead_letter_setup(server, "dec")
    _declare(server, "dec-work", {"x-dead-letter-exchange": dlx, "x-message-ttl": 0})
    price, total = decimal32(7), decimal128(bytes(range(16)))
    sent = Message(
        body="order", properties={"price": price}, annotations={symbol("x-opt-total"): total}
    )
    assert publish(server.url, "/queues/dec-work", messages=[sent]).outcomes == ["accepted"]
    [dead] = consume(server.url, "/queues/dec-dlq", 1).messages
    [death] = _deaths(dead)
    assert death[symbol("reason")] == "expired"
    assert dict(dead.annotations or {})[symbol("x-opt-total")] == total
    assert dead.properties == {"price": price}


def test_queue_ttl_and_absolute_expiry_time(server: RunningServer) -> None:
    dlx = _dead_letter_setup(server, "qttl")
    _declare(server, "qttl-work", {"x-message-ttl": 100, "x-dead-letter-exchange": dlx})
    past = time.time() - 1
    publish(server.url, "/queues/qttl-work", bodies=["a", "b"])
    publish(server.url, "/queues/qttl-work", messages=[Message(body="c", expiry_time=past)])
    wait_until(lambda: server.queue("qttl-dlq").ready == 3)
    assert server.queue("qttl-work").ready == 0
    assert sorted(map(str, consume(server.url, "/queues/qttl-dlq", 3).bodies)) == ["a", "b", "c"]


def test_an_expired_message_is_never_delivered_even_before_the_timer(
    server: RunningServer,
) -> None:
    _declare(server, "ttl-no-dlx")
    publish(server.url, "/queues/ttl-no-dlx", messages=[Message(body="gone", ttl=0.05)])
    time.sleep(0.2)
    connection = BlockingConnection(server.url)
    try:
        receiver = connection.create_receiver("/queues/ttl-no-dlx", credit=10)
        with pytest.raises(Timeout):
            receiver.receive(timeout=0.5)
    finally:
        connection.close()
    wait_until(lambda: server.queue("ttl-no-dlx").dropped == 1)


def test_rejected_message_is_dead_lettered_with_its_reason(server: RunningServer) -> None:
    dlx = _dead_letter_setup(server, "rej")
    _declare(server, "rej-work", {"x-dead-letter-exchange": dlx})
    publish(server.url, "/queues/rej-work", bodies=["bad", "good"])
    received = consume(
        server.url, "/queues/rej-work", 2, decide=lambda m, i: "reject" if i == 0 else "accept"
    )
    assert received.bodies == ["bad", "good"]
    [dead] = consume(server.url, "/queues/rej-dlq", 1).messages
    assert dead.body == "bad"
    assert _deaths(dead)[0][symbol("reason")] == "rejected"


def test_delivery_limit_dead_letters_a_poison_message(server: RunningServer) -> None:
    dlx = _dead_letter_setup(server, "poison")
    _declare(server, "poison-work", {"x-delivery-limit": 2, "x-dead-letter-exchange": dlx})
    publish(server.url, "/queues/poison-work", bodies=["poison"])
    received = consume(server.url, "/queues/poison-work", 3, credit=1, decide=lambda m, i: "modify")
    assert [m.delivery_count for m in received.messages] == [0, 1, 2]
    [dead] = consume(server.url, "/queues/poison-dlq", 1).messages
    assert _deaths(dead)[0][symbol("reason")] == "delivery_limit"
    assert server.queue("poison-work").ready == 0


# -- lock expiry --------------------------------------------------------------------------------


def test_lock_expiry_releases_and_a_late_settlement_changes_nothing(
    server: RunningServer,
) -> None:
    _declare(server, "locked", {"x-consumer-timeout": 200})
    publish(server.url, "/queues/locked", bodies=["slow"])
    connection = BlockingConnection(server.url)
    try:
        receiver = connection.create_receiver("/queues/locked", credit=1)
        message = receiver.receive(timeout=5)
        assert message.body == "slow"
        wait_until(lambda: server.queue("locked").lock_expired == 1)
        stats = server.queue("locked")
        # Released: ready again, or already sent again on the credit proton's blocking receiver
        # renews by itself.
        assert stats.ready + stats.unacked == 1
        assert stats.acknowledged == 0
        receiver.accept()
        with pytest.raises(LinkDetached):
            connection.wait(lambda: bool(receiver.link.state & Endpoint.REMOTE_CLOSED), timeout=5)
        condition = receiver.link.remote_condition
        assert condition is not None
        assert condition.name == "amqp:precondition-failed"
        assert "lock" in (condition.description or "")
    finally:
        connection.close()
    # The late accept archived nothing: the message is there, one failed delivery later.
    assert server.queue("locked").acknowledged == 0
    [again] = consume(server.url, "/queues/locked", 1).messages
    # One failed attempt for the expired lock; a second if the client's renewed credit had it
    # redelivered to the same link before that link was closed.
    assert again.body == "slow"
    assert again.delivery_count in (1, 2)


# -- consumer filters and fair dispatch ---------------------------------------------------------


def _region_messages(count: int) -> list[Message]:
    return [
        Message(body=f"m{i}", properties={"region": "eu" if i % 2 == 0 else "us"})
        for i in range(count)
    ]


def _app_filter(entries: dict[str, str]) -> Filter:
    return Filter({symbol("region-filter"): Described(ulong(0x174), entries)})  # type: ignore[arg-type]


def test_application_properties_filter_receives_exactly_the_matching_messages(
    server: RunningServer,
) -> None:
    publish(server.url, "/queues/regions", messages=_region_messages(20))
    connection = BlockingConnection(server.url)
    try:
        receiver = connection.create_receiver(
            "/queues/regions", credit=50, options=_app_filter({"region": "eu"})
        )
        # The filter is echoed: it took effect.
        echoed = receiver.link.remote_source.filter
        echoed.rewind()
        assert echoed.next() is not None
        received = _receive_all(receiver)
    finally:
        connection.close()
    assert [m.body for m in received] == [f"m{i}" for i in range(0, 20, 2)]
    # The others wait for someone else, in order.
    wait_until(lambda: server.queue("regions").unacked == 0)
    assert consume(server.url, "/queues/regions", 10).bodies == [f"m{i}" for i in range(1, 20, 2)]


def test_prefix_and_suffix_filters_and_properties_filter(server: RunningServer) -> None:
    messages = [
        Message(body="a", subject="order.created", properties={"sku": "abc-123"}),
        Message(body="b", subject="order.deleted", properties={"sku": "xyz-123"}),
        Message(body="c", subject="invoice.created", properties={"sku": "abc-999"}),
    ]
    publish(server.url, "/queues/affixes", messages=messages)
    properties_filter = Filter(
        {
            symbol("subject"): Described(
                symbol("amqp:properties-filter"), {symbol("subject"): "&s:.created"}
            ),
            symbol("sku"): Described(ulong(0x174), {"sku": "&p:abc-"}),
        }
    )
    connection = BlockingConnection(server.url)
    try:
        receiver = connection.create_receiver(
            "/queues/affixes", credit=10, options=properties_filter
        )
        assert [m.body for m in _receive_all(receiver)] == ["a", "c"]
    finally:
        connection.close()


def test_jms_selector(server: RunningServer) -> None:
    messages = [
        Message(body=f"m{i}", properties={"amount": i * 10, "region": "eu" if i % 2 else "us"})
        for i in range(10)
    ]
    publish(server.url, "/queues/selected", messages=messages)
    connection = BlockingConnection(server.url)
    try:
        receiver = connection.create_receiver(
            "/queues/selected",
            credit=20,
            options=Selector("amount >= 40 AND region = 'eu'"),
        )
        assert [m.body for m in _receive_all(receiver)] == ["m5", "m7", "m9"]
    finally:
        connection.close()
    assert server.queue("selected").ready == 7


def test_two_consumers_one_filtered_both_progress(server: RunningServer) -> None:
    connection = BlockingConnection(server.url)
    try:
        filtered = connection.create_receiver(
            "/queues/mixed", credit=5, name="eu-only", options=_app_filter({"region": "eu"})
        )
        everything = connection.create_receiver("/queues/mixed", credit=5, name="any")
        publish(server.url, "/queues/mixed", messages=_region_messages(40))
        got: dict[str, list[str]] = {"eu-only": [], "any": []}
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < 40 and time.monotonic() < deadline:
            for name, receiver in (("eu-only", filtered), ("any", everything)):
                try:
                    message = receiver.receive(timeout=0.1)
                except Timeout:
                    continue
                receiver.accept()
                got[name].append(str(message.body))
    finally:
        connection.close()
    assert sorted(got["eu-only"] + got["any"]) == sorted(f"m{i}" for i in range(40))
    assert got["eu-only"], "the filtered consumer made no progress"
    assert got["any"], "the unfiltered consumer made no progress"
    assert all(int(body[1:]) % 2 == 0 for body in got["eu-only"])


def test_browse_leaves_the_queue_unchanged(server: RunningServer) -> None:
    publish(server.url, "/queues/browsed", bodies=["a", "b", "c"])
    connection = BlockingConnection(server.url)
    try:
        browser = connection.create_receiver("/queues/browsed", credit=10, options=Copy())
        assert [m.body for m in _receive_all(browser)] == ["a", "b", "c"]
    finally:
        connection.close()
    stats = server.queue("browsed")
    assert (stats.ready, stats.acknowledged) == (3, 0)
    assert consume(server.url, "/queues/browsed", 3).bodies == ["a", "b", "c"]


def test_single_active_consumer(server: RunningServer) -> None:
    _declare(server, "sac", {"x-single-active-consumer": True})
    connection = BlockingConnection(server.url)
    try:
        first = connection.create_receiver("/queues/sac", credit=10, name="first")
        second = connection.create_receiver("/queues/sac", credit=10, name="second")
        publish(server.url, "/queues/sac", bodies=[f"m{i}" for i in range(4)])
        assert [m.body for m in _receive_all(first)] == ["m0", "m1", "m2", "m3"]
        with pytest.raises(Timeout):
            second.receive(timeout=0.3)
        first.close()  # type: ignore[no-untyped-call]
        publish(server.url, "/queues/sac", bodies=["m4"])
        assert second.receive(timeout=5).body == "m4"
        second.accept()
    finally:
        connection.close()


# -- exchanges ----------------------------------------------------------------------------------


def test_topic_exchange_routes_by_pattern(make_server: object) -> None:
    assert callable(make_server)
    running: RunningServer = make_server(
        queues=(QueueDefinition("abc"), QueueDefinition("all-a")),
        exchanges=(ExchangeDefinition("topics", "topic"),),
        bindings=(
            BindingDefinition("topics", "abc", "a.*.c"),
            BindingDefinition("topics", "all-a", "a.#"),
        ),
    )
    url = running.url
    assert publish(url, "/exchanges/topics/a.b.c", bodies=["abc"]).outcomes == ["accepted"]
    assert publish(url, "/exchanges/topics/a.b.b.c", bodies=["abbc"]).outcomes == ["accepted"]
    # Without a key in the address, the subject is the routing key.
    publish(url, "/exchanges/topics", messages=[Message(body="subject", subject="a.x.c")])
    # Unroutable: released, never silently dropped.
    assert publish(url, "/exchanges/topics/b.c", bodies=["nowhere"]).outcomes == ["released"]
    assert consume(url, "/queues/abc", 2).bodies == ["abc", "subject"]
    assert consume(url, "/queues/all-a", 3).bodies == ["abc", "abbc", "subject"]


def test_fanout_direct_and_rejecting_exchange(make_server: object) -> None:
    assert callable(make_server)
    running: RunningServer = make_server(
        queues=(QueueDefinition("f1"), QueueDefinition("f2")),
        exchanges=(
            ExchangeDefinition("fan", "fanout"),
            ExchangeDefinition("strict", "direct", arguments={"x-unroutable": "reject"}),
        ),
        bindings=(
            BindingDefinition("fan", "f1"),
            BindingDefinition("fan", "f2"),
            BindingDefinition("strict", "f1", "key"),
        ),
    )
    url = running.url
    publish(url, "/exchanges/fan", bodies=["both"])
    publish(url, "/exchanges/strict/key", bodies=["direct"])
    assert publish(url, "/exchanges/strict/other", bodies=["x"]).outcomes == ["rejected"]
    assert consume(url, "/queues/f1", 2).bodies == ["both", "direct"]
    assert consume(url, "/queues/f2", 1).bodies == ["both"]


def test_null_target_routes_by_the_to_property(server: RunningServer) -> None:
    _declare(server, "to-queue")
    server.call(lambda: server.server.registry.declare_exchange("to-exchange", "fanout"))
    server.call(lambda: server.server.registry.bind("to-exchange", "to-queue"))
    connection = BlockingConnection(server.url)
    try:
        sender = connection.create_sender(None)
        sender.send(Message(body="by queue", address="/queues/to-queue"))
        sender.send(Message(body="by exchange", address="/exchanges/to-exchange"))
    finally:
        connection.close()
    assert consume(server.url, "/queues/to-queue", 2).bodies == ["by queue", "by exchange"]


def test_clients_cannot_publish_to_an_internal_exchange(server: RunningServer) -> None:
    """As in RabbitMQ: an internal exchange is fed only by other exchanges (here, a DLX)."""
    _declare(server, "internal-target")
    registry = server.server.registry
    server.call(lambda: registry.declare_exchange("internal-x", "fanout", internal=True))
    server.call(lambda: registry.bind("internal-x", "internal-target"))
    connection = BlockingConnection(server.url)
    try:
        with pytest.raises(LinkDetached, match="amqp:unauthorized-access"):
            connection.create_sender("/exchanges/internal-x")
    finally:
        connection.close()
    connection = BlockingConnection(server.url)
    try:
        sender = connection.create_sender(None)
        with pytest.raises(SendException) as refused:
            sender.send(Message(body="x", address="/exchanges/internal-x"))
        assert refused.value.state == Delivery.REJECTED
    finally:
        connection.close()
    _declare(server, "internal-source", {"x-dead-letter-exchange": "internal-x"})
    publish(server.url, "/queues/internal-source", bodies=["dead"])
    consume(server.url, "/queues/internal-source", 1, decide=lambda m, i: "reject")
    assert consume(server.url, "/queues/internal-target", 1).bodies == ["dead"]
    assert server.queue("internal-target").ready == 0


def test_attach_to_a_missing_exchange_is_refused(server: RunningServer) -> None:
    connection = BlockingConnection(server.url)
    try:
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            connection.create_sender("/exchanges/no-such-exchange")
    finally:
        connection.close()


def test_attach_to_a_missing_queue_declares_it_by_default(server: RunningServer) -> None:
    connection = BlockingConnection(server.url)
    try:
        connection.create_sender("/queues/declared-by-publisher")
        connection.create_receiver("/queues/declared-by-consumer")
    finally:
        connection.close()
    assert server.call(lambda: server.server.registry.get("declared-by-publisher")) is not None
    assert server.call(lambda: server.server.registry.get("declared-by-consumer")) is not None


def test_without_attach_declares_queues_a_missing_queue_is_not_found(
    make_server: Callable[..., RunningServer],
) -> None:
    """RabbitMQ 4 refuses a publisher or consumer of a queue that does not exist."""
    running = make_server(attach_declares_queues=False)
    connection = BlockingConnection(running.url)
    try:
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            connection.create_sender("/queues/never-declared")
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            connection.create_receiver("/queues/never-declared")
        running.call(lambda: running.server.registry.declare_queue("declared-first"))
        sender = connection.create_sender("/queues/declared-first")
        sender.send(Message(body="x"))
        receiver = connection.create_receiver("/queues/declared-first", credit=1)
        assert receiver.receive(timeout=10).body == "x"
        receiver.accept()
    finally:
        connection.close()
    assert running.call(lambda: running.server.registry.get("never-declared")) is None


# -- overflow -----------------------------------------------------------------------------------


def test_reject_publish_overflow(server: RunningServer) -> None:
    _declare(server, "full", {"x-max-length": 2, "x-overflow": "reject-publish"})
    outcomes = publish(server.url, "/queues/full", bodies=["a", "b", "c"]).outcomes
    assert outcomes == ["accepted", "accepted", "rejected"]
    stats = server.queue("full")
    assert (stats.ready, stats.overflowed) == (2, 1)
    assert consume(server.url, "/queues/full", 2).bodies == ["a", "b"]


def test_drop_head_overflow_dead_letters_the_oldest(server: RunningServer) -> None:
    dlx = _dead_letter_setup(server, "head")
    _declare(server, "head-work", {"x-max-length": 2, "x-dead-letter-exchange": dlx})
    outcomes = publish(server.url, "/queues/head-work", bodies=["a", "b", "c", "d"]).outcomes
    assert outcomes == ["accepted"] * 4
    assert consume(server.url, "/queues/head-work", 2).bodies == ["c", "d"]
    dead = consume(server.url, "/queues/head-dlq", 2).messages
    assert [m.body for m in dead] == ["a", "b"]
    assert {_deaths(m)[0][symbol("reason")] for m in dead} == {"maxlen"}
