"""Messages that repeat an earlier one's header, annotations or property keys read exactly as if
decoded alone.

``read_fields`` keeps the last message's leading bytes (header, message annotations up to a
stamped x-stream-offset), small annotation maps by their bytes and the last application
properties' keys; every sequence of messages, malformed ones included, must read as each message
does with those caches empty.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.spark import message_annotations, message_fields
from sluicegate.spark.field_columns import COLUMN_FIELDS, FieldColumns
from sluicegate.spark.message_encoding import encode_message
from sluicegate.spark.message_fields import MessageFields, read_fields
from sluicegate.wire.amqp_types import Described, Symbol, Timestamp
from sluicegate.wire.annotations import stamp_stream_offset
from sluicegate.wire.encoding import encode_value
from sluicegate.wire.errors import DecodeError
from sluicegate.wire.sections import MESSAGE_ANNOTATIONS, Header, encode_header, sections

_OFFSET_KEY = b"\xa3\x0fx-stream-offset"
# Past every section code: read_fields reads annotations wherever they are.
_EVERY_SECTION = 0x100


def _typed(value: Any) -> Any:
    """A decoded value with every type spelled out: a symbol and a string compare equal."""
    if isinstance(value, tuple):
        return tuple(_typed(item) for item in value)
    if isinstance(value, list):
        return [_typed(item) for item in value]
    if hasattr(value, "items"):
        return [(_typed(key), _typed(item)) for key, item in value.items()]
    if isinstance(value, Described):
        return ("described", _typed(value.descriptor), _typed(value.value))
    return (type(value).__name__, value)


def _read(payload: bytes) -> Any:
    try:
        return _typed(read_fields(payload))
    except DecodeError as error:
        return f"DecodeError: {error}"


def _forget() -> None:
    message_annotations._annotation_cache.clear()
    message_fields.REUSED.lead = None
    message_fields.REUSED.keys = message_fields.Keys((), ())


def _alone(payload: bytes) -> Any:
    """What ``payload`` reads as with nothing remembered of earlier messages."""
    _forget()
    return _read(payload)


_HEADERS = st.one_of(
    st.just(b""),
    st.builds(
        Header,
        durable=st.booleans(),
        priority=st.integers(0, 9),
        delivery_count=st.integers(0, 3),
        first_acquirer=st.booleans(),
    ).map(encode_header),
)
_ANNOTATION_VALUES = st.one_of(
    st.text(max_size=6),
    st.text(max_size=4).map(Symbol),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 3), max_size=2),  # mutable: never shared between messages
)
# Application property keys as publishers name them, a symbol now and then, one too long for a
# str8.
_PROPERTY_KEYS = st.lists(
    st.sampled_from(["", "a", "b", "region", "k" * 300])
    | st.text(max_size=3)
    | st.just("b").map(Symbol),
    max_size=4,
    unique=True,
)
_ANNOTATIONS = st.dictionaries(
    st.sampled_from(["x-exchange", "x-routing-key", "x-opt-a", "x-stream-offset"]).map(Symbol),
    _ANNOTATION_VALUES,
    max_size=3,
)


_LONGS = st.integers(-(2**63), 2**63 - 1)
# The annotations the gateway stores every message with (a queue's, and a stream's with the
# offset it stamps).
_ROUTED = {Symbol("x-exchange"): "", Symbol("x-routing-key"): "k"}
_PROPERTIES = st.one_of(
    st.fixed_dictionaries({"message_id": st.none() | st.text(max_size=5)}),
    st.fixed_dictionaries(
        {
            "message_id": st.none()
            | st.integers(0, 2**63 - 1)
            | st.uuids()
            | st.binary(max_size=4),
            "correlation_id": st.none() | st.text(max_size=4),
            "subject": st.none() | st.text(max_size=4),
            "content_type": st.none() | st.sampled_from(["application/json", "text/plain"]),
            "creation_time": st.none() | st.integers(0, 2**42).map(Timestamp),
        }
    ),
)
_EMPTY_DATA = b"\x00Su\xa0\x00"
# Short bodies, and long ones (a data section of more than 255 bytes has another constructor).
_DATA = (st.binary(max_size=8) | st.binary(min_size=256, max_size=300)).map(
    lambda body: b"\x00Su" + encode_value(body)
)
# A message's body as a sender may write it (§3.2): mostly one data section, short or long,
# else several, an amqp-value or amqp-sequence, none; and a footer now and then.
_BODIES = st.tuples(
    st.one_of(
        _DATA,
        _DATA,
        st.lists(_DATA, min_size=2, max_size=3).map(b"".join),
        (st.text(max_size=5) | _LONGS | st.lists(st.integers(0, 3), max_size=2)).map(
            lambda value: b"\x00Sw" + encode_value(value)
        ),
        st.lists(st.integers(0, 3), max_size=2).map(lambda items: b"\x00Sv" + encode_value(items)),
        st.just(b""),
    ),
    st.just(b"") | st.just(b"\x00Sx" + encode_value({Symbol("x-opt-f"): 1})),
).map(b"".join)


@st.composite
def _messages(draw: st.DrawFn) -> list[tuple[bytes, bool]]:
    """A few messages whose headers and annotations come from a small pool, as a queue's or
    stream's do, some stamped with an offset, some cut short or with a byte changed (each
    with whether it is whole). Half the time they are laid out alike, as a queue's or a
    stream's usually are: one header, the routing annotations (all stamped or none), one
    data section."""
    usual = draw(st.booleans())
    headers = draw(st.lists(_HEADERS, min_size=1, max_size=1 if usual else 2))
    stamps = st.just(draw(st.booleans())) if usual else st.booleans()
    annotations = draw(
        st.lists(
            st.just(_ROUTED) if usual else st.none() | st.just(_ROUTED) | _ANNOTATIONS,
            min_size=1,
            max_size=3,
        )
    )
    layouts = draw(st.lists(_PROPERTY_KEYS, min_size=1, max_size=2))
    messages = []
    for _ in range(draw(st.integers(3 if usual else 1, 8))):
        payload = draw(st.sampled_from(headers)) + encode_message(
            b"",
            durable=False,
            application_properties=draw(_properties(layouts)),
            message_annotations=draw(st.sampled_from(annotations)),
            **draw(_PROPERTIES),
        )
        payload = payload[: -len(_EMPTY_DATA)] + draw(_DATA if usual else _BODIES)
        if draw(stamps):
            payload = stamp_stream_offset(payload, draw(st.integers(0, 2**63 - 1)))[0]
        damage = draw(st.sampled_from(["none", "none", "cut", "flip"]))
        if damage == "cut":
            payload = payload[: draw(st.integers(0, len(payload)))]
        elif damage == "flip" and payload:
            at = draw(st.integers(0, len(payload) - 1))
            payload = payload[:at] + bytes((draw(st.integers(0, 255)),)) + payload[at + 1 :]
        messages.append((payload, damage == "none" or not payload))
    return messages


def _check_annotations(payload: bytes) -> None:
    """The annotations as the codec decodes their section, the offset and the others apart."""
    fields = read_fields(payload)
    found = [
        value
        for code, value, _, _ in sections(payload, until=_EVERY_SECTION)
        if code == MESSAGE_ANNOTATIONS
    ]
    annotations = found[-1] if found else None
    assert annotations is None or isinstance(annotations, dict)
    assert fields.message_annotations == annotations
    if not annotations or "x-stream-offset" not in annotations:
        assert (fields.stream_offset, fields.other_annotations) == (None, annotations)
        return
    offset = annotations["x-stream-offset"]
    assert fields.stream_offset == (offset if type(offset) is int else None)
    others = {k: v for k, v in annotations.items() if k != "x-stream-offset"}
    assert fields.other_annotations == (others or None)


@st.composite
def _properties(draw: st.DrawFn, layouts: list[list[str]]) -> dict[str, object] | None:
    """Properties with one of a few layouts' keys in their order, or the first of them."""
    keys = draw(st.sampled_from(layouts))
    if draw(st.booleans()):
        keys = keys[: draw(st.integers(0, len(keys)))]
    return {key: draw(_ANNOTATION_VALUES) for key in keys} or None


