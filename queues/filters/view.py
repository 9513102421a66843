"""What filters read of a message, decoded once however many consumers filter it.

A filter reads the header's durable and priority fields, the properties section, the
application-properties section, and (for ``rabbitmq:stream-filter``) one message annotation. A
queue with several filtered consumers asks each of them about the same message, so the decoded
fields are kept in a :class:`FilterView` on the message and each part is decoded at most once,
on first use; the body and the other
annotations are skipped by their encoded width, never decoded.

Views are held in a :class:`ViewCache`, least recently used first, up to a budget of estimated
bytes: an evicted view forgets what it decoded, so memory stays bounded however many messages
wait in filtered queues, and only a message read again after eviction is decoded again. How much
one decode can cost is bounded where messages come in: application-properties larger than the
server's ``max_application_properties_size`` are refused at publish.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from sluicegate.queues.message import Message
from sluicegate.wire.amqp_types import Value
from sluicegate.wire.annotations import X_STREAM_FILTER_VALUE, filter_value_of
from sluicegate.wire.decoding import decode, skip
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import (
    APPLICATION_PROPERTIES,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    iter_sections,
)

# The parts of a message a filter may read, as bits: a filter asks for the ones it needs.
HEADER_PART: Final = 1
PROPERTIES_PART: Final = 2
APPLICATION_PART: Final = 4
FILTER_VALUE_PART: Final = 8
# What a view costs beyond the encoded bytes it decoded: the object and its slots, and per
# application property a dict slot and the key and value objects (measured on CPython 3.11 with
# short keys and values, rounded up).
VIEW_OVERHEAD: Final = 256
ENTRY_OVERHEAD: Final = 96
# Estimated bytes of decoded views kept: some 40,000 views of messages with a few short
# properties, enough for every filtered consumer of a queue to read its recent messages from the
# cache, and small beside the server's memory budget.
DEFAULT_VIEW_BUDGET: Final = 16 * 1024 * 1024
_EMPTY: Final[dict[str, Value]] = {}
_NO_PROPERTIES: Final[list[Value]] = []


class FilterView:
    """The decoded fields of one message that filters read; ``parts`` says which are decoded.

    A message whose leading sections do not decode is ``malformed``: no filter selects it.
    """

    __slots__ = (
        "application",
        "cost",
        "durable",
        "filter_value",
        "malformed",
        "parts",
        "priority",
        "properties",
    )

    def __init__(self) -> None:
        self.parts = 0
        self.cost = 0
        self.malformed = False
        self.durable = False
        self.priority = 4
        self.properties: list[Value] = _NO_PROPERTIES
        self.application: dict[str, Value] = _EMPTY
        self.filter_value: str | None = None

    def forget(self) -> None:
        """Drop what was decoded (evicted from the cache): the next read decodes again."""
        self.parts = 0
        self.cost = 0
        self.properties = _NO_PROPERTIES
        self.application = _EMPTY
        self.filter_value = None

    def decode(self, message: Message, parts: int) -> int:
        """Decode ``parts`` from the message's leading sections, in one pass, skipping the rest;
        return the encoded bytes decoded (the work done).

        Sections after application-properties (the body and footer) are never reached; the
        header is the one the message keeps, decoded once.
        """
        wanted = parts & ~self.parts
        decoded = 0
        try:
            if wanted & HEADER_PART:
                header = message.read_header()
                self.durable = header.durable
                self.priority = header.priority
            if wanted & ~HEADER_PART:
                decoded = self._decode(message.read(), wanted)
        except DecodeError:
            self.malformed = True
        self.parts |= wanted
        return decoded

    def _decode(self, payload: bytes | memoryview, wanted: int) -> int:
        cost = 0
        decoded = 0
        for code, _, value_at, end in iter_sections(payload):
            if code == MESSAGE_ANNOTATIONS and wanted & FILTER_VALUE_PART:
                self.filter_value = _filter_value(payload, value_at, end)
            elif code == PROPERTIES and wanted & PROPERTIES_PART:
                self.properties, _ = _list_at(payload, value_at)
                cost += end - value_at
            elif code == APPLICATION_PROPERTIES and wanted & APPLICATION_PART:
                self.application, _ = _string_keyed_map(payload, value_at)
                cost += end - value_at + ENTRY_OVERHEAD * len(self.application)
            else:
                continue
            decoded += end - value_at
        self.cost += cost
        return decoded


def _list_at(payload: bytes | memoryview, pos: int) -> tuple[list[Value], int]:
    """Decode the properties list, its strings and nulls read directly."""
    code = payload[pos]
    if code == 0x45:
        return [], pos + 1
    if code == 0xC0:
        end, count, item = pos + 2 + payload[pos + 1], payload[pos + 2], pos + 3
    elif code == 0xD0:
        end = pos + 5 + int.from_bytes(payload[pos + 1 : pos + 5], "big")
        count, item = int.from_bytes(payload[pos + 5 : pos + 9], "big"), pos + 9
    else:
        raise DecodeError("the properties section is not a list")
    if end > len(payload):
        raise DecodeError("the properties section runs past the message")
    items: list[Value] = []
    for _ in range(count):
        value, item = _item_at(payload, item)
        if item > end:
            raise DecodeError("a property runs past its section")
        items.append(value)
    return items, end


def _string_keyed_map(payload: bytes | memoryview, pos: int) -> tuple[dict[str, Value], int]:
    """Decode the application-properties map: its keys are strings (AMQP 1.0 §3.2.5), and an
    entry of another key no filter can name is left out.

    Keys and string values, nearly all of a map, are read directly (:func:`_item_at`).
    """
    code = payload[pos]
    if code == 0xC1:
        end, count, item = pos + 2 + payload[pos + 1], payload[pos + 2], pos + 3
    elif code == 0xD1:
        end = pos + 5 + int.from_bytes(payload[pos + 1 : pos + 5], "big")
        count, item = int.from_bytes(payload[pos + 5 : pos + 9], "big"), pos + 9
    else:
        raise DecodeError("the application-properties section is not a map")
    if end > len(payload) or count % 2:
        raise DecodeError("the application-properties map is malformed")
    entries: dict[str, Value] = {}
    for _ in range(count // 2):
        key, item = _item_at(payload, item)
        value, item = _item_at(payload, item)
        if item > end:
            raise DecodeError("an application property runs past its section")
        if isinstance(key, str):
            entries[key] = value
    return entries, end


def _item_at(payload: bytes | memoryview, pos: int) -> tuple[Value, int]:
    """The value at ``pos``: a null or a str8 string read directly, anything else by the
    codec."""
    if pos < len(payload) and payload[pos] == 0x40:
        return None, pos + 1
    if pos + 1 < len(payload) and payload[pos] == 0xA1:
        start = pos + 2
        end = start + payload[pos + 1]
        try:
            return bytes(payload[start:end]).decode("utf-8"), end
        except UnicodeDecodeError:
            raise DecodeError("invalid UTF-8 in a string") from None
    return decode(payload, pos)


def _filter_value(payload: bytes | memoryview, pos: int, end: int) -> str | None:
    """Find ``x-stream-filter-value`` in the annotations map at ``pos`` (up to ``end``), if it
    is a non-empty string; decode only the keys."""
    code = payload[pos]
    if code == 0xC1:
        count, item = payload[pos + 2], pos + 3
    elif code == 0xD1:
        count, item = int.from_bytes(payload[pos + 5 : pos + 9], "big"), pos + 9
    else:
        raise DecodeError("the message-annotations section is not a map")
    for _ in range(count // 2):
        key, value_pos = decode(payload, item)
        item = skip(payload, value_pos)
        if item > end:
            raise DecodeError("an annotation runs past the message-annotations section")
        if key == X_STREAM_FILTER_VALUE:
            return filter_value_of(decode(payload, value_pos)[0])
    return None


@dataclass(frozen=True, slots=True)
class ViewStatistics:
    """How the cache has served filters: decodes are what the bound on work counts."""

    views: int
    cost: int
    decodes: int
    hits: int
    evictions: int
    # Encoded bytes of sections decoded, all told.
    decoded_bytes: int


class ViewCache:
    """Decoded views of messages, least recently used first, up to ``budget`` estimated bytes."""

    __slots__ = (
        "_views",
        "budget",
        "cost",
        "decoded_bytes",
        "decodes",
        "evictions",
        "hits",
        "work",
    )

    def __init__(self, budget: int = DEFAULT_VIEW_BUDGET) -> None:
        self.budget = budget
        self._views: OrderedDict[FilterView, None] = OrderedDict()
        self.cost = 0
        # Readers that must bound their work compare this before and after a filter runs.
        self.decoded_bytes = 0
        # Units of the read budget the filters evaluated over these views spent beyond decoding
        # (queues.filters.expression): readers compare it before and after, as decoded_bytes.
        self.work = 0
        self.decodes = 0
        self.hits = 0
        self.evictions = 0

    def view(self, message: Message, parts: int) -> FilterView:
        """The message's view with ``parts`` decoded: from the cache, or decoded now."""
        view = message.view
        if view is None:
            view = message.view = FilterView()
        views = self._views
        if view.parts & parts == parts:
            self.hits += 1
            if view in views:
                views.move_to_end(view)
            return view
        self.decodes += 1
        before = view.cost
        self.decoded_bytes += view.decode(message, parts)
        if view not in views:
            views[view] = None
            self.cost += VIEW_OVERHEAD
        else:
            views.move_to_end(view)
        self.cost += view.cost - before
        while self.cost > self.budget and len(views) > 1:
            evicted, _ = views.popitem(last=False)
            self.cost -= evicted.cost + VIEW_OVERHEAD
            evicted.forget()
            self.evictions += 1
        return view

    def statistics(self) -> ViewStatistics:
        """Counts for metrics and tests."""
        return ViewStatistics(
            len(self._views), self.cost, self.decodes, self.hits, self.evictions, self.decoded_bytes
        )
