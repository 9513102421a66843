"""The bytes between a connection's socket (or its TLS) and proton's transport, both ways.

With ``rabbitmq_compatible`` on, they pass through the connection's link-name rewriting
(:mod:`wire.link_names`), which lets RabbitMQ's clients repeat a link name on one connection as
RabbitMQ does; proton-c would close the connection. Input is given to proton within its
capacity; what it has no room for yet waits in the connection's backlog. Output keeps its
length, so proton's output is taken and counted byte for byte.
"""

from __future__ import annotations

from proton import Transport

from sluicegate.gateway.state import ConnectionState
from sluicegate.transport.channel import feed as push_pending


def feed(state: ConnectionState, transport: Transport, data: bytes) -> None:
    """Give proton ``data`` read from the client (after any backlog).

    One TLS read can decrypt more than a transport capacity (8 KiB until a frame needs more),
    and the rewriting can lengthen an ATTACH: what proton has no room for waits.
    """
    recording = state.recording
    if recording is not None:
        # Until its first ATTACH a plain connection may be handed over: the ATTACH waits
        # (wire/handover.py).
        data = recording.inbound(data)
        if recording.over:
            data += recording.give_up()
            state.recording = None
    if data and not state.dispositions.admits(state, data):
        return  # the connection is closed: proton never decodes what it sent
    names = state.link_names
    if names is not None:
        data = names.inbound(data)
    backlog = state.backlog
    if not backlog and len(data) <= transport.capacity():
        if data:
            transport.push(data)
        return
    backlog += data
    push_pending(transport, backlog)


def output(state: ConnectionState | None, transport: Transport, limit: int) -> bytes:
    """Up to ``limit`` bytes of proton's pending output as the client must receive them.

    Call :func:`taken` with how many of them left; proton keeps the rest.
    """
    data = transport.peek(limit) or b""
    names = None if state is None else state.link_names
    return data if names is None else names.outbound(data)


def taken(state: ConnectionState | None, transport: Transport, count: int) -> None:
    """``count`` bytes of :func:`output` went to the client: proton forgets them."""
    transport.pop(count)
    names = None if state is None else state.link_names
    if names is not None:
        names.taken(count)
