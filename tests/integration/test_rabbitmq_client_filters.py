"""Stream filters through RabbitMQ's own AMQP 1.0 client (rabbitmq-amqp-python-client), used as
its users use it: StreamFilterOptions with filter values, match-unfiltered, message and
application properties, and SQL (issue 20 §4).

The client enables these only for servers that say RabbitMQ 4.1 (values and properties) or 4.2
(SQL) in their OPEN, and refuses them below; the version sluicegate advertises is
gateway/identity.py's, so these tests run once it says 4.2. The same filter sets are tested
with proton (test_stream_filters.py) and rhea (test_rhea.py) whatever the version.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from integration.conftest import RunningServer
from rabbitmq_amqp_python_client import (
    AddressHelper,
    Connection,
    Converter,
    Environment,
    Message,
    MessageProperties,
    OffsetSpecification,
    StreamConsumerOptions,
    StreamFilterOptions,
    StreamSpecification,
)
from support.rabbitmq import Accepting, Enough

from sluicegate.gateway.identity import RABBITMQ_VERSION

pytestmark = pytest.mark.skipif(
    tuple(int(part) for part in RABBITMQ_VERSION.split(".")) < (4, 2),
    reason=f"RabbitMQ's client refuses stream and SQL filters from a RabbitMQ {RABBITMQ_VERSION}",
)


@pytest.fixture
def connection(server: RunningServer) -> Iterator[Connection]:
    environment = Environment(f"amqp://127.0.0.1:{server.port}/")
    connection = environment.connection()
    connection.dial()
    yield connection
    connection.close()
    environment.close()


def _stream(connection: Connection, name: str, messages: list[Message]) -> str:
    management = connection.management()
    management.declare_queue(StreamSpecification(name=name))
    management.close()
    address = AddressHelper.queue_address(name)
    publisher = connection.publisher(address)
    for message in messages:
        publisher.publish(message)
    publisher.close()
    return address


def _tagged(body: str, value: str | None = None, **fields: object) -> Message:
    annotations = {"x-stream-filter-value": value} if value is not None else {}
    return Message(body=Converter.string_to_bytes(body), annotations=annotations, **fields)


def _consume(
    connection: Connection, address: str, count: int, filters: StreamFilterOptions
) -> Accepting:
    handler = Accepting(count)
    options = StreamConsumerOptions(OffsetSpecification.first, filter_options=filters)
    consumer = connection.consumer(address, message_handler=handler, consumer_options=options)
    with pytest.raises(Enough):
        consumer.run()
    consumer.close()
    return handler


def test_filter_values_and_unfiltered_messages(connection: Connection) -> None:
    tags = ["apple"] * 10 + ["banana"] * 10 + [None] * 5
    address = _stream(
        connection, "rmq-filter-values", [_tagged(f"m{i}", t) for i, t in enumerate(tags)]
    )
    bananas = _consume(connection, address, 10, StreamFilterOptions(values=["banana"]))
    assert bananas.bodies == [f"m{i}" for i in range(10, 20)]
    assert [a["x-stream-offset"] for a in bananas.annotations] == list(range(10, 20))  # type: ignore[index]
    untagged = _consume(
        connection, address, 15, StreamFilterOptions(values=["banana"], match_unfiltered=True)
    )
    assert untagged.bodies == [f"m{i}" for i in range(10, 25)]


def test_a_reader_skips_every_message_of_other_values(connection: Connection) -> None:
    bananas = [_tagged(f"m{i}", "banana") for i in range(10)]
    address = _stream(connection, "rmq-filter-other", [*bananas, _tagged("m10", "apple")])
    apples = _consume(connection, address, 1, StreamFilterOptions(values=["apple"]))
    assert apples.bodies == ["m10"]
    assert [a["x-stream-offset"] for a in apples.annotations] == [10]  # type: ignore[index]


def test_message_and_application_properties_filters(connection: Connection) -> None:
    messages = [
        _tagged(
            f"m{i}",
            subject=f"important_{i}",
            group_id=f"group_{i % 3}",
            application_properties={"key": f"value_{i % 4}"},
        )
        for i in range(30)
    ]
    address = _stream(connection, "rmq-filter-properties", messages)
    by_properties = StreamFilterOptions(
        message_properties=MessageProperties(subject="important_15", group_id="group_0")
    )
    assert _consume(connection, address, 1, by_properties).bodies == ["m15"]
    by_application = StreamFilterOptions(application_properties={"key": "value_1"})
    assert _consume(connection, address, 8, by_application).bodies == [
        f"m{i}" for i in range(1, 30, 4)
    ]


def test_sql_filter_and_filters_together(connection: Connection) -> None:
    messages = [
        _tagged(
            f"m{i}",
            "blue" if i % 2 else "red",
            subject=f"order.{i}",
            reply_to="the_reply_to",
            application_properties={"amount": i},
        )
        for i in range(30)
    ]
    address = _stream(connection, "rmq-filter-sql", messages)
    sql = StreamFilterOptions(
        sql="properties.subject LIKE 'order.2%' AND properties.reply_to = 'the_reply_to' "
        "AND amount > 22"
    )
    assert _consume(connection, address, 7, sql).bodies == [f"m{i}" for i in range(23, 30)]
    together = StreamFilterOptions(
        values=["blue"],
        application_properties={"amount": 27},
        message_properties=MessageProperties(subject="order.27"),
    )
    assert _consume(connection, address, 1, together).bodies == ["m27"]
