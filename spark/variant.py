"""AMQP values as Spark variants and back: application properties that keep their types.

Spark (4.0 and later) has a ``variant`` type: a self-describing binary value that SQL reads with
``col:key::int`` and ``variant_get``. Its encoding is Parquet's variant specification: a
``metadata`` dictionary of the object keys and a ``value`` of typed primitives, objects and
arrays. A Python data source hands it to Spark as an Arrow struct of the two binaries, so the
connector builds them here, and the sink reads them back.

AMQP types map onto variant types as follows, and back for the sink: boolean; byte, short, int
and long as int8, int16, int32 and int64 (ubyte and ushort widen to the next signed type, uint
and ulong are int64s, a ulong beyond int64 a decimal); float and double; decimal32/64/128 as
decimals (at most 38 digits, beyond that a string); timestamp as a timestamp; string, symbol
and char as strings; binary as binary; uuid as its canonical string (Spark's readers do not
take variant uuids); list and array as arrays; map as an object (keys as strings); a described
value as its value. The sink writes a variant decimal as a decimal128 and a variant date as a
timestamp at midnight UTC.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Mapping
from decimal import Decimal
from functools import cache
from itertools import accumulate
from typing import Any, Final

import pyarrow as pa

from sluicegate.wire.amqp_types import (
    Byte,
    Described,
    Float32,
    Int,
    Short,
    Symbol,
    Timestamp,
    Value,
)

__all__ = ["VariantError", "decode_variant", "encode_object", "encode_string_objects"]

_PRIMITIVE: Final = 0
_SHORT_STRING: Final = 1
_OBJECT: Final = 2
_ARRAY: Final = 3
# Primitive type ids of the variant specification.
_NULL: Final = 0
_TRUE: Final = 1
_FALSE: Final = 2
_INT8: Final = 3
_INT16: Final = 4
_INT32: Final = 5
_INT64: Final = 6
_DOUBLE: Final = 7
_DECIMAL4: Final = 8
_DECIMAL8: Final = 9
_DECIMAL16: Final = 10
_DATE: Final = 11
_TIMESTAMP: Final = 12
_TIMESTAMP_NTZ: Final = 13
_FLOAT: Final = 14
_BINARY: Final = 15
_STRING: Final = 16
_UUID: Final = 20
_MAX_SHORT_STRING: Final = 63
# Variant decimals by width: type id, bytes, most digits (and most scale) each holds.
_DECIMAL_WIDTHS: Final = ((_DECIMAL4, 4, 9), (_DECIMAL8, 8, 18), (_DECIMAL16, 16, 38))
_VERSION: Final = 1
_SORTED_STRINGS: Final = 0x10
_I8 = struct.Struct("<b")
_I16 = struct.Struct("<h")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
# Layouts of objects by their keys in arrival order; application properties of one stream
# mostly share their keys, so this is a handful of entries. Bounded all the same.
_LAYOUT_CACHE_SIZE: Final = 1024


class VariantError(ValueError):
    """A variant that is malformed, or holds what AMQP cannot carry."""


def _primitive(type_id: int) -> bytes:
    return bytes(((type_id << 2) | _PRIMITIVE,))


_NULL_VALUE: Final = _primitive(_NULL)
_TRUE_VALUE: Final = _primitive(_TRUE)
_FALSE_VALUE: Final = _primitive(_FALSE)
_INT8_HEADER: Final = _primitive(_INT8)
_INT16_HEADER: Final = _primitive(_INT16)
_INT32_HEADER: Final = _primitive(_INT32)
_INT64_HEADER: Final = _primitive(_INT64)
_DOUBLE_HEADER: Final = _primitive(_DOUBLE)
_FLOAT_HEADER: Final = _primitive(_FLOAT)
_STRING_HEADER: Final = _primitive(_STRING)
_BINARY_HEADER: Final = _primitive(_BINARY)
_TIMESTAMP_HEADER: Final = _primitive(_TIMESTAMP)
# A short string's header holds its length: one per length, made once.
_SHORT_STRING_HEADERS: Final = tuple(
    bytes(((length << 2) | _SHORT_STRING,)) for length in range(_MAX_SHORT_STRING + 1)
)


def _int(value: int) -> bytes:
    """A long, uint or ulong: an int64, or a decimal beyond it."""
    if -(1 << 63) <= value < (1 << 63):
        return _INT64_HEADER + _I64.pack(value)
    return _decimal(Decimal(value))


def _string(value: str) -> bytes:
    raw = value.encode()
    if len(raw) <= _MAX_SHORT_STRING:
        return _SHORT_STRING_HEADERS[len(raw)] + raw
    return _STRING_HEADER + len(raw).to_bytes(4, "little") + raw


def _binary(value: bytes) -> bytes:
    return _BINARY_HEADER + len(value).to_bytes(4, "little") + value


def _decimal(value: Decimal) -> bytes:
    """The narrowest variant decimal holding ``value``; a string if none does."""
    if not value.is_finite():
        return _string(str(value))
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    unscaled = int(value.scaleb(scale))
    digits = len(str(abs(unscaled)))
    for type_id, width, precision in _DECIMAL_WIDTHS:
        if digits <= precision and scale <= precision:
            return (
                _primitive(type_id)
                + bytes((scale,))
                + unscaled.to_bytes(width, "little", signed=True)
            )
    return _string(str(value))


def encode_value(value: Any) -> bytes:
    """One AMQP value as a variant value (an object needs :func:`encode_object`'s metadata).

    The types application properties mostly hold come first.
    """
    kind = type(value)
    if kind is str or kind is Symbol:
        raw: bytes = value.encode()
        if len(raw) <= _MAX_SHORT_STRING:
            return _SHORT_STRING_HEADERS[len(raw)] + raw
        return _STRING_HEADER + len(raw).to_bytes(4, "little") + raw
    if kind is int:
        return _int(value)
    if kind is bool:
        return _TRUE_VALUE if value else _FALSE_VALUE
    if kind is float:
        return _DOUBLE_HEADER + _F64.pack(value)
    if value is None:
        return _NULL_VALUE
    if kind is Timestamp:
        return _TIMESTAMP_HEADER + _I64.pack(value * 1000)
    if kind is bytes:
        return _binary(value)
    if kind is Float32:
        return _FLOAT_HEADER + _F32.pack(value)
    if kind is Int:
        return _INT32_HEADER + _I32.pack(value)
    if kind is Short:
        return _INT16_HEADER + _I16.pack(value)
    if kind is Byte:
        return _INT8_HEADER + _I8.pack(value)
    if kind is Decimal:
        return _decimal(value)
    if kind is uuid.UUID:
        return _string(str(value))
    if kind is list:
        return _container(_ARRAY, b"", [encode_value(item) for item in value], 0)
    if kind is Described:
        return encode_value(value.value)
    if kind is dict:
        return _string(str(value))  # a map nested in a property: no metadata for its keys here
    if isinstance(value, int):
        return _int(value)
    raise VariantError(f"no variant type for {kind.__name__}")


def _size(largest: int) -> int:
    """Bytes of the smallest little-endian unsigned integer holding ``largest``."""
    return 1 if largest < 0x100 else 2 if largest < 0x1_0000 else 3 if largest < 0x100_0000 else 4


def _container(basic_type: int, ids: bytes, values: list[bytes], id_size: int) -> bytes:
    """An object (``ids`` encoded, in key order) or an array: header, ids, offsets, values."""
    count = len(values)
    ends = list(accumulate(map(len, values), initial=0))
    total = ends[-1]
    large = count > 0xFF
    if total < 0x100:
        offset_size = 1
        offsets = bytes(ends)
    else:
        offset_size = _size(total)
        offsets = b"".join(end.to_bytes(offset_size, "little") for end in ends)
    if basic_type == _OBJECT:
        flags = (large << 4) | ((id_size - 1) << 2) | (offset_size - 1)
    else:
        flags = (large << 2) | (offset_size - 1)
    header = bytes(((flags << 2) | basic_type,))
    count_bytes = count.to_bytes(4, "little") if large else bytes((count,))
    return b"".join((header, count_bytes, ids, offsets, *values))


class _Layout:
    """How an object with given keys is laid out: its metadata and the key order of its ids."""

    __slots__ = ("id_size", "ids", "metadata", "order", "small_prefix")

    def __init__(self, keys: tuple[str, ...]) -> None:
        names = sorted(set(keys))
        index = {name: i for i, name in enumerate(names)}
        raw = [name.encode() for name in names]
        ends = list(accumulate(map(len, raw), initial=0))
        offset_size = _size(max(ends[-1], len(names)))
        header = _VERSION | _SORTED_STRINGS | ((offset_size - 1) << 6)
        self.metadata = b"".join(
            (
                bytes((header,)),
                len(names).to_bytes(offset_size, "little"),
                *(end.to_bytes(offset_size, "little") for end in ends),
                *raw,
            )
        )
        # A key repeated in a map (possible in AMQP, not in a variant object) keeps its last value.
        last = {key: position for position, key in enumerate(keys)}
        self.order = sorted(last.values(), key=lambda position: keys[position])
        self.id_size = _size(max(len(names) - 1, 0))
        self.ids = b"".join(
            index[keys[position]].to_bytes(self.id_size, "little") for position in self.order
        )
        # Header, count and ids of the object when its values take under 256 bytes (one-byte
        # offsets), as most application properties do: built once, not per message.
        count = len(self.order)
        self.small_prefix = (
            bytes((((self.id_size - 1) << 4 | _OBJECT), count)) + self.ids
            if count <= 0xFF
            else None
        )


_layouts: dict[tuple[Any, ...], _Layout] = {}


def _layout(keys: tuple[Any, ...]) -> _Layout:
    layout = _layouts.get(keys)
    if layout is None:
        if len(_layouts) >= _LAYOUT_CACHE_SIZE:
            _layouts.clear()
        layout = _layouts[keys] = _Layout(tuple(k if type(k) is str else str(k) for k in keys))
    return layout


def encode_object(mapping: Mapping[Any, Any]) -> tuple[bytes, bytes]:
    """An AMQP map as a variant object: ``(value, metadata)``; keys become strings.

    A value that is itself a map is stored as its string form: a variant's keys all live in
    the top-level metadata, which this encoder builds for the outer keys only. Short strings,
    what application properties mostly hold, are encoded inline: this runs once per row.
    """
    layout = _layout(tuple(mapping))
    values = list(mapping.values())
    encoded: list[bytes] = []
    ends = [0]
    total = 0
    for position in layout.order:
        value = values[position]
        if type(value) is str:
            raw = value.encode()
            size = len(raw)
            if size <= _MAX_SHORT_STRING:
                encoded.append(_SHORT_STRING_HEADERS[size] + raw)
                total += size + 1
                ends.append(total)
                continue
        item = encode_value(value)
        encoded.append(item)
        total += len(item)
        ends.append(total)
    if total < 0x100 and layout.small_prefix is not None:
        return b"".join((layout.small_prefix, bytes(ends), *encoded)), layout.metadata
    return _container(_OBJECT, layout.ids, encoded, layout.id_size), layout.metadata


@cache
def _lookup_arrays() -> tuple[pa.Array, pa.Array]:
    """Every byte value as a one-byte binary, and every short string's header: Arrow takes them
    by index to build a column's headers and offsets.

    Built on first use, not at import: Arrow's first ``pa.array`` of Python objects imports
    pandas (~0.3 s), and the processes that only import this module (Spark's streaming runner
    and planner, which start each query) should not pay for it.
    """
    return (
        pa.array([bytes((value,)) for value in range(0x100)], pa.binary()),
        pa.array(_SHORT_STRING_HEADERS, pa.binary()),
    )


def encode_string_objects(
    keys: tuple[str, ...], strings: pa.Array
) -> tuple[pa.Array, bytes] | None:
    """Rows of the same string ``keys`` in that order whose values are all strings (``strings``
    holds them row after row), as variant values and their one metadata: what
    :func:`encode_object` makes of each row, built with a few Arrow calls per key instead of
    Python per row.

    The rows of one stream mostly look so. None when some row is not in the form built here
    (a string over 63 bytes, 256 bytes of values or more): the caller encodes rows one by one.
    """
    # Imported here, not with the module: the processes that start each query (Spark's
    # streaming runner and planner) import this module but never encode, and pyarrow.compute
    # takes ~0.1 s to import.
    import pyarrow.compute as pc

    layout = _layout(keys)
    if layout.small_prefix is None:
        return None
    table = pa.FixedSizeListArray.from_arrays(strings.cast(pa.binary()), len(keys))
    columns = [pc.list_element(table, position) for position in layout.order]
    lengths = [pc.binary_length(column) for column in columns]
    if max(pc.max(length).as_py() for length in lengths) > _MAX_SHORT_STRING:
        return None
    # Each value takes its header byte and its bytes; the offsets are where each one ends.
    ends = []
    end = None
    for length in lengths:
        end = pc.add(length, 1) if end is None else pc.add(pc.add(end, length), 1)
        ends.append(end)
    if pc.max(end).as_py() >= 0x100:
        return None
    byte_values, short_string_headers = _lookup_arrays()
    parts = [pa.scalar(layout.small_prefix + b"\x00", pa.binary())]
    parts.extend(byte_values.take(end) for end in ends)
    for column, length in zip(columns, lengths, strict=True):
        parts.append(short_string_headers.take(length))
        parts.append(column)
    return pc.binary_join_element_wise(*parts, b""), layout.metadata


# -- reading (the sink) ----------------------------------------------------------------------


def decode_variant(value: bytes, metadata: bytes) -> Value | Decimal | uuid.UUID:
    """A variant as AMQP-typed Python values (the sink encodes them with their types)."""
    try:
        keys = _metadata_keys(metadata)
        decoded: Value | Decimal | uuid.UUID = _decode(value, 0, keys)
        return decoded
    except (IndexError, struct.error, UnicodeDecodeError) as error:
        raise VariantError(f"a malformed variant: {error}") from None


def _metadata_keys(metadata: bytes) -> list[str]:
    header = metadata[0]
    if header & 0x0F != _VERSION:
        raise VariantError(f"variant metadata version {header & 0x0F}, expected {_VERSION}")
    size = (header >> 6) + 1
    count = int.from_bytes(metadata[1 : 1 + size], "little")
    base = 1 + size + (count + 1) * size
    offsets = [
        int.from_bytes(metadata[1 + size + i * size : 1 + size + (i + 1) * size], "little")
        for i in range(count + 1)
    ]
    return [metadata[base + offsets[i] : base + offsets[i + 1]].decode() for i in range(count)]


def _decode(value: bytes, pos: int, keys: list[str]) -> Any:
    header = value[pos]
    basic_type = header & 0x3
    info = header >> 2
    if basic_type == _SHORT_STRING:
        return value[pos + 1 : pos + 1 + info].decode()
    if basic_type in (_OBJECT, _ARRAY):
        large = (info >> (4 if basic_type == _OBJECT else 2)) & 1
        id_size = ((info >> 2) & 0x3) + 1 if basic_type == _OBJECT else 0
        offset_size = (info & 0x3) + 1
        count_size = 4 if large else 1
        count = int.from_bytes(value[pos + 1 : pos + 1 + count_size], "little")
        ids_at = pos + 1 + count_size
        offsets_at = ids_at + count * id_size
        values_at = offsets_at + (count + 1) * offset_size

        def offset(i: int) -> int:
            start = offsets_at + i * offset_size
            return int.from_bytes(value[start : start + offset_size], "little")

        items = [_decode(value, values_at + offset(i), keys) for i in range(count)]
        if basic_type == _ARRAY:
            return items
        ids = [
            int.from_bytes(value[ids_at + i * id_size : ids_at + (i + 1) * id_size], "little")
            for i in range(count)
        ]
        return {keys[i]: item for i, item in zip(ids, items, strict=True)}
    body = pos + 1
    if info == _NULL:
        return None
    if info == _TRUE:
        return True
    if info == _FALSE:
        return False
    if info == _INT8:
        return Byte(_I8.unpack_from(value, body)[0])
    if info == _INT16:
        return Short(_I16.unpack_from(value, body)[0])
    if info == _INT32:
        return Int(_I32.unpack_from(value, body)[0])
    if info == _INT64:
        return _I64.unpack_from(value, body)[0]
    if info == _DOUBLE:
        return _F64.unpack_from(value, body)[0]
    if info == _FLOAT:
        return Float32(_F32.unpack_from(value, body)[0])
    if info in (_DECIMAL4, _DECIMAL8, _DECIMAL16):
        width = {_DECIMAL4: 4, _DECIMAL8: 8, _DECIMAL16: 16}[info]
        unscaled = int.from_bytes(value[body + 1 : body + 1 + width], "little", signed=True)
        return Decimal(unscaled).scaleb(-value[body])
    if info in (_TIMESTAMP, _TIMESTAMP_NTZ):
        return Timestamp(_I64.unpack_from(value, body)[0] // 1000)
    if info == _DATE:
        days = _I32.unpack_from(value, body)[0]
        return Timestamp(days * 86_400_000)
    if info in (_BINARY, _STRING):
        length = int.from_bytes(value[body : body + 4], "little")
        raw = value[body + 4 : body + 4 + length]
        return raw.decode() if info == _STRING else bytes(raw)
    if info == _UUID:
        return uuid.UUID(bytes=bytes(value[body : body + 16]))
    raise VariantError(f"variant primitive type {info} has no AMQP equivalent")
