"""The IO shell of sluicegate: proton's reactor, sockets, the clock, configuration and the CLI.

Everything below it (``session``, ``writer``, ``queues``) is pure; this package translates proton
events into calls on those state machines and applies the actions they return.
"""
