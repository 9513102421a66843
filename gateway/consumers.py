"""A consumer's attach, read into :class:`~queues.queue_type.ConsumerOptions`.

The source's filter set (AMQP 1.0 §3.5.8) names each filter by its descriptor: property filters
(``amqp:properties-filter``, ``amqp:application-properties-filter``), JMS selectors
(``apache.org:selector-filter:string``), AMQP SQL filters (``amqp:sql-filter``, RabbitMQ 4.2's
``sql-filter``), RabbitMQ's stream filter values (``rabbitmq:stream-filter``,
``rabbitmq:stream-match-unfiltered``) and a stream reader's start
(``rabbitmq:stream-offset-spec``). A consumer gets every filter it names, on every queue type;
one that is malformed or beyond the limits checked here refuses the link with
``amqp:invalid-field`` (RabbitMQ leaves such a filter out of the echo and delivers unfiltered).
A ``rabbitmq:stream-*`` entry without a descriptor is read by its key, as RabbitMQ reads it.
Filters this server does not know are left out of the source echoed in the ATTACH reply, as
RabbitMQ does, so the client can see which took effect. ``distribution-mode = copy`` makes a
browser, and the link property ``rabbitmq:priority`` a consumer priority.
"""

from __future__ import annotations

import uuid
from typing import Final

from proton import Array, Data, Described, Link, Terminus, symbol, timestamp

from sluicegate.queues.errors import InvalidFilter
from sluicegate.queues.filters.filter_set import FilterSet, Language, compile_filters
from sluicegate.queues.filters.properties import (
    APPLICATION_PROPERTIES_FILTER,
    APPLICATION_PROPERTIES_NAME,
    PROPERTIES_FILTER,
    PROPERTIES_NAME,
)
from sluicegate.queues.filters.selector import SELECTOR_FILTER, SELECTOR_NAME
from sluicegate.queues.filters.sql import SQL_DESCRIPTOR, SQL_FILTER
from sluicegate.queues.filters.stream_filter import (
    MATCH_UNFILTERED,
    MAX_FILTER_VALUES,
    STREAM_FILTER,
)
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.queue_type import Clock, ConsumerOptions, OffsetSpec
from sluicegate.wire.amqp_types import Symbol, Value

PRIORITY: Final = symbol("rabbitmq:priority")
STREAM_OFFSET_SPEC: Final = "rabbitmq:stream-offset-spec"
_OFFSET_KEYWORDS: Final = frozenset({"first", "last", "next"})
_STREAM_PREFIX: Final = "rabbitmq:stream-"
# Each filter type by its descriptor's code and its name.
_KINDS: Final[dict[object, str]] = {
    PROPERTIES_FILTER: "properties",
    PROPERTIES_NAME: "properties",
    APPLICATION_PROPERTIES_FILTER: "application",
    APPLICATION_PROPERTIES_NAME: "application",
    SELECTOR_FILTER: "selector",
    SELECTOR_NAME: "selector",
    SQL_FILTER: "sql",
    SQL_DESCRIPTOR: "sql",
    STREAM_FILTER: "values",
    MATCH_UNFILTERED: "unfiltered",
    STREAM_OFFSET_SPEC: "offset",
}


def _offset_spec(value: object) -> OffsetSpec:
    """A stream reader's start: ``first``/``last``/``next``, an offset, or a timestamp."""
    if isinstance(value, timestamp):
        return OffsetSpec("timestamp", int(value))
    if isinstance(value, str) and value in _OFFSET_KEYWORDS:
        return OffsetSpec(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return OffsetSpec("offset", value)
    raise InvalidFilter(
        f"{STREAM_OFFSET_SPEC}: expected first, last, next, an offset or a timestamp, got {value!r}"
    )


def _plain(value: object) -> Value:
    """A proton-decoded value as the codec's plain value (what filters compare with)."""
    if isinstance(value, symbol):
        return Symbol(value)
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, bool | int | float | str | bytes) or value is None:
        return value
    raise InvalidFilter(f"a filter value of type {type(value).__name__} is not supported")


def _entries(value: object, name: str) -> dict[str, Value]:
    if not isinstance(value, dict):
        raise InvalidFilter(f"{name}: expected a map")
    return {str(key): _plain(item) for key, item in value.items()}


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidFilter(f"{name}: expected a string")
    return value


