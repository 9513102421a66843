"""Pure AMQP session flow control: the dual link between client and queue, free of IO."""
