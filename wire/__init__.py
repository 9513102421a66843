"""The AMQP 1.0 wire format as the server reads it: values, sections and the envelope.

Pure and the lowest layer: every other package may import it, it imports none of them.
"""
