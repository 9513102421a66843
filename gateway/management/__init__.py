"""RabbitMQ 4's HTTP-over-AMQP management: a pure router and the ``/management`` link pair."""
