"""Benchmarks for sluicegate and any other AMQP 1.0 server: ``python -m bench SCENARIO``.

Each scenario drives real clients against a server it starts (``python -m sluicegate serve``) or
one given by URL, samples the server's RSS and CPU (and, for sluicegate, its flow-control
metrics) over time, and writes a JSON result, a PNG plot and one Markdown table. The figures are
printed, never asserted: speed depends on the machine, behaviour is what the tests check.
"""
