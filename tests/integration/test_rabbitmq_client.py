"""RabbitMQ's own AMQP 1.0 client (rabbitmq-amqp-python-client) against sluicegate, unchanged.

Its normal flow: declare a queue through ``/management``, publish, consume, read the queue's
counts, purge, delete. The client checks the OPEN properties, every reply's status code and the
``queue_info`` keys, and needs a message-annotations section on every delivery.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import cast

import proton
import pytest
from integration.conftest import RunningServer
from proton import Array, Data, Timeout
from proton.utils import BlockingConnection, LinkDetached
from rabbitmq_amqp_python_client import (
    AddressHelper,
    AMQPMessagingHandler,
    ClassicQueueSpecification,
    Connection,
    ConsumerOptions,
    ConsumerSettleStrategy,
    Converter,
    Environment,
    Event,
    ExchangeSpecification,
    ExchangeToQueueBindingSpecification,
    ExchangeType,
    Message,
    OffsetSpecification,
    OutcomeState,
    QueueType,
    QuorumQueueSpecification,
    StreamConsumerOptions,
    StreamSpecification,
    ValidationCodeException,
    symbol,
)
from support.polling import wait_until
from support.rabbitmq import Accepting, Enough

from sluicegate.queues.volatile import VolatileQueue


@pytest.fixture
def connection(server: RunningServer) -> Iterator[Connection]:
    environment = Environment(f"amqp://127.0.0.1:{server.port}/")
    connection = environment.connection()
    connection.dial()
    yield connection
    connection.close()
    environment.close()


def test_declare_publish_consume_purge_delete(connection: Connection) -> None:
    management = connection.management()
    name = "rmq-client-flow"
    spec = ClassicQueueSpecification(name=name, is_auto_delete=False, max_len=1000)
    management.declare_queue(spec)
    # Declaring it again with the same settings is fine (200).
    management.declare_queue(spec)
    info = management.queue_info(name)
    assert info.name == name
    assert info.queue_type == QueueType.classic
    assert info.is_durable
    assert (info.message_count, info.consumer_count) == (0, 0)

    address = AddressHelper.queue_address(name)
    publisher = connection.publisher(address)
    for index in range(10):
        status = publisher.publish(Message(body=Converter.string_to_bytes(f"m{index}")))
        assert status.remote_state == OutcomeState.ACCEPTED
    publisher.close()
    assert management.queue_info(name).message_count == 10

    handler = Accepting(4)
    consumer = connection.consumer(address, message_handler=handler)
    with pytest.raises(Enough):
        consumer.run()
    consumer.close()
    assert handler.bodies == ["m0", "m1", "m2", "m3"]
    assert handler.annotations == [{"x-exchange": "", "x-routing-key": name}] * 4
    # What the consumer held beyond the four it accepted went back when it detached.
    assert management.queue_info(name).message_count == 6

    assert management.purge_queue(name) == 6
    assert management.queue_info(name).message_count == 0
    management.delete_queue(name)
    with pytest.raises(ValidationCodeException, match="404"):
        management.queue_info(name)
    management.close()


def test_an_inequivalent_declaration_is_precondition_failed(connection: Connection) -> None:
    management = connection.management()
    management.declare_queue(ClassicQueueSpecification(name="rmq-client-conflict", max_len=5))
    with pytest.raises(ValidationCodeException, match="ErrPreconditionFailed"):
        management.declare_queue(ClassicQueueSpecification(name="rmq-client-conflict", max_len=6))
    management.delete_queue("rmq-client-conflict")
    management.close()


def test_exchanges_and_bindings(connection: Connection, server: RunningServer) -> None:
    management = connection.management()
    management.declare_queue(ClassicQueueSpecification(name="rmq-client-bound"))
    management.declare_exchange(
        ExchangeSpecification(name="rmq-client-events", exchange_type=ExchangeType.topic)
    )
    binding = ExchangeToQueueBindingSpecification(
        source_exchange="rmq-client-events",
        destination_queue="rmq-client-bound",
        binding_key="orders.*",
    )
    management.bind(binding)
    registry = server.server.registry
    routed = server.call(
        lambda: [q.name for q in registry.route("rmq-client-events", "orders.new")]
    )
    assert routed == ["rmq-client-bound"]
    management.unbind(binding)
    assert server.call(lambda: registry.route("rmq-client-events", "orders.new")) == []
    management.delete_exchange("rmq-client-events")
    assert server.call(lambda: registry.exchanges())[-1].name != "rmq-client-events"
    management.delete_queue("rmq-client-bound")
    management.close()


def test_an_auto_delete_queue_goes_with_its_last_consumer(
    connection: Connection, server: RunningServer
) -> None:
    management = connection.management()
    name = "rmq-client-auto"
    management.declare_queue(ClassicQueueSpecification(name=name, is_auto_delete=True))
    # Declared without consumers, it stays.
    assert management.queue_info(name).is_auto_delete
    address = AddressHelper.queue_address(name)
    publisher = connection.publisher(address)
    publisher.publish(Message(body=Converter.string_to_bytes("only")))
    publisher.close()
    handler = Accepting(1)
    consumer = connection.consumer(address, message_handler=handler)
    with pytest.raises(Enough):
        consumer.run()
    consumer.close()
    assert handler.bodies == ["only"]
    wait_until(lambda: server.call(lambda: server.server.registry.get(name)) is None)
    management.close()


def test_deleting_a_queue_detaches_its_links(connection: Connection, server: RunningServer) -> None:
    """RabbitMQ detaches the consumers and publishers of a deleted queue (resource-deleted)."""
    management = connection.management()
    management.declare_queue(ClassicQueueSpecification(name="rmq-client-doomed"))
    other = BlockingConnection(server.url)
    try:
        receiver = other.create_receiver("/queues/rmq-client-doomed", credit=10)
        sender = other.create_sender("/queues/rmq-client-doomed")
        wait_until(lambda: server.queue("rmq-client-doomed").consumers == 1)
        management.delete_queue("rmq-client-doomed")
        with pytest.raises(LinkDetached, match="resource-deleted"):
            receiver.receive(timeout=30)
        with pytest.raises(LinkDetached, match="resource-deleted"):
            sender.send(proton.Message(body=b"to nowhere"), timeout=30)
    except Timeout:
        pytest.fail("the consumer of the deleted queue was not detached")
    finally:
        other.close()
    management.close()


def test_a_link_name_is_used_again_once_its_link_detached(connection: Connection) -> None:
    """The client names each link "<container-id>-<address>": a second publisher (or consumer)
    of one address on one connection repeats the name, as its own tests do one after another.

    Two such links at once the client cannot have, against RabbitMQ either: its own proton
    refuses the second ATTACH reply ("link name already attached"). sluicegate serves the repeat
    as RabbitMQ does (test_rhea.py shows it with a client that takes it).
    """
    management = connection.management()
    management.declare_queue(ClassicQueueSpecification(name="rmq-client-again"))
    address = AddressHelper.queue_address("rmq-client-again")
    for body in ("first", "second", "third"):
        publisher = connection.publisher(address)
        status = publisher.publish(Message(body=Converter.string_to_bytes(body)))
        assert status.remote_state == OutcomeState.ACCEPTED
        publisher.close()
    for body in ("first", "second"):
        handler = Accepting(1)
        consumer = connection.consumer(address, message_handler=handler, credit=1)
        with pytest.raises(Enough):
            consumer.run()
        consumer.close()
        assert handler.bodies == [body]
    wait_until(lambda: management.queue_info("rmq-client-again").message_count == 1)
    management.delete_queue("rmq-client-again")
    management.close()


def test_a_stream_declared_published_and_read_from_an_offset(connection: Connection) -> None:
    """x-queue-type stream through management; a stream consumer reads from an offset."""
    management = connection.management()
    name = "rmq-client-stream"
    management.declare_queue(StreamSpecification(name=name, max_len_bytes=10_000_000))
    info = management.queue_info(name)
    assert info.queue_type == QueueType.stream
    address = AddressHelper.queue_address(name)
    publisher = connection.publisher(address)
    for index in range(5):
        status = publisher.publish(Message(body=Converter.string_to_bytes(f"s{index}")))
        assert status.remote_state == OutcomeState.ACCEPTED
    publisher.close()
    assert management.queue_info(name).message_count == 5

    handler = Accepting(3)
    options = StreamConsumerOptions(offset_specification=2)
    consumer = connection.consumer(address, message_handler=handler, consumer_options=options)
    with pytest.raises(Enough):
        consumer.run()
    consumer.close()
    assert handler.bodies == ["s2", "s3", "s4"]
    assert [a["x-stream-offset"] for a in handler.annotations] == [2, 3, 4]  # type: ignore[index]
    # Reading a stream does not consume it.
    assert management.queue_info(name).message_count == 5
    management.delete_queue(name)
    management.close()


class _Settling(AMQPMessagingHandler):
    """Settles ``limit`` messages with ``outcome`` (a delivery context method), then stops."""

    def __init__(self, limit: int, outcome: str, annotations: dict[symbol, str] | None) -> None:
        super().__init__()
        self.limit = limit
        self.outcome = outcome
        self.annotations = annotations
        self.count = 0

    def on_amqp_message(self, event: Event) -> None:
        method = getattr(self.delivery_context, self.outcome)
        if self.annotations is None:
            method(event)
        else:
            method(event, self.annotations)
        self.count += 1
        if self.count == self.limit:
            raise Enough


def _run(connection: Connection, address: str, handler: AMQPMessagingHandler) -> None:
    consumer = connection.consumer(address, message_handler=handler)
    with pytest.raises(Enough):
        consumer.run()
    consumer.close()


def test_a_quorum_queue_declared_and_used_as_rabbitmqs_getting_started_does(
    connection: Connection, server: RunningServer
) -> None:
    """x-queue-type quorum: durable, persistent by default, reported as RabbitMQ reports it."""
    management = connection.management()
    name = "rmq-client-quorum"
    spec = QuorumQueueSpecification(name=name, quorum_initial_group_size=3, deliver_limit=5)
    management.declare_queue(spec)
    management.declare_queue(spec)
    info = management.queue_info(name)
    assert info.queue_type == QueueType.quorum
    assert info.is_durable
    assert not info.is_exclusive
    assert not info.is_auto_delete
    assert info.leader
    # The client types members as a string; RabbitMQ sends its replicas as an array of utf8.
    # (an Array of the proton layer the client vendors, not of proton's own)
    members = cast(Array, info.members)
    assert type(members).__name__ == "Array"
    assert members.type == Data.STRING
    assert list(members.elements) == [info.leader]
    assert info.arguments["x-queue-type"] == "quorum"
    assert info.arguments["x-quorum-initial-group-size"] == 3
    # The client's own spelling, which RabbitMQ keeps and ignores, as sluicegate does.
    assert info.arguments["x-deliver-limit"] == 5
    address = AddressHelper.queue_address(name)
    publisher = connection.publisher(address)
    for index in range(3):
        status = publisher.publish(Message(body=Converter.string_to_bytes(f"q{index}")))
        assert status.remote_state == OutcomeState.ACCEPTED
    publisher.close()
    assert management.queue_info(name).message_count == 3
    handler = Accepting(3)
    _run(connection, address, handler)
    assert handler.bodies == ["q0", "q1", "q2"]
    assert management.queue_info(name).message_count == 0
    management.delete_queue(name)
    management.close()


def test_requeue_with_annotations_keeps_them_with_the_message(connection: Connection) -> None:
    """RabbitMQ's client test of requeue_with_annotations: modified{false, false, x-opt-*}."""
    management = connection.management()
    name = "rmq-client-quorum-requeue"
    management.declare_queue(QuorumQueueSpecification(name=name))
    address = AddressHelper.queue_address(name)
    publisher = connection.publisher(address)
    publisher.publish(Message(body=Converter.string_to_bytes("again")))
    publisher.close()
    notes = {symbol("x-opt-string"): "x-test1"}
    _run(connection, address, _Settling(1, "requeue_with_annotations", notes))
    handler = Accepting(1)
    _run(connection, address, handler)
    assert handler.bodies == ["again"]
    (annotations,) = handler.annotations
    assert isinstance(annotations, dict)
    assert annotations["x-opt-string"] == "x-test1"
    management.delete_queue(name)
    management.close()


