"""Per-connection read pausing: TCP back-pressure on a client whose account is too deep, or
which the memory budget holds (session/inbound_flow.py).

The reactor selects a socket for reading when ``selectable.reading`` is true, which proton's
``IOHandler.update`` recomputes from the transport after every read, write and tick. This
module's :func:`watch` does what proton's does and then forces ``reading`` off while the
connection's account is paused; the selector picks the flag up (at once from the IO handler,
else when it handles the ``selectable_updated`` event that :func:`update` queues), so a paused
socket is simply never read, but for :data:`wire.held_frames.HELD_READ` bytes read ahead for
a CLOSE, END or DETACH (:func:`reads_ahead`). The kernel's receive buffer then fills and TCP
closes its window on the client, which blocks in ``send``.

While the socket is not read the client's frames, heartbeats included, do not arrive, so the
idle timeout (gateway/rules/timeouts.py) starts afresh when reading resumes (RabbitMQ pauses its
heartbeat monitor when it blocks a reader).

:func:`update` also hands the connection's handshake or idle deadline to the selector, and the
end of its hold on early consumer credit (gateway/rules/credit_hold.py).
"""

from __future__ import annotations

from typing import Final

from proton import ProtonException, Transport

from sluicegate.gateway.feeding import feed
from sluicegate.gateway.proton.internals import (
    Selectable,
    forget_transport,
    reactor_now,
    transport_of,
)
from sluicegate.gateway.state import ConnectionState

# Bytes read from one connection per readiness (gateway/proton/io_layer.py): enough for many
# small messages or a large one per pass of the reactor, small enough that one busy client does
# not starve the others; what the budget's holds may let one read pass by (docs/bounds.md).
READ_BATCH: Final = 256 * 1024


def update(transport: Transport, selectable: Selectable, now: float) -> None:
    """Proton's ``IOHandler.update``, keeping a paused connection's socket unread."""
    watch(transport, selectable, now)
    selectable.update()


def watch(transport: Transport, selectable: Selectable, now: float) -> None:
    """Set what the socket is to be selected for and when it next times out, as proton's
    ``IOHandler.update`` does, but leave telling the selector to the caller."""
    try:
        selectable.reading = transport.capacity() > 0
    except ProtonException:
        _closed(transport, selectable)
    try:
        selectable.writing = transport.pending() > 0
    except ProtonException:
        _closed(transport, selectable)
    selectable.deadline = transport.tick(now)
    state: ConnectionState | None = getattr(selectable, "sg", None)
    gate = getattr(selectable, "gate", None)
    if state is not None and state.reads_paused and not reads_ahead(state, selectable):
        selectable.reading = False
    if state is not None:
        deadlines = state.deadlines
        deadlines.output(now, selectable.writing or (gate is not None and gate.wants_write))
        for due in (deadlines.deadline, state.credit_hold.deadline):
            if due:
                deadline = selectable.deadline
                selectable.deadline = min(deadline, due) if deadline else due
    if state is not None:
        recording = state.recording
        if recording is not None and recording.attach is not None:
            # Its first ATTACH waits for the hand-over to be decided (gateway/handover.py).
            selectable.reading = False
            if recording.offered:
                selectable.writing = False
                return
        if state.arrival is not None:
            # Another worker hands it over: its output is checked, not written.
            selectable.reading = False
    if gate is not None:
        if gate.wants_write:
            selectable.writing = True
        if not gate.readable:
            selectable.reading = False


def reads_ahead(state: ConnectionState, selectable: Selectable) -> bool:
    """Whether a held connection's socket is still read, into its held bytes and no further
    (wire/held_frames.py); under TLS through its gate once logged in (gateway/gate.py)."""
    gate = getattr(selectable, "gate", None)
    return (
        state.held.room > 0
        and not state.closed
        and (gate is None or gate.reads_ahead)
        and state.dispositions.cut() is not None
    )


def _closed(transport: Transport, selectable: Selectable) -> None:
    """A closed transport's socket is done with (proton's ``IOHandler.update``)."""
    if transport.closed:
        selectable.terminate()
        forget_transport(transport)


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
    state.deadlines.resumed(now)
    if state.held.data and not state.reads_paused:
        # What was read ahead while held goes first (wire/held_frames.py).
        feed(state, state.transport, state.held.take())
    update(state.transport, selectable, now)
