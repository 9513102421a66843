"""RabbitMQ's own AMQP 1.0 client (rabbitmq-amqp-python-client) against sluicegate, unchanged.

Its normal flow: declare a queue through ``/management``, publish, consume, read the queue's
counts, purge, delete. The client checks the OPEN properties, every reply's status code and the
``queue_info`` keys, and needs a message-annotations section on every delivery.
"""

from __future__ import annotations

from collections.abc import Iterator

import proton
import pytest
from integration.conftest import RunningServer
from proton import Timeout
from proton.utils import BlockingConnection, LinkDetached
from rabbitmq_amqp_python_client import (
    AddressHelper,
    ClassicQueueSpecification,
    Connection,
    Converter,
    Environment,
    ExchangeSpecification,
    ExchangeToQueueBindingSpecification,
    ExchangeType,
    Message,
    OutcomeState,
    QueueType,
    StreamConsumerOptions,
    StreamSpecification,
    ValidationCodeException,
)
from support.polling import wait_until
from support.rabbitmq import Accepting, Enough


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
