"""Typed access to the endpoint an event is about.

Proton's type hints make every event accessor optional, because the same ``Event`` class serves
all event types. A handler of a link event knows the link is there; these accessors say so once,
and fail loudly if proton ever breaks that promise.
"""

from __future__ import annotations

from proton import Connection, Delivery, Event, Link, Session, Transport


class MissingContext(LookupError):
    """An event lacks the endpoint its type guarantees."""


def link_of(event: Event) -> Link:
    """The link of a link or delivery event."""
    link = event.link
    if link is None:
        raise MissingContext(f"{event.type} has no link")
    return link


def delivery_of(event: Event) -> Delivery:
    """The delivery of a delivery event."""
    delivery = event.delivery
    if delivery is None:
        raise MissingContext(f"{event.type} has no delivery")
    return delivery


def session_of(event: Event) -> Session:
    """The session of a session, link or delivery event."""
    session = event.session
    if session is None:
        raise MissingContext(f"{event.type} has no session")
    return session


def connection_of(event: Event) -> Connection:
    """The connection of any endpoint event."""
    connection = event.connection
    if connection is None:
        raise MissingContext(f"{event.type} has no connection")
    return connection


def transport_of(event: Event) -> Transport:
    """The transport of a transport event."""
    transport = event.transport
    if transport is None:
        raise MissingContext(f"{event.type} has no transport")
    return transport
