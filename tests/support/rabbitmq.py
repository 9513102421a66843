"""Helpers for tests with RabbitMQ's own AMQP 1.0 client (rabbitmq-amqp-python-client)."""

from __future__ import annotations

from rabbitmq_amqp_python_client import AMQPMessagingHandler, Converter, Event


class Enough(BaseException):
    """Leaves ``Consumer.run()``, the way the client's own tests stop a consumer."""


class Accepting(AMQPMessagingHandler):
    """Accepts ``limit`` messages, noting their bodies and annotations, then stops."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.bodies: list[str] = []
        self.annotations: list[object] = []

    def on_amqp_message(self, event: Event) -> None:
        assert event.message is not None
        self.bodies.append(Converter.bytes_to_string(event.message.body))
        self.annotations.append(event.message.annotations)
        self.delivery_context.accept(event)
        if len(self.bodies) == self.limit:
            raise Enough
