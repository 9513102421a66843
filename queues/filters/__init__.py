"""Consumer filters: which messages a consumer receives (AMQP 1.0 §3.5.8's filter set).

Property filters (``properties``), JMS selectors (``selector``) and AMQP SQL filters (``sql``)
share one evaluator (``expression``, ``parser``, ``like``) and read a message through its
decoded view (``view``); ``stream_filter`` serves RabbitMQ's stream filter values, with a
filter per chunk of a stream so that a filtered read skips chunks without reading them.
"""
