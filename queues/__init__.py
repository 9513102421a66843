"""Pure queue semantics: message states, the credit API queues answer, and queue types.

Nothing here touches proton, sockets or the clock: time arrives as an argument.
"""
