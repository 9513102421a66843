"""The broker's decisions, without IO: who may log in and enter which virtual host, what a
message's address routes to, what a management request does, which names and definitions are
valid. No proton, socket, time or asyncio here (ruff's banned-api and tests/unit/test_layering.py):
the shell (gateway/) does the IO and turns the :class:`~sluicegate.wire.errors.AmqpError`
raised here into proton's conditions.
"""
