"""Per-connection read pausing: TCP back-pressure on a client whose account is too deep, or
which the memory budget holds (session/inbound.py).

The reactor selects a socket for reading when ``selectable.reading`` is true, which proton's
``IOHandler.update`` recomputes from the transport after every read, write and tick. This
module's :func:`update` runs proton's and then forces ``reading`` off while the connection's
account is paused; the selector picks the flag up when it handles the ``selectable_updated``
event that ``update`` queued, so a paused socket is simply never read. The kernel's receive
buffer then fills and TCP closes its window on the client, which blocks in ``send``.

While the socket is not read the client's frames, heartbeats included, do not arrive, so the
idle timeout (gateway/timeouts.py) starts afresh when reading resumes (RabbitMQ pauses its
heartbeat monitor when it blocks a reader).

:func:`update` also hands the connection's handshake or idle deadline to the selector.
"""

from __future__ import annotations

from proton import Transport
from proton.handlers import IOHandler

from sluicegate.gateway import timeouts
from sluicegate.gateway.proton_internals import Selectable, reactor_now, transport_of
from sluicegate.gateway.state import ConnectionState


def update(transport: Transport, selectable: Selectable, now: float) -> None:
    """Proton's ``IOHandler.update``, keeping a paused connection's socket unread."""
    IOHandler.update(transport, selectable, now)
    state: ConnectionState | None = getattr(selectable, "sg", None)
    if state is not None and state.reads_paused:
        selectable.reading = False
    if state is not None and state.deadline:
        deadline = selectable.deadline
        selectable.deadline = min(deadline, state.deadline) if deadline else state.deadline
    gate = getattr(selectable, "gate", None)
    if gate is not None:
        if gate.wants_write:
            selectable.writing = True
        if not gate.readable:
            selectable.reading = False


def pause(state: ConnectionState) -> None:
    """Stop reading the connection's socket until :func:`resume`."""
    selectable = state.selectable
    if selectable.is_terminal:
        return
    selectable.reading = False
    selectable.update()


def resume(state: ConnectionState) -> None:
    """Read the connection's socket again, unless it is still paused for another reason."""
    selectable = state.selectable
    if selectable.is_terminal or transport_of(selectable) is None:
        return
    now = reactor_now(selectable)
    timeouts.resumed(state, now)
    update(state.transport, selectable, now)