@given(_messages())
def test_a_sequence_of_messages_reads_as_each_message_alone(
    messages: list[tuple[bytes, bool]],
) -> None:
    expected = [_alone(payload) for payload, _ in messages]
    _forget()
    assert [_read(payload) for payload, _ in messages] == expected
    assert [_read(payload) for payload, _ in messages] == expected  # every cache warm
    for payload, whole in messages:
        if whole:
            _check_annotations(payload)


def test_the_offset_and_the_other_annotations_apart() -> None:
    payload = stamp_stream_offset(
        encode_message(b"", durable=True, message_annotations={Symbol("x-exchange"): "amq"}), 7
    )[0]
    for _ in range(2):  # decoded, then from the last message's lead
        fields = read_fields(payload)
        assert fields.stream_offset == 7
        assert fields.message_annotations == {"x-exchange": "amq", "x-stream-offset": 7}
        assert fields.other_annotations == {"x-exchange": "amq"}
    unstamped = read_fields(encode_message(b"", durable=True))
    assert (unstamped.stream_offset, unstamped.other_annotations) == (None, None)


def test_bytes_that_look_like_a_stamped_offset_inside_a_value_are_not_one() -> None:
    """x-opt-a, x-stream-offset 2, then x-opt-a again with a binary that ends in what a stamped
    offset looks like: the dict ends with x-stream-offset, which is 2 whatever those bytes say,
    and the map is never cached as a stamped one."""
    for offset in (5, 6):
        value = _OFFSET_KEY + b"\x81" + offset.to_bytes(8, "big")
        opt_a = b"\xa3\x07x-opt-a"
        entries = (
            (opt_a + b"\x55\x01" + _OFFSET_KEY + b"\x55\x02" + opt_a + b"\xa0")
            + bytes((len(value),))
            + value
        )
        section = b"\x00Sr\xc1" + bytes((len(entries) + 1, 6)) + entries
        fields = read_fields(section + b"\x00Su\xa0\x01b")
        assert fields.message_annotations == {"x-opt-a": value, "x-stream-offset": 2}
        assert list(fields.message_annotations or ())[-1] == "x-stream-offset"
        assert fields.stream_offset == 2