def test_discard_with_annotations_dead_letters_with_them(connection: Connection) -> None:
    """RabbitMQ's client test: modified{true, true, x-opt-*} dead-letters the message."""
    management = connection.management()
    name = "rmq-client-quorum-discard"
    management.declare_exchange(
        ExchangeSpecification(name="rmq-client-dlx", exchange_type=ExchangeType.direct)
    )
    management.declare_queue(QuorumQueueSpecification(name="rmq-client-dead"))
    management.bind(
        ExchangeToQueueBindingSpecification(
            source_exchange="rmq-client-dlx",
            destination_queue="rmq-client-dead",
            binding_key="dead",
        )
    )
    management.declare_queue(
        QuorumQueueSpecification(
            name=name, dead_letter_exchange="rmq-client-dlx", dead_letter_routing_key="dead"
        )
    )
    address = AddressHelper.queue_address(name)
    publisher = connection.publisher(address)
    for index in range(10):
        publisher.publish(Message(body=Converter.string_to_bytes(f"d{index}")))
    publisher.close()
    notes = {symbol("x-opt-string"): "x-test1"}
    _run(connection, address, _Settling(10, "discard_with_annotations", notes))
    assert management.queue_info(name).message_count == 0
    assert management.queue_info("rmq-client-dead").message_count == 10
    handler = Accepting(1)
    _run(connection, AddressHelper.queue_address("rmq-client-dead"), handler)
    (annotations,) = handler.annotations
    assert isinstance(annotations, dict)
    assert annotations["x-opt-string"] == "x-test1"
    assert annotations["x-last-death-reason"] == "rejected"
    for queue in (name, "rmq-client-dead"):
        management.delete_queue(queue)
    management.delete_exchange("rmq-client-dlx")
    management.close()


