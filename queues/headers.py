"""The headers exchange's rules: what a binding's arguments ask of a message, and its headers.

RabbitMQ 4 routes an AMQP 1.0 message through a headers exchange by its application-properties
(string keys) and its message annotations (symbol keys, which win a clash), keeping only simple
values (strings, binaries, numbers, booleans, null). A binding's ``x-match`` says how its other
arguments must match: ``all`` (the default) or ``any`` of them, ignoring arguments whose names
start with ``x-``, or ``all-with-x`` / ``any-with-x`` that count them too. An argument whose
value is null (AMQP 0-9-1's void) asks only that the header be present; any other value must
equal the header's, type included, except that a string equals a binary of the same bytes
(RabbitMQ compares both as Erlang binaries). A binding with nothing to match matches every
message under ``all`` and none under ``any``.

Headers are read from the encoded message only when a headers exchange routes it: the sections
before them are skipped by width and the body is never reached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sluicegate.queues.errors import PreconditionFailed
from sluicegate.wire.amqp_types import Symbol, Value
from sluicegate.wire.decoding import decode, skip
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import APPLICATION_PROPERTIES, MESSAGE_ANNOTATIONS, iter_sections

X_MATCH: Final = "x-match"
_MATCH_KINDS: Final = {
    "all": (False, False),
    "any": (True, False),
    "all-with-x": (False, True),
    "any-with-x": (True, True),
}


class _Marker:
    """A value that stands for a rule, not for data."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


# A binding argument with a null value: the header need only be present.
PRESENT: Final = _Marker("PRESENT")
# A header whose value is null: present, equal to no value.
NULL: Final = _Marker("NULL")
# A binding argument whose value is no simple value (a list, a map): it matches no header.
UNMATCHABLE: Final = _Marker("UNMATCHABLE")

# A simple value as compared: a category and the value, so that True is not 1 and 1 is not 1.0.
Comparable = tuple[str, bool | int | float | bytes]
# A message's routing headers: name to comparable value, or NULL.
Headers = dict[str, Comparable | _Marker]


def comparable(value: object) -> Comparable | None:
    """The value as headers compare it, or None for a value that is not simple."""
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, int):
        return ("integer", int(value))
    if isinstance(value, float):
        return ("float", float(value))
    if isinstance(value, str):
        return ("binary", value.encode("utf-8"))
    if isinstance(value, bytes):
        return ("binary", value)
    return None


@dataclass(frozen=True, slots=True)
class HeadersMatch:
    """One binding's compiled arguments: the headers it asks for and whether any one will do."""

    any: bool
    # Each header asked for and its comparable value, PRESENT or UNMATCHABLE.
    wanted: tuple[tuple[str, Comparable | _Marker], ...]

    def matches(self, headers: Mapping[str, Comparable | _Marker]) -> bool:
        """Whether a message with ``headers`` goes through this binding."""
        if self.any:
            for name, value in self.wanted:
                found = headers.get(name)
                if found is not None and (value is PRESENT or found == value):
                    return True
            return False
        for name, value in self.wanted:
            found = headers.get(name)
            if found is None or (value is not PRESENT and found != value):
                return False
        return True


def headers_match(arguments: Mapping[str, object]) -> HeadersMatch:
    """Compile a headers binding's arguments; refuse an ``x-match`` RabbitMQ refuses."""
    kind = arguments.get(X_MATCH, "all")
    if not isinstance(kind, str):
        raise PreconditionFailed(
            f"Invalid x-match field type {type(kind).__name__} (value {kind!r}); expected a string"
        )
    if kind not in _MATCH_KINDS:
        raise PreconditionFailed(
            f"Invalid x-match field value {kind!r}; expected all, any, all-with-x, or any-with-x"
        )
    any_of, with_x = _MATCH_KINDS[kind]
    wanted: list[tuple[str, Comparable | _Marker]] = []
    for name, value in sorted(arguments.items()):
        if name == X_MATCH or (name.startswith("x-") and not with_x):
            continue
        if value is None:
            wanted.append((name, PRESENT))
        else:
            simple = comparable(value)
            wanted.append((name, UNMATCHABLE if simple is None else simple))
    return HeadersMatch(any_of, tuple(wanted))


def routing_headers(payload: bytes | memoryview) -> Headers:
    """A message's headers as a headers exchange sees them, read without touching the body."""
    annotations: Headers = {}
    properties: Headers = {}
    for code, _, value_at, end in iter_sections(payload):
        if code == MESSAGE_ANNOTATIONS:
            _simple_entries(payload, value_at, end, annotations, symbol_keys=True)
        elif code == APPLICATION_PROPERTIES:
            _simple_entries(payload, value_at, end, properties, symbol_keys=False)
            break
    properties.update(annotations)
    return properties


def _simple_entries(
    payload: bytes | memoryview, pos: int, end: int, into: Headers, *, symbol_keys: bool
) -> None:
    """Add the simple values of the map at ``pos`` (up to ``end``) to ``into``, by string key
    (``symbol_keys``: by symbol key).

    Values are decoded one by one, so a value this codec does not read (a decimal, say) is
    skipped by its width like any other value that is not simple, rather than refusing the
    message.
    """
    code = payload[pos]
    if code == 0x40:
        return
    if code == 0xC1:
        item = pos + 3
    elif code == 0xD1:
        item = pos + 9
    else:
        raise DecodeError("a message annotations or application-properties section is not a map")
    if item > end:
        raise DecodeError("a map's count runs past its size")
    count = payload[pos + 2] if code == 0xC1 else int.from_bytes(payload[pos + 5 : item], "big")
    if count % 2:
        raise DecodeError("a map has an odd number of items")
    for _ in range(count // 2):
        key, item = decode(payload, item)
        value_end = skip(payload, item)
        if value_end > end:
            raise DecodeError("a map entry runs past the end of its section")
        if isinstance(key, str) and isinstance(key, Symbol) is symbol_keys:
            value = _value(payload, item)
            if value is not None:
                into[key] = value
        item = value_end


def _value(payload: bytes | memoryview, pos: int) -> Comparable | _Marker | None:
    """A header's value as compared, NULL for null, None when it is not simple."""
    code = payload[pos]
    if code == 0x40:
        return NULL
    if code >= 0xC0 or code == 0x00:
        return None
    try:
        value: Value
        value, _ = decode(payload, pos)
    except DecodeError:
        return None
    return comparable(value)