def test_a_message_cut_inside_the_offset_of_a_known_lead_is_a_decode_error() -> None:
    payload = stamp_stream_offset(encode_message(b"", durable=True), 7)[0]
    read_fields(payload)
    cut = payload[: payload.index(b"\x00Su") - 3]
    assert _read(cut) == _alone(cut)
    assert str(_read(cut)).startswith("DecodeError")


def test_a_property_key_sent_as_a_symbol_then_as_a_string_keeps_each_type() -> None:
    for key in (Symbol("b"), "b", Symbol("b"), "b"):
        payload = encode_message(b"", durable=False, application_properties={key: "v"})
        properties = read_fields(payload).application_properties
        assert properties == {"b": "v"}
        assert [type(name) for name in properties] == [type(key)]


# What every row has, whichever fields a reader of columns asks for.
_EVERY_ROW = ("offset", "delivery_count", "other_annotations")


def _expected(fields: MessageFields, names: set[str], offset: int | None) -> dict[str, Any]:
    """The row ``fields`` make for a reader that asks for ``names`` (an empty map as none)."""
    row = {name: getattr(fields, name) for name in (*names, *_EVERY_ROW[1:])}
    if "application_properties" in names:
        row["application_properties"] = fields.application_properties or None
    row["offset"] = offset
    return {name: _typed(value) for name, value in row.items()}


def _rows(columns: FieldColumns) -> list[dict[str, Any]]:
    """Each row of ``columns``, as :func:`_expected` spells one."""
    rows = []
    ends = columns.property_ends
    for row in range(len(columns)):
        asked = columns.fields - {"application_properties"}
        named = {name: getattr(columns, name)[row] for name in (*asked, *_EVERY_ROW)}
        if "application_properties" in columns.fields:
            start, end = ends[row], ends[row + 1]
            keys, values = columns.property_keys[start:end], columns.property_values[start:end]
            named["application_properties"] = dict(zip(keys, values, strict=True)) or None
        rows.append({name: _typed(value) for name, value in named.items()})
    return rows


@given(
    _messages(),
    st.sets(st.sampled_from(sorted(COLUMN_FIELDS))),
    st.booleans(),
    st.integers(0, 9),
)
def test_columns_hold_what_read_fields_gives_each_message_alone(
    messages: list[tuple[bytes, bool]], names: set[str], stream: bool, cut: int
) -> None:
    """Messages read into columns one after another hold, for each field asked for, what
    read_fields gives each message alone. A malformed message is a DecodeError, but for a
    broken section no column asks for (skipped unread) or a stream's message without an offset
    (skipped undecoded). Read in one call, whole messages make the same rows; the columns split
    at any row into the same rows."""
    alone: list[MessageFields | None] = []
    for payload, _ in messages:
        _forget()
        try:
            alone.append(read_fields(payload))
        except DecodeError:
            alone.append(None)
    _forget()
    columns = FieldColumns(names)
    expected: list[dict[str, Any]] = []
    for number, ((payload, _), fields) in enumerate(zip(messages, alone, strict=True)):
        rows = len(columns)
        try:
            if stream:
                found = columns.add_stream([payload], None)
            else:
                columns.add_numbered([payload], number)
        except DecodeError:
            assert fields is None
            continue
        if fields is None:
            assert names != COLUMN_FIELDS or (stream and found == [None])
            del expected[rows:]
            expected.extend(_rows(columns)[rows:])
            continue
        offset: int | None = number
        if stream:
            assert found == [fields.stream_offset]
            offset = fields.stream_offset
            if offset is None:
                assert len(columns) == rows
                continue
        expected.append(_expected(fields, names, offset))
        assert _rows(columns) == expected
    if all(whole for _, whole in messages):
        _forget()
        at_once = FieldColumns(names)
        payloads = [payload for payload, _ in messages]
        if stream:
            at_once.add_stream(payloads, None)
        else:
            at_once.add_numbered(payloads, 0)
        assert _rows(at_once) == expected
    head = columns.split(cut)
    assert _rows(head) + _rows(columns) == expected
    assert len(head) == min(cut, len(expected))
