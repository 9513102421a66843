"""The quarantine's names for python-qpid-proton 0.40's private attributes and modules.

Proton's Python binding keeps what the server needs behind private names: the C object each
wrapper stands for (``_impl``), the reactor and transport a selectable belongs to (``_reactor``,
``_transport``), the selectable a transport is served by (``_selectable``), a container's event
collector (``_collector``), and classes defined in private modules (``Selectable``, ``Task``,
``PythonAMQPData``). The rest of ``gateway/`` uses the names here instead, so what an upgrade of
proton may break is in this package (gateway/proton/, docs/design.md lists why each module
is there). ruff's SLF001 and tests/unit/test_layering.py keep it so. One C call is here too,
for gateway/limits.py: the encoded size of a link's ATTACH properties.
"""

from __future__ import annotations

import socket
from typing import Any, TypeAlias

from cproton import ffi, lib
from proton import Collector, Connection, Delivery, Link, Session, Transport
from proton._data import PythonAMQPData
from proton._reactor import Task
from proton._selectable import Selectable
from proton.reactor import Container, EventInjector

# A pointer to one of proton's C structs (pn_link_t, pn_delivery_t, ...), as cffi hands it out.
CObject: TypeAlias = Any

__all__ = [
    "CObject",
    "PythonAMQPData",
    "Selectable",
    "Task",
    "c_object",
    "collector",
    "forget_transport",
    "reactor_now",
    "register",
    "remote_properties_size",
    "selectable_of",
    "serve",
    "transport_of",
]


def c_object(wrapper: Connection | Session | Link | Delivery | Collector) -> CObject:
    """The C object a proton wrapper stands for, for the C API (gateway/proton/deliveries.py)."""
    return wrapper._impl


def remote_properties_size(link: Link) -> int:
    """Encoded bytes of the properties in the client's ATTACH of ``link``; 0 for none.

    Proton wraps them only as a decoded ``dict`` (``Link.remote_properties``); the C call sizes
    them where they are, without decoding or copying (gateway/limits.py charges them per ATTACH).
    """
    data = lib.pn_link_remote_properties(c_object(link))
    if data == ffi.NULL:
        return 0
    size: int = lib.pn_data_encoded_size(data)
    return max(size, 0)


def collector(container: Container) -> Collector:
    """The container's event collector, whose head is the event being dispatched."""
    found: Collector = container._collector
    return found


def reactor_now(selectable: Selectable) -> float:
    """The reactor's time, as its container last read the clock."""
    time: float = selectable._reactor.now
    return time


def transport_of(selectable: Selectable) -> Transport | None:
    """The transport a socket's selectable serves; None for a pipe or a listening socket, or
    once the connection is closed."""
    transport: Transport | None = selectable._transport
    return transport


def serve(selectable: Selectable, connection: Connection, transport: Transport) -> None:
    """Tie an accepted socket's selectable to its transport, both ways, as proton's own acceptor
    does; the connection is marked accepted, or proton's IO handler would dial out for it."""
    setattr(connection, "_acceptor", True)  # noqa: B010
    setattr(selectable, "_transport", transport)  # noqa: B010
    transport._selectable = selectable


def selectable_of(transport: Transport) -> Selectable | None:
    """The selectable serving a transport's socket, until the transport is closed."""
    selectable: Selectable | None = transport._selectable
    return selectable


def forget_transport(transport: Transport) -> None:
    """Untie a closed transport from its selectable, which stays to flush what is left."""
    selectable: Selectable | None = transport._selectable
    if selectable is not None:
        setattr(selectable, "_transport", None)  # noqa: B010
    transport._selectable = None


def register(
    container: Container,
    delegate: socket.socket | EventInjector,
    handler: object,
    *,
    direct: bool = False,
) -> Selectable:
    """Add a socket or pipe without a transport to the reactor, its events going to ``handler``.

    The global IO handler sees every selectable and skips those without a transport. A
    ``direct`` one's readiness is handed to its handler by the global IO handler as the reactor
    finds it (``readable()``, ``writable()``), without an event of proton's: the channels
    between workers (gateway/proton/io_layer.py ``FlowIO.direct``).
    """
    selectable = Selectable(delegate, container)
    setattr(selectable, "handler", handler)  # noqa: B010
    setattr(selectable, "_transport", None)  # noqa: B010
    selectable.reading = True
    if direct:
        handlers: dict[Selectable, object] | None = getattr(
            container.global_handler, "direct", None
        )
        if handlers is not None:
            handlers[selectable] = handler
    container.update(selectable)
    return selectable
