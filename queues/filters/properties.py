"""Property filter expressions (AMQP Filter Expressions §4, RabbitMQ 4.1).

``amqp:properties-filter`` (0x173) matches fields of the properties section and
``amqp:application-properties-filter`` (0x174) entries of the application-properties section.
Every entry must match: a null reference value matches anything; a string matches an equal
string, or with ``&p:PREFIX`` / ``&s:SUFFIX`` a string with that prefix or suffix (``&&``
escapes a leading ``&``; any other ``&`` modifier is refused); numbers match equal numbers
whatever their AMQP types; anything else an equal value of the same type. A message without
the field does not match (unless the reference is null). As in RabbitMQ, a filter holds one to
:data:`MAX_FILTER_FIELDS` entries. The sections are read through the message's decoded view
(queues.filters.view).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sluicegate.queues.errors import InvalidFilter
from sluicegate.queues.filters.expression import is_number
from sluicegate.queues.filters.view import APPLICATION_PART, PROPERTIES_PART, ViewCache
from sluicegate.queues.message import Message
from sluicegate.wire.amqp_types import Value

PROPERTIES_FILTER: Final = 0x173
APPLICATION_PROPERTIES_FILTER: Final = 0x174
PROPERTIES_NAME: Final = "amqp:properties-filter"
APPLICATION_PROPERTIES_NAME: Final = "amqp:application-properties-filter"
# "Impose a limit on the complexity of each filter expression" (§7.1): RabbitMQ's limit.
MAX_FILTER_FIELDS: Final = 16
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


class _Reference:
    """One entry's reference value, with its string modifier read once at attach."""

    __slots__ = ("kind", "value")

    def __init__(self, name: str, value: Value) -> None:
        self.value = value
        self.kind = "equal"
        if isinstance(value, str) and value.startswith("&"):
            if value.startswith(_ESCAPE):
                self.value = value[1:]
            elif value.startswith(_PREFIX):
                self.kind, self.value = "prefix", value[len(_PREFIX) :]
            elif value.startswith(_SUFFIX):
                self.kind, self.value = "suffix", value[len(_SUFFIX) :]
            else:
                raise InvalidFilter(f"{name}: unknown string modifier in {value!r}")

    def matches(self, actual: Value) -> bool:
        expected = self.value
        if expected is None:
            return True
        if actual is None:
            return False
        if isinstance(expected, str):
            if not isinstance(actual, str):
                return False
            if self.kind == "prefix":
                return actual.startswith(expected)
            if self.kind == "suffix":
                return actual.endswith(expected)
            return actual == expected
        if is_number(expected):
            return is_number(actual) and expected == actual
        return type(expected) is type(actual) and expected == actual


def _entries(name: str, entries: Mapping[str, Value]) -> list[tuple[str, _Reference]]:
    if not entries or len(entries) > MAX_FILTER_FIELDS:
        raise InvalidFilter(f"{name}: expected 1 to {MAX_FILTER_FIELDS} entries")
    return [(key, _Reference(name, value)) for key, value in entries.items()]


class PropertiesFilter:
    """A consumer's property and application-property filters, applied together."""

    __slots__ = ("_parts", "_views", "application_properties", "properties")

    def __init__(
        self,
        views: ViewCache,
        properties: Mapping[str, Value] | None = None,
        application_properties: Mapping[str, Value] | None = None,
    ) -> None:
        self._views = views
        self.properties: list[tuple[int, _Reference]] = []
        self._parts = 0
        if properties is not None:
            for key, reference in _entries(PROPERTIES_NAME, properties):
                if key not in PROPERTY_FIELDS:
                    raise InvalidFilter(f"{PROPERTIES_NAME}: unknown property field '{key}'")
                self.properties.append((PROPERTY_FIELDS.index(key), reference))
            self._parts |= PROPERTIES_PART
        self.application_properties: list[tuple[str, _Reference]] = []
        if application_properties is not None:
            self.application_properties = _entries(
                APPLICATION_PROPERTIES_NAME, application_properties
            )
            self._parts |= APPLICATION_PART

    def __call__(self, message: Message) -> bool:
        """True when the message matches every entry."""
        view = self._views.view(message, self._parts)
        if view.malformed:
            return False
        fields = view.properties
        for index, reference in self.properties:
            if not reference.matches(fields[index] if index < len(fields) else None):
                return False
        application = view.application
        for key, reference in self.application_properties:
            if key not in application or not reference.matches(application[key]):
                return False
        return True
