"""The management node's requests (RabbitMQ's HTTP-over-AMQP API), decided without IO."""