def _values(value: object) -> list[str]:
    """``rabbitmq:stream-filter``: one string or a list (or array) of them."""
    items = value.elements if isinstance(value, Array) else value
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise InvalidFilter(f"{STREAM_FILTER}: expected a string or a list of strings")
    if not 1 <= len(items) <= MAX_FILTER_VALUES:
        raise InvalidFilter(f"{STREAM_FILTER}: expected 1 to {MAX_FILTER_VALUES} values")
    return [str(v) for v in items]


def _kind(descriptor: object) -> str | None:
    if isinstance(descriptor, symbol):
        return _KINDS.get(str(descriptor))
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return _KINDS.get(int(descriptor))
    return None


def _undescribed_kind(key: object) -> str | None:
    """A ``rabbitmq:stream-*`` entry whose value has no descriptor (rhea, under RabbitMQ's JS
    client, sends them so): RabbitMQ takes the key for its descriptor, and so does this."""
    if isinstance(key, str) and key.startswith(_STREAM_PREFIX):
        return _KINDS.get(str(key))
    return None


def filter_set(link: Link) -> FilterSet:
    """Read a consumer's filter set from its source; trim the echoed filters to those served.

    Raises :class:`~queues.errors.InvalidFilter` for an entry of the wrong shape; the
    expressions are parsed when the set is compiled (queues/filters/filter_set.py).
    """
    source = link.remote_source
    offset: OffsetSpec | None = None
    served: dict[object, object] = {}
    expressions: list[tuple[Language, str]] = []
    properties: dict[str, Value] | None = None
    application: dict[str, Value] | None = None
    values: list[str] | None = None
    match_unfiltered = False
    requested = source.filter
    requested.rewind()
    if requested.next() is not None:
        entries = requested.get_object()
        for key, entry in entries.items() if isinstance(entries, dict) else ():
            if isinstance(entry, Described):
                kind, value = _kind(entry.descriptor), entry.value
            else:
                kind, value = _undescribed_kind(key), entry
            if kind is None:
                continue
            served[key] = entry
            if kind == "offset":
                offset = _offset_spec(value)
            elif kind == "properties":
                properties = {**(properties or {}), **_entries(value, PROPERTIES_NAME)}
            elif kind == "application":
                found = _entries(value, APPLICATION_PROPERTIES_NAME)
                application = {**(application or {}), **found}
            elif kind == "selector":
                expressions.append(("selector", _text(value, SELECTOR_NAME)))
            elif kind == "sql":
                expressions.append(("sql", _text(value, SQL_DESCRIPTOR)))
            elif kind == "values":
                values = _values(value)
            elif not isinstance(value, bool):
                raise InvalidFilter(f"{MATCH_UNFILTERED}: expected a boolean")
            else:
                match_unfiltered = value
    echoed: Data = link.source.filter
    echoed.clear()
    if served:
        echoed.put_object(served)
    return FilterSet(
        offset,
        properties,
        application,
        tuple(expressions),
        None if values is None else tuple(values),
        match_unfiltered,
    )


def consumer_options(
    link: Link, views: ViewCache, clock: Clock, *, indexes_filter_values: bool = False
) -> ConsumerOptions:
    """Read a consumer's filters, distribution mode and priority; trim the echoed filters.

    ``indexes_filter_values``: the queue (a stream) applies stream filter values itself, from
    its chunk filters; other queues get them as a filter on each message. The set read is kept
    in the options (``filter_set``), for a queue another worker owns to compile there.
    """
    filters = filter_set(link)
    compiled = compile_filters(filters, views, clock, indexes_filter_values=indexes_filter_values)
    priority = 0
    link_properties = link.remote_properties
    if isinstance(link_properties, dict):
        raw = link_properties.get(PRIORITY, 0)
        if isinstance(raw, int) and not isinstance(raw, bool):
            priority = raw
    return ConsumerOptions(
        filter=compiled.filter,
        browse=link.remote_source.distribution_mode == Terminus.DIST_MODE_COPY,
        priority=priority,
        offset=filters.offset,
        stream_filter=compiled.stream_filter,
        views=views,
        filter_set=None if filters.empty else filters,
    )
