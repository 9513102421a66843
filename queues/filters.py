"""Consumer filters from a source's filter set (AMQP Filter Expressions, RabbitMQ 4.1).

``amqp:properties-filter`` (0x173) matches fields of the properties section and
``amqp:application-properties-filter`` (0x174) entries of the application-properties section.
Every entry must match: equal value and type, or for strings ``&p:PREFIX`` / ``&s:SUFFIX``
(``&&`` escapes a leading ``&``). A message without the field does not match. Only the sections
before the body are decoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sluicegate.queues.errors import QueueError
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import MessageFilter
from sluicegate.wire.codec import Value
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import APPLICATION_PROPERTIES, PROPERTIES, sections

PROPERTIES_FILTER: Final = 0x173
APPLICATION_PROPERTIES_FILTER: Final = 0x174
FILTER_NAMES: Final = {
    "amqp:properties-filter": PROPERTIES_FILTER,
    "amqp:application-properties-filter": APPLICATION_PROPERTIES_FILTER,
}
# The properties list's fields by name, in their order (AMQP 1.0 §3.2.4).
PROPERTY_FIELDS: Final = (
    "message-id",
    "user-id",
    "to",
    "subject",
    "reply-to",
    "correlation-id",
    "content-type",
    "content-encoding",
    "absolute-expiry-time",
    "creation-time",
    "group-id",
    "group-sequence",
    "reply-to-group-id",
)
_PREFIX: Final = "&p:"
_SUFFIX: Final = "&s:"
_ESCAPE: Final = "&&"
_ABSENT: Final = object()


class InvalidFilter(QueueError):
    """A filter whose expression cannot be used."""

    condition = "amqp:invalid-field"


def _value_matches(expected: Value, actual: object) -> bool:
    if actual is _ABSENT:
        return False
    if isinstance(expected, str):
        if not isinstance(actual, str):
            return False
        if expected.startswith(_ESCAPE):
            return actual == expected[1:]
        if expected.startswith(_PREFIX):
            return actual.startswith(expected[len(_PREFIX) :])
        if expected.startswith(_SUFFIX):
            return actual.endswith(expected[len(_SUFFIX) :])
        return actual == expected
    # bool is an int in Python, not in AMQP: compare types as well as values.
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    return expected == actual


class PropertiesFilter:
    """Both filters of a consumer, applied together."""

    __slots__ = ("application_properties", "properties")

    def __init__(
        self,
        properties: Mapping[str, Value] | None = None,
        application_properties: Mapping[str, Value] | None = None,
    ) -> None:
        fields: list[tuple[int, Value]] = []
        for name, value in (properties or {}).items():
            if name not in PROPERTY_FIELDS:
                raise InvalidFilter(f"amqp:properties-filter: unknown property field '{name}'")
            fields.append((PROPERTY_FIELDS.index(name), value))
        self.properties = tuple(fields)
        self.application_properties = tuple((application_properties or {}).items())

    def __call__(self, message: Message) -> bool:
        """True when the message matches every entry."""
        try:
            found = sections(message.payload, until=APPLICATION_PROPERTIES + 1)
        except DecodeError:
            return False
        properties: list[Value] = []
        application: dict[Value, Value] = {}
        for code, value, _, _ in found:
            if code == PROPERTIES and isinstance(value, list):
                properties = value
            elif code == APPLICATION_PROPERTIES and isinstance(value, dict):
                application = value
        for index, expected in self.properties:
            actual = properties[index] if index < len(properties) else None
            if not _value_matches(expected, _ABSENT if actual is None else actual):
                return False
        return all(
            _value_matches(expected, application.get(key, _ABSENT))
            for key, expected in self.application_properties
        )


class AllOf:
    """Several filters of one consumer: a message must pass every one."""

    __slots__ = ("filters",)

    def __init__(self, filters: list[MessageFilter]) -> None:
        self.filters = filters

    def __call__(self, message: Message) -> bool:
        """True when every filter accepts the message."""
        return all(accept(message) for accept in self.filters)


def message_filter(
    properties: Mapping[str, Value] | None,
    application_properties: Mapping[str, Value] | None,
    selector: MessageFilter | None = None,
) -> MessageFilter | None:
    """The consumer's filter, or None when it has no entries."""
    filters: list[MessageFilter] = []
    if properties or application_properties:
        filters.append(PropertiesFilter(properties, application_properties))
    if selector is not None:
        filters.append(selector)
    if not filters:
        return None
    return filters[0] if len(filters) == 1 else AllOf(filters)