def test_the_delivery_limit_dead_letters_a_message_requeued_too_often(
    connection: Connection,
) -> None:
    """RabbitMQ 4: every return counts, and 20 is the limit unless x-delivery-limit says."""
    management = connection.management()
    name = "rmq-client-quorum-poison"
    management.declare_queue(QuorumQueueSpecification(name="rmq-client-poisoned"))
    management.declare_queue(
        QuorumQueueSpecification(
            name=name, dead_letter_exchange="", dead_letter_routing_key="rmq-client-poisoned"
        )
    )
    address = AddressHelper.queue_address(name)
    publisher = connection.publisher(address)
    publisher.publish(Message(body=Converter.string_to_bytes("poison")))
    publisher.close()
    # Delivered and requeued 21 times: the 21st return is one past the limit of 20.
    _run(connection, address, _Settling(21, "requeue", None))
    assert management.queue_info(name).message_count == 0
    handler = Accepting(1)
    _run(connection, AddressHelper.queue_address("rmq-client-poisoned"), handler)
    (annotations,) = handler.annotations
    assert isinstance(annotations, dict)
    assert annotations["x-last-death-reason"] == "delivery_limit"
    for queue in (name, "rmq-client-poisoned"):
        management.delete_queue(queue)
    management.close()


class _Recording(AMQPMessagingHandler):
    """Notes ``limit`` pre-settled messages' bodies (nothing to settle), then stops."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.bodies: list[str] = []

    def on_amqp_message(self, event: Event) -> None:
        assert event.message is not None
        self.bodies.append(Converter.bytes_to_string(event.message.body))
        if len(self.bodies) == self.limit:
            raise Enough


def test_direct_reply_to_with_rabbitmqs_client(server: RunningServer) -> None:
    """RabbitMQ 4.2's Direct Reply-To, which the client asks for only from a 4.2 server.

    Replies reach the requester only while its link has credit, and the client sends its
    credit when its connection is pumped (``run()``): the responder waits until the server has
    it, as an RPC server waits for requests sent after the requester attached.
    """
    environment = Environment(f"amqp://127.0.0.1:{server.port}/")
    try:
        requester = environment.connection()
        requester.dial()
        handler = _Recording(20)
        consumer = requester.consumer(
            message_handler=handler,
            credit=100,
            consumer_options=ConsumerOptions(settle_strategy=ConsumerSettleStrategy.DirectReplyTo),
        )
        address = consumer.address
        assert address is not None
        assert address.startswith("/queues/amq.rabbitmq.reply-to.")
        name = address.removeprefix("/queues/")
        outcomes: list[object] = []

        def respond() -> None:
            def credited() -> bool:
                queue = server.server.registry.get(name)
                return isinstance(queue, VolatileQueue) and queue.waiting_credit >= 20

            wait_until(lambda: server.call(credited))
            responder = environment.connection()
            responder.dial()
            publisher = responder.publisher(address)
            for index in range(20):
                reply = Message(body=Converter.string_to_bytes(f"reply {index}"))
                outcomes.append(publisher.publish(reply).remote_state)
            publisher.close()

        responding = threading.Thread(target=respond)
        responding.start()
        with pytest.raises(Enough):
            consumer.run()
        responding.join(30)
        assert outcomes == [OutcomeState.ACCEPTED] * 20
        assert handler.bodies == [f"reply {index}" for index in range(20)]
        consumer.close()
    finally:
        environment.close()


QUEUE_INFO_CASES = [
    # (specification, consumer count RabbitMQ 4.2 reports with two consumers attached)
    (ClassicQueueSpecification(name="info-classic"), 2),
    (QuorumQueueSpecification(name="info-quorum"), 2),
    # rabbit_fifo counts only the active consumer: the waiting one is not in its consumers map.
    (QuorumQueueSpecification(name="info-quorum-sac", single_active_consumer=True), 1),
    # A stream's readers are nowhere in its stat: 0 whatever reads it.
    (StreamSpecification(name="info-stream"), 0),
]


@pytest.mark.parametrize(("spec", "consumers"), QUEUE_INFO_CASES, ids=lambda c: str(c)[:20])
def test_queue_info_reports_type_leader_members_and_counts_as_rabbitmq_does(
    connection: Connection,
    server: RunningServer,
    spec: ClassicQueueSpecification | QuorumQueueSpecification | StreamSpecification,
    consumers: int,
) -> None:
    """RabbitMQ's ``queue_info`` keys per queue type (rabbit_amqp_management:encode_queue).

    message_count is what rabbit_amqqueue:stat says: a classic or quorum queue's ready messages
    (those delivered and unsettled excluded), a stream's every message; consumer_count as the
    queue type counts. One node is every queue's leader and its only member.
    """
    management = connection.management()
    management.declare_queue(spec)
    address = AddressHelper.queue_address(spec.name)
    publisher = connection.publisher(address)
    for index in range(5):
        publisher.publish(Message(body=Converter.string_to_bytes(f"m{index}")))
    publisher.close()
    stream = isinstance(spec, StreamSpecification)
    # Two consumers of one address need two connections: the client names both links alike,
    # and its own proton refuses the second ATTACH reply of one name.
    environment = Environment(f"amqp://127.0.0.1:{server.port}/")
    other = environment.connection()
    other.dial()
    readers = [
        each.consumer(
            address,
            consumer_options=StreamConsumerOptions(OffsetSpecification.first) if stream else None,
            credit=None if stream else 1,
        )
        for each in (connection, other)
    ]
    expected_type = {
        ClassicQueueSpecification: QueueType.classic,
        QuorumQueueSpecification: QueueType.quorum,
        StreamSpecification: QueueType.stream,
    }[type(spec)]
    if not stream:
        # Each consumer's credit takes at least one message off the ready ones.
        wait_until(lambda: server.queue(spec.name).unacked >= 1)
    info = management.queue_info(spec.name)
    unacked = 0 if stream else server.queue(spec.name).unacked
    assert info.queue_type == expected_type
    assert info.leader == f"rabbit@{socket.gethostname()}"
    # The client types members as a string; RabbitMQ sends its replicas as an array of utf8.
    # (an Array of the proton layer the client vendors, not of proton's own)
    members = cast(Array, info.members)
    assert type(members).__name__ == "Array"
    assert members.type == Data.STRING
    assert list(members.elements) == [info.leader]
    assert info.message_count == 5 - unacked
    assert info.consumer_count == consumers
    assert info.is_durable
    for reader in readers:
        reader.close()
    environment.close()
    wait_until(lambda: management.queue_info(spec.name).consumer_count == 0)
    management.delete_queue(spec.name)
    management.close()
