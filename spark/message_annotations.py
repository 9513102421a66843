"""Message annotations as the Spark connector reads them: decoded once for every message that
carries the same bytes (AMQP 1.0 §3.2.3).

A stream's or a queue's messages mostly carry the same annotations (the exchange and routing key
they came by, spliced in by the gateway) and a stream stamps each with its x-stream-offset; the
offset is taken apart and the rest decoded once, shared read-only by the messages that carry it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, NamedTuple

from sluicegate.spark.field_values import I64, Field, read_map
from sluicegate.wire.annotations import X_STREAM_OFFSET
from sluicegate.wire.decoding import skip
from sluicegate.wire.errors import DecodeError

# x-stream-offset as the only message annotation, as a stream stamps a message without others:
# a map8 of one entry, the symbol key and a long (its eight bytes follow).
_STREAM_OFFSET_ONLY: Final = b"\xc1\x1b\x02\xa3\x0fx-stream-offset\x81"
STREAM_OFFSET_KEY: Final = X_STREAM_OFFSET
# x-stream-offset as the last entry of a larger map, as a stream stamps it after x-exchange and
# x-routing-key: the symbol key and a long, whose eight bytes end the map.
_STREAM_OFFSET_ENTRY: Final = b"\xa3\x0fx-stream-offset\x81"
_STREAM_OFFSET_ENTRY_BYTES: Final = len(_STREAM_OFFSET_ENTRY) + 8
OFFSET_BYTES: Final = 8


class Known(NamedTuple):
    """Message annotations decoded once for every message that carries the same bytes: the
    entries to copy into each message's dict (all but a stamped x-stream-offset), and the
    read-only view those messages share as their ``other_annotations``."""

    entries: dict[Field, Field]
    view: Mapping[Field, Field] | None


# Small annotation maps by their encoded bytes, up to a stamped x-stream-offset: a stream's or
# a queue's messages mostly carry the same ones (the exchange and routing key they came by,
# spliced in by the gateway), so each is decoded once. A handful per queue; bounded all the
# same (emptied when full), and only maps of immutable values are kept.
_ANNOTATION_CACHE_SIZE: Final = 256
_annotation_cache: dict[bytes, Known] = {}
_IMMUTABLE: Final = (str, int, float, bool, bytes, type(None))


# Annotations that are a stamped x-stream-offset alone.
_OFFSET_ALONE: Final = Known({}, None)


def read_annotations(
    buf: bytes, pos: int
) -> tuple[dict[Field, Field] | None, Mapping[Field, Field] | None, int | None, Known | None, int]:
    """Message annotations, the others and the stream offset (see :class:`MessageFields`),
    what they share with other messages' if they are common ones, and where they end.

    A map8 whose bytes were seen before (up to a stamped offset: x-stream-offset, a long, as
    its last entry) comes from the cache.
    """
    offset: int | None
    if buf.startswith(_STREAM_OFFSET_ONLY, pos):
        offset = I64.unpack_from(buf, pos + 21)[0]
        return {STREAM_OFFSET_KEY: offset}, None, offset, _OFFSET_ALONE, pos + 29
    if buf[pos] == 0xC1:
        end = pos + 2 + buf[pos + 1]
        if end <= len(buf):
            tail = end - _STREAM_OFFSET_ENTRY_BYTES
            offset = None
            if tail > pos + 3 and buf.startswith(_STREAM_OFFSET_ENTRY, tail):
                offset = I64.unpack_from(buf, end - OFFSET_BYTES)[0]
                encoded = buf[pos:tail]
            else:
                encoded = buf[pos:end]
            known = _annotation_cache.get(encoded)
            if known is None:
                decoded, end = read_map(buf, pos, "message-annotations")
                assert decoded is not None
                shared = (
                    _unstamped(decoded) if offset is None else _stamped(buf, pos, tail, decoded)
                )
                if shared is None:
                    others, found = _split(decoded)
                    return decoded, others, found, None, end
                if len(_annotation_cache) >= _ANNOTATION_CACHE_SIZE:
                    _annotation_cache.clear()
                known = _annotation_cache[encoded] = shared
            annotations = known.entries.copy()
            if offset is not None:
                annotations[STREAM_OFFSET_KEY] = offset
            return annotations, known.view, offset, known, end
    general, end = read_map(buf, pos, "message-annotations")
    others, found = _split(general)
    return general, others, found, None, end


def _unstamped(decoded: dict[Field, Field]) -> Known | None:
    """Annotations without x-stream-offset, to share, if they are immutable."""
    if STREAM_OFFSET_KEY in decoded or not all(
        isinstance(value, _IMMUTABLE) for value in decoded.values()
    ):
        return None
    entries = dict(decoded)
    return Known(entries, MappingProxyType(entries))


def _stamped(buf: bytes, pos: int, tail: int, decoded: dict[Field, Field]) -> Known | None:
    """The entries of a small annotations map before its x-stream-offset, to share, if the
    offset is its last entry (starting at ``tail``, named nowhere before) and they are immutable.
    """
    if not decoded or next(reversed(decoded)) != STREAM_OFFSET_KEY:
        return None  # not named, or named twice (the first place is kept)
    item = pos + 3
    try:
        for _ in range(buf[pos + 2] - 2):
            item = skip(buf, item)
    except (DecodeError, IndexError):
        return None
    if item != tail:
        return None  # the bytes that look like the offset's entry belong to another value
    entries = dict(decoded)
    del entries[STREAM_OFFSET_KEY]
    if not all(isinstance(value, _IMMUTABLE) for value in entries.values()):
        return None
    return Known(entries, MappingProxyType(entries) if entries else None)


def _split(
    annotations: dict[Field, Field] | None,
) -> tuple[Mapping[Field, Field] | None, int | None]:
    """The annotations but x-stream-offset, and the offset if it is a long, uint or ulong."""
    if not annotations or STREAM_OFFSET_KEY not in annotations:
        return annotations, None
    found = annotations[STREAM_OFFSET_KEY]
    offset = found if type(found) is int else None
    if len(annotations) == 1:
        return None, offset
    return {k: v for k, v in annotations.items() if k != STREAM_OFFSET_KEY}, offset
