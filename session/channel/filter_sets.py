"""A consumer's filter set as the bytes an :class:`~.frames.Attach` carries.

The set crosses as one AMQP list of plain values (queues/filters/filter_set.py's
:class:`FilterSet`), never as compiled filters: the owner compiles it as a local attach would.
Its size is the client's to choose, so the session's side refuses a set larger than
``max_size`` before it is sent (:func:`encode_filter_set`), and the owner reads it within a
frame the channel's reader already bounded; a set of the wrong shape is a broken peer.
"""

from __future__ import annotations

from typing import cast

from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.filters.filter_set import LANGUAGES, FilterSet, Language
from sluicegate.queues.queue_type import OffsetSpec
from sluicegate.session.channel.codec import ChannelError
from sluicegate.wire.amqp_types import Value
from sluicegate.wire.decoding import decode
from sluicegate.wire.encoding import encode as encode_value
from sluicegate.wire.errors import DecodeError

# The list's fields: offset kind and value, properties, application properties, expressions,
# stream filter values, match-unfiltered.
_FIELDS = 7
_OFFSET_KINDS = frozenset({"first", "last", "next", "offset", "timestamp"})


def encode_filter_set(filters: FilterSet, max_size: int) -> bytes:
    """The set's bytes; :class:`ResourceLimitExceeded` past ``max_size`` (a frame of the
    channel holds at most the largest message and its names: docs/workers.md)."""
    if filters.empty:
        return b""
    offset = filters.offset
    fields: list[Value] = [
        None if offset is None else offset.kind,
        None if offset is None else offset.value,
        cast(Value, filters.properties),
        cast(Value, filters.application),
        [[language, text] for language, text in filters.expressions],
        None if filters.values is None else list(filters.values),
        filters.match_unfiltered,
    ]
    data = encode_value(fields)
    if len(data) > max_size:
        raise ResourceLimitExceeded(
            f"a filter set of {len(data)} bytes cannot reach a queue of another worker "
            f"(at most {max_size})"
        )
    return data


def decode_filter_set(data: bytes) -> FilterSet:
    """The set an ATTACH frame carries; :class:`ChannelError` for anything but one."""
    if not data:
        return FilterSet()
    try:
        value, end = decode(data, 0)
    except (DecodeError, ValueError) as error:
        raise ChannelError(f"a filter set does not decode: {error}") from error
    if end != len(data) or not isinstance(value, list) or len(value) != _FIELDS:
        raise ChannelError("a filter set is not a list of its fields")
    kind, at, properties, application, expressions, values, unfiltered = value
    offset = None
    if kind is not None:
        if kind not in _OFFSET_KINDS or type(at) is not int:
            raise ChannelError("a filter set's offset is malformed")
        offset = OffsetSpec(str(kind), at)
    if not isinstance(expressions, list) or not isinstance(unfiltered, bool):
        raise ChannelError("a filter set's expressions are malformed")
    return FilterSet(
        offset,
        _map(properties),
        _map(application),
        tuple(_expression(item) for item in expressions),
        _strings(values),
        unfiltered,
    )


def _map(value: Value) -> dict[str, Value] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(type(key) is str for key in value):
        raise ChannelError("a filter set's property map is malformed")
    return cast(dict[str, Value], value)


def _expression(item: Value) -> tuple[Language, str]:
    if (
        not isinstance(item, list)
        or len(item) != 2
        or item[0] not in LANGUAGES
        or type(item[1]) is not str
    ):
        raise ChannelError("a filter set's expression is malformed")
    return cast(Language, item[0]), item[1]


def _strings(value: Value) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(item) is str for item in value):
        raise ChannelError("a filter set's stream filter values are malformed")
    return tuple(cast(list[str], value))
