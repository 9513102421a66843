"""The AMQP 1.0 value codec: round trips, proton interop, and hostile bytes.

A broker decodes bytes its publishers chose, so the one exception the codec may raise on bad
input is ``DecodeError`` (which carries ``amqp:decode-error``); anything else would escape the
queue layer as an internal error.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import proton
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.wire.amqp_types import (
    Byte,
    Described,
    Encoded,
    Float32,
    Int,
    Short,
    Symbol,
    Timestamp,
    UInt,
    ULong,
    Utf8Array,
    Value,
)
from sluicegate.wire.decoding import decode, scalar_map, skip
from sluicegate.wire.encoding import encode, encode_ubyte, encode_uint, encode_value
from sluicegate.wire.errors import DecodeError, EncodeError

# -- strategies ----------------------------------------------------------------------------

scalars: st.SearchStrategy[Value] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text(max_size=300),
    st.builds(Symbol, st.text(alphabet="abcdefghijklmnopqrstuvwxyz:-.", max_size=40)),
    st.builds(Timestamp, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.binary(max_size=20),
    st.binary(min_size=250, max_size=300),
    st.builds(
        lambda code, raw: Encoded(bytes((code,)) + raw[: {0x74: 4, 0x84: 8, 0x94: 16}[code]]),
        st.sampled_from([0x74, 0x84, 0x94]),
        st.binary(min_size=16, max_size=16),
    ),
)
# Map keys: any scalar (compounds are refused as keys by the decoder).
keys: st.SearchStrategy[Value] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.text(max_size=10),
    st.builds(Symbol, st.text(max_size=10)),
    st.binary(max_size=10),
)


def _extend(children: st.SearchStrategy[Value]) -> st.SearchStrategy[Value]:
    return st.one_of(
        st.lists(children, max_size=6),
        st.lists(st.none(), min_size=256, max_size=260),
        st.dictionaries(keys, children, max_size=5),
        st.builds(
            Described,
            st.one_of(st.builds(Symbol, st.text(max_size=8)), st.integers(0, 2**64 - 1)),
            children,
        ),
    )


values: st.SearchStrategy[Value] = st.recursive(scalars, _extend, max_leaves=20)


def shape(value: Value) -> object:
    """A comparable form that keeps AMQP types apart (str vs symbol, int vs timestamp, NaN)."""
    if value is None or isinstance(value, bool):
        return ("scalar", value)
    if isinstance(value, Timestamp):
        return ("timestamp", int(value))
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", struct.pack(">d", value))
    if isinstance(value, Symbol):
        return ("symbol", str(value))
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, bytes):
        return ("bytes", value)
    if isinstance(value, list):
        return ("list", tuple(shape(v) for v in value))
    if isinstance(value, dict):
        return ("map", tuple((shape(k), shape(v)) for k, v in value.items()))
    if isinstance(value, Encoded):
        return ("encoded", value.raw)
    return ("described", shape(value.descriptor), shape(value.value))


# -- round trips ---------------------------------------------------------------------------


@given(values)
def test_round_trip(value: Value) -> None:
    raw = encode(value)
    decoded, end = decode(raw, 0)
    assert end == len(raw)
    assert shape(decoded) == shape(value)
    assert encode(decoded) == raw


@given(values, st.binary(max_size=8), st.binary(max_size=8))
def test_decode_and_skip_at_an_offset_stop_at_the_value_end(
    value: Value, before: bytes, after: bytes
) -> None:
    raw = encode(value)
    buf = before + raw + after
    decoded, end = decode(buf, len(before))
    assert end == len(before) + len(raw)
    assert shape(decoded) == shape(value)
    assert skip(buf, len(before)) == end
    assert decode(memoryview(buf), len(before))[1] == end


@given(st.lists(values, max_size=5))
def test_skip_walks_a_sequence_of_values(items: list[Value]) -> None:
    raw = b"".join(encode(v) for v in items)
    pos = 0
    for item in items:
        nxt = skip(raw, pos)
        assert shape(decode(raw, pos)[0]) == shape(item)
        pos = nxt
    assert pos == len(raw)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, b"\x40"),
        (True, b"\x41"),
        (False, b"\x42"),
        (0, b"\x44"),
        (1, b"\x53\x01"),
        (255, b"\x53\xff"),
        (256, b"\x80" + (256).to_bytes(8, "big")),
        (-1, b"\x55\xff"),
        (-128, b"\x55\x80"),
        (-129, b"\x81" + (-129).to_bytes(8, "big", signed=True)),
        ("", b"\xa1\x00"),
        ("é", b"\xa1\x02\xc3\xa9"),
        (Symbol("ab"), b"\xa3\x02ab"),
        (b"\x00\x01", b"\xa0\x02\x00\x01"),
        (b"x" * 256, b"\xb0\x00\x00\x01\x00" + b"x" * 256),
        ([], b"\xc0\x01\x00"),
        ([True], b"\xc0\x02\x01\x41"),
        ({}, b"\xc1\x01\x00"),
        ({"a": 1}, b"\xc1\x06\x02\xa1\x01a\x53\x01"),
        (Described(Symbol("x"), None), b"\x00\xa3\x01x\x40"),
        (Timestamp(1), b"\x83" + (1).to_bytes(8, "big")),
    ],
)
def test_encode_picks_the_smallest_constructor(value: Value, expected: bytes) -> None:
    assert encode(value) == expected
    assert shape(decode(expected, 0)[0]) == shape(value)


def test_large_list_uses_list32() -> None:
    raw = encode([None] * 300)
    assert raw[0] == 0xD0
    assert struct.unpack(">II", raw[1:9]) == (300 + 4, 300)
    assert decode(raw, 0) == ([None] * 300, len(raw))


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, b"\x43"), (1, b"\x52\x01"), (255, b"\x52\xff"), (256, b"\x70\x00\x00\x01\x00")],
)
def test_encode_uint(value: int, expected: bytes) -> None:
    assert encode_uint(value) == expected
    assert decode(expected, 0) == (value, len(expected))


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_uint_round_trip(value: int) -> None:
    raw = encode_uint(value)
    assert decode(raw, 0) == (value, len(raw))


@given(st.integers(min_value=0, max_value=255))
def test_ubyte_round_trip(value: int) -> None:
    assert decode(encode_ubyte(value), 0) == (value, 2)


# -- proton's encodings --------------------------------------------------------------------


def _proton_bytes(put: str, *args: object) -> bytes:
    data = proton.Data()
    getattr(data, put)(*args)
    raw: bytes = data.encode()
    return raw


@pytest.mark.parametrize(
    ("put", "arg", "expected"),
    [
        ("put_null", None, None),
        ("put_bool", True, True),
        ("put_bool", False, False),
        ("put_ubyte", 200, 200),
        ("put_byte", -5, -5),
        ("put_ushort", 60000, 60000),
        ("put_short", -300, -300),
        ("put_uint", 0, 0),
        ("put_uint", 7, 7),
        ("put_uint", 4_000_000_000, 4_000_000_000),
        ("put_int", -7, -7),
        ("put_int", -2_000_000_000, -2_000_000_000),
        ("put_ulong", 0, 0),
        ("put_ulong", 2**64 - 1, 2**64 - 1),
        ("put_long", -(2**63), -(2**63)),
        ("put_long", 100, 100),
        ("put_double", 1.5, 1.5),
        ("put_float", 0.25, 0.25),
        ("put_timestamp", 1_700_000_000_000, Timestamp(1_700_000_000_000)),
        ("put_string", "héllo", "héllo"),
        ("put_string", "x" * 300, "x" * 300),
        ("put_symbol", "amqp:accepted:list", Symbol("amqp:accepted:list")),
        ("put_binary", b"\x00\xff", b"\x00\xff"),
        ("put_binary", b"y" * 1000, b"y" * 1000),
        ("put_char", "x", ord("x")),
    ],
)
def test_decode_proton_scalars(put: str, arg: object, expected: Value) -> None:
    raw = _proton_bytes(put) if arg is None else _proton_bytes(put, arg)
    value, end = decode(raw, 0)
    assert end == len(raw) == skip(raw, 0)
    assert shape(value) == shape(expected)


def test_decode_proton_uuid() -> None:
    import uuid

    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    raw = _proton_bytes("put_uuid", u)
    assert decode(raw, 0) == (u.bytes, len(raw))


def test_decode_proton_compounds() -> None:
    data = proton.Data()
    data.put_list()
    data.enter()
    data.put_int(1)
    data.put_string("two")
    data.put_map()
    data.enter()
    data.put_symbol("k")
    data.put_array(False, proton.Data.INT)
    data.enter()
    for i in (1, 2, 3):
        data.put_int(i)
    data.exit()
    data.exit()
    data.put_described()
    data.enter()
    data.put_ulong(0x70)
    data.put_list()
    data.exit()
    data.exit()
    raw = data.encode()
    value, end = decode(raw, 0)
    assert end == len(raw) == skip(raw, 0)
    assert shape(value) == shape([1, "two", {Symbol("k"): [1, 2, 3]}, Described(0x70, [])])


def test_decode_proton_arrays() -> None:
    data = proton.Data()
    data.put_array(False, proton.Data.SYMBOL)
    data.enter()
    data.put_symbol("a")
    data.put_symbol("bc")
    data.exit()
    raw = data.encode()
    assert shape(decode(raw, 0)[0]) == shape([Symbol("a"), Symbol("bc")])

    described = proton.Data()
    described.put_array(True, proton.Data.STRING)
    described.enter()
    described.put_symbol("desc")
    described.put_string("x")
    described.put_string("y")
    described.exit()
    raw = described.encode()
    value, end = decode(raw, 0)
    assert end == len(raw)
    assert shape(value) == shape([Described(Symbol("desc"), "x"), Described(Symbol("desc"), "y")])

    empty = proton.Data()
    empty.put_array(False, proton.Data.INT)
    raw = empty.encode()
    assert decode(raw, 0) == ([], len(raw))


@given(values)
def test_proton_decodes_what_we_encode(value: Value) -> None:
    """Our encoding is valid AMQP: proton reads it back to the same number of bytes."""
    raw = encode(value)
    data = proton.Data()
    assert data.decode(raw) == len(raw)


# -- hostile and truncated input -----------------------------------------------------------


def _only_decode_errors(buf: bytes, pos: int = 0) -> None:
    try:
        _, end = decode(buf, pos)
    except DecodeError:
        pass
    else:
        assert pos < end <= len(buf)
    try:
        end = skip(buf, pos)
    except DecodeError:
        pass
    else:
        assert pos < end <= len(buf)


# At most 400 bytes: deeper nesting than that is covered by the explicit tests below.
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_decode_error(buf: bytes) -> None:
    _only_decode_errors(buf)


@given(st.binary(min_size=1, max_size=200), st.data())
def test_random_bytes_at_any_offset(buf: bytes, data: st.DataObject) -> None:
    pos = data.draw(st.integers(min_value=0, max_value=len(buf)))
    _only_decode_errors(buf, pos)


# Byte strings that look like AMQP: constructors followed by plausible sizes and payloads.
_CONSTRUCTORS = (
    "00 40 41 42 43 44 45 50 52 53 55 56 60 70 71 72 73 74 80 81 82 83 84 94 98 a0 a1 a3"
)
constructors = st.sampled_from(
    list(bytes.fromhex(_CONSTRUCTORS + " b0 b1 b3 c0 c1 d0 d1 e0 f0 01 30 ff"))
)
amqp_like = st.lists(
    st.one_of(constructors.map(lambda c: bytes([c])), st.binary(min_size=1, max_size=4)),
    max_size=60,
).map(b"".join)


@given(amqp_like)
def test_amqp_like_bytes_raise_only_decode_error(buf: bytes) -> None:
    _only_decode_errors(buf)


@given(values, st.data())
def test_truncated_value_raises_decode_error(value: Value, data: st.DataObject) -> None:
    raw = encode(value)
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    with pytest.raises(DecodeError):
        decode(raw[:cut], 0)
    with pytest.raises(DecodeError):
        skip(raw[:cut], 0)


@given(values, st.data())
def test_corrupted_value_raises_only_decode_error(value: Value, data: st.DataObject) -> None:
    raw = bytearray(encode(value))
    index = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    raw[index] = data.draw(st.integers(min_value=0, max_value=255))
    _only_decode_errors(bytes(raw))


@pytest.mark.parametrize(
    "buf",
    [
        b"",
        b"\x00",
        b"\x00\x53",
        b"\x53",
        b"\x70\x00\x00",
        b"\xa1\x05abc",
        b"\xb1\x00\x00\x00",
        b"\xb1\xff\xff\xff\xffx",
        b"\xc0\x01",
        b"\xc0\x01\x02",  # two items promised, none present
        b"\xc0\x02\x02\x41",  # two items promised, one present
        b"\xd0\x00\x00\x00\x04\x00\x00\x00\x02",
        b"\xc1\x02\x01\x41",  # a map with an odd number of items
        b"\xc1\x04\x02\xc0\x01\x00\x41",  # a map whose key is a list
        b"\xe0\x02\x03\x53",  # an array promising 3 smallulongs holding none
        b"\xe0\x01\x01",  # an array without its element constructor
        b"\xa1\x02\xc3\x28",  # invalid UTF-8
        b"\xa3\x01\xff",
        b"\x01",  # unknown constructors
        b"\x30",
        b"\xff",
    ],
)
def test_malformed_values_raise_decode_error(buf: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(buf, 0)


@pytest.mark.parametrize(
    "raw",
    [b"\x74\x00\x00\x00\x05", b"\x84" + bytes(range(8)), b"\x94" + bytes(range(16))],
    ids=["decimal32", "decimal64", "decimal128"],
)
def test_decimals_keep_their_exact_encoding(raw: bytes) -> None:
    """Decimals are carried, not interpreted: in a map, a list or an array they re-encode to
    the bytes they came as, so rewriting a section around them changes nothing of theirs."""
    assert decode(raw, 0) == (Encoded(raw), len(raw))
    as_map = encode({"d": Encoded(raw)})
    assert decode(as_map, 0)[0] == {"d": Encoded(raw)}
    assert encode(decode(as_map, 0)[0]) == as_map
    array = b"\xe0" + bytes((1 + 1 + 2 * (len(raw) - 1), 2)) + raw[:1] + raw[1:] + raw[1:]
    assert decode(array, 0)[0] == [Encoded(raw), Encoded(raw)]


def test_skip_does_not_need_to_understand_fixed_width_payloads() -> None:
    """skip goes by width: a decimal32 is skipped whole without being decoded."""
    assert skip(b"\x74\x00\x00\x00\x05\x40", 0) == 5


@pytest.mark.parametrize("buf", [b"", b"\xa1", b"\xa1\x03ab", b"\xb0\x00\x00\x01", b"\x00\x53"])
def test_skip_never_runs_past_the_end(buf: bytes) -> None:
    with pytest.raises(DecodeError):
        skip(buf, 0)


def test_skip_at_the_end_raises() -> None:
    raw = encode("abc")
    with pytest.raises(DecodeError):
        skip(raw, len(raw))
    with pytest.raises(DecodeError):
        decode(raw, len(raw))


@pytest.mark.parametrize("function", ["decode", "skip"])
def test_deeply_described_input_raises_decode_error(function: str) -> None:
    buf = b"\x00" * 1200
    with pytest.raises(DecodeError):
        (decode if function == "decode" else skip)(buf, 0)


def test_deeply_nested_lists_raise_decode_error() -> None:
    buf = b"\xc0\xff\x01" * 600
    with pytest.raises(DecodeError):
        decode(buf, 0)


def test_an_array_count_of_billions_of_empty_elements_raises_decode_error() -> None:
    """An array of nulls costs no bytes per element: its count alone must not be trusted."""
    buf = b"\xf0" + struct.pack(">I", 5) + struct.pack(">I", 0xFFFFFFFF) + b"\x40"
    with pytest.raises(DecodeError):
        decode(buf, 0)


def test_an_array_of_a_few_empty_elements_decodes() -> None:
    buf = b"\xe0\x02\x03\x41"
    assert decode(buf, 0) == ([True, True, True], len(buf))


@pytest.mark.parametrize(
    "buf",
    [
        b"\xc0\x02\x01\xa1\x05hello",  # a list of size 2 whose item is 7 bytes long
        b"\xe0\x02\x02\x53\x01\x02",  # an array whose second element is past its size
    ],
)
def test_an_item_past_its_compound_raises_decode_error(buf: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(buf, 0)


def test_deep_but_valid_nesting_within_reason_decodes() -> None:
    value: Value = None
    for _ in range(50):
        value = [value]
    raw = encode(value)
    assert shape(decode(raw, 0)[0]) == shape(value)


def test_nan_and_signed_zero_round_trip_bit_exactly() -> None:
    for x in (math.nan, -0.0, math.inf, -math.inf):
        raw = encode(x)
        decoded = decode(raw, 0)[0]
        assert isinstance(decoded, float)
        assert struct.pack(">d", decoded) == struct.pack(">d", x)


@given(st.dictionaries(keys, scalars, max_size=8))
def test_a_map_of_scalars_is_checked_without_decoding(value: dict[Value, Value]) -> None:
    encoded = encode(value)
    # Long strings and binaries (a 4-byte size) are left to the decoder.
    assert scalar_map(encoded, 0, len(encoded)) == all(
        len(encode(item)) <= 2 + 255 and encode(item)[0] not in (0xB0, 0xB1, 0xB3)
        for pair in value.items()
        for item in pair
    )


@given(values)
def test_what_the_map_check_passes_decodes_as_a_map(value: Value) -> None:
    encoded = encode(value)
    if scalar_map(encoded, 0, len(encoded)):
        decoded, end = decode(encoded, 0)
        assert isinstance(decoded, dict)
        assert end == len(encoded)


@given(st.binary(max_size=40))
def test_the_map_check_passes_only_maps_that_decode(data: bytes) -> None:
    for prefix in (b"\xc1", b"\xd1"):
        candidate = prefix + data
        if scalar_map(candidate, 0, len(candidate)):
            assert isinstance(decode(candidate, 0)[0], dict)


def test_the_map_check_leaves_what_it_cannot_vouch_for_to_the_decoder() -> None:
    unchecked: list[Value] = [
        {"a": {"nested": 1}},
        {"a": [1]},
        {"a": "x" * 300},
        [1, 2],
        "not a map",
    ]
    for value in unchecked:
        encoded = encode(value)
        assert not scalar_map(encoded, 0, len(encoded))
    # A key that is an empty list, and a string that is not UTF-8.
    for encoded in (b"\xc1\x03\x02\x45\x40", b"\xc1\x05\x02\xa1\x01\xff\x40"):
        assert not scalar_map(encoded, 0, len(encoded))
        with pytest.raises(DecodeError):
            decode(encoded, 0)


# -- the wrappers: one AMQP type each, through both encoders ---------------------------------

_WRAPPED: list[tuple[object, type, object]] = [
    (Byte(-3), proton.byte, -3),
    (Short(-300), proton.short, -300),
    (Int(-70_000), proton.int32, -70_000),
    (UInt(70_000), proton.uint, 70_000),
    (UInt(0), proton.uint, 0),
    (ULong(2**40), proton.ulong, 2**40),
    (ULong(7), proton.ulong, 7),
    (Float32(1.5), proton.float32, 1.5),
    (Timestamp(1_700_000_000_123), proton.timestamp, 1_700_000_000_123),
    (Symbol("x-queue-type"), proton.symbol, "x-queue-type"),
]


def _proton_value(encoded: bytes) -> object:
    data = proton.Data()
    data.decode(encoded)
    return data.get_object()


@pytest.mark.parametrize(("value", "kind", "plain"), _WRAPPED)
def test_every_wrapper_is_written_as_its_amqp_type_by_both_encoders(
    value: object, kind: type, plain: object
) -> None:
    for encoded in (encode(value), encode_value(value)):  # type: ignore[arg-type]
        back = _proton_value(encoded)
        assert type(back) is kind
        assert back == plain


def test_a_plain_int_is_a_long_for_a_client_and_the_smallest_ulong_for_the_server() -> None:
    # The server's rewrites (logs, binding identities) keep their bytes; a client means a long.
    assert encode(5) == b"\x53\x05"
    assert encode_value(5) == b"\x55\x05"
    assert type(_proton_value(encode_value(2**40))) is int
    assert type(_proton_value(encode(2**40))) is proton.ulong
    assert encode_value(2**64 - 1) == b"\x80" + b"\xff" * 8
    with pytest.raises(EncodeError):
        encode_value(2**64)


def test_a_utf8_array_is_an_array_of_strings_each_str32() -> None:
    back = _proton_value(encode_value(Utf8Array(["node-a", "node-b"])))
    assert isinstance(back, proton.Array)
    assert back.type == proton.Data.STRING
    assert list(back.elements) == ["node-a", "node-b"]
    assert encode_value(Utf8Array(["n"])) == b"\xe0\x07\x01\xb1\x00\x00\x00\x01n"


def test_special_types_are_taken_first_at_every_depth() -> None:
    special: dict[type, Callable[[object], bytes]] = {
        bool: lambda value: b"\x56\x01" if value else b"\x56\x00"
    }
    assert encode_value({"durable": [True]}, special).endswith(b"\xc0\x03\x01\x56\x01")
    assert encode_value(True) == b"\x41"


def test_a_value_no_amqp_type_holds_is_an_encode_error() -> None:
    with pytest.raises(EncodeError, match="object"):
        encode_value(object())
