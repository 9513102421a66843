"""``sluicegate quiver``: quiver-style throughput tests of any AMQP 1.0 server."""
