"""A consumer's attach, read into :class:`~queues.queue_type.ConsumerOptions`.

The source's filter set (AMQP 1.0 §3.5.8: properties, application-properties and JMS selector
filters are served) may hold filters this server does not serve; as
RabbitMQ does, those are left out of the source echoed in the ATTACH reply, so the client can
see which filters took effect. ``distribution-mode = copy`` makes a browser, and the link
property ``rabbitmq:priority`` a consumer priority.
"""

from __future__ import annotations

import uuid
from typing import Final

from proton import Data, Described, Link, Terminus, symbol, timestamp

from sluicegate.queues.filters import FILTER_NAMES, PROPERTIES_FILTER, InvalidFilter, message_filter
from sluicegate.queues.queue_type import ConsumerOptions, MessageFilter, OffsetSpec
from sluicegate.queues.selector import SELECTOR_FILTER, SELECTOR_NAME, Selector
from sluicegate.wire.codec import Symbol, Value

PRIORITY: Final = symbol("rabbitmq:priority")
STREAM_OFFSET_SPEC: Final = "rabbitmq:stream-offset-spec"
_OFFSET_KEYWORDS: Final = frozenset({"first", "last", "next"})


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
    if isinstance(value, list):
        return [_plain(item) for item in value]
    raise InvalidFilter(f"a filter value of type {type(value).__name__} is not supported")


def _entries(value: object, name: str) -> dict[str, Value]:
    if not isinstance(value, dict):
        raise InvalidFilter(f"{name}: expected a map")
    return {str(key): _plain(item) for key, item in value.items()}


def consumer_options(link: Link) -> ConsumerOptions:
    """Read a consumer's filters, distribution mode and priority; trim the echoed filters."""
    source = link.remote_source
    properties: dict[str, Value] = {}
    application: dict[str, Value] = {}
    offset: OffsetSpec | None = None
    served: dict[object, object] = {}
    selector: MessageFilter | None = None
    filters = source.filter
    filters.rewind()
    if filters.next() is not None:
        requested = filters.get_object()
        for key, entry in requested.items() if isinstance(requested, dict) else ():
            if not isinstance(entry, Described):
                continue
            descriptor = entry.descriptor
            if descriptor == STREAM_OFFSET_SPEC:
                offset = _offset_spec(entry.value)
                served[key] = entry
                continue
            code = FILTER_NAMES.get(str(descriptor)) if isinstance(descriptor, str) else descriptor
            if code == SELECTOR_FILTER or descriptor == SELECTOR_NAME:
                if not isinstance(entry.value, str):
                    raise InvalidFilter(f"{SELECTOR_NAME}: expected a string")
                selector = Selector(entry.value)
            elif code == PROPERTIES_FILTER:
                properties.update(_entries(entry.value, "amqp:properties-filter"))
            elif code in FILTER_NAMES.values():
                application.update(_entries(entry.value, "amqp:application-properties-filter"))
            else:
                continue
            served[key] = entry
    echoed: Data = link.source.filter
    echoed.clear()
    if served:
        echoed.put_object(served)
    priority = 0
    link_properties = link.remote_properties
    if isinstance(link_properties, dict):
        raw = link_properties.get(PRIORITY, 0)
        if isinstance(raw, int) and not isinstance(raw, bool):
            priority = raw
    return ConsumerOptions(
        filter=message_filter(properties, application, selector),
        browse=source.distribution_mode == Terminus.DIST_MODE_COPY,
        priority=priority,
        offset=offset,
    )
