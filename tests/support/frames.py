"""AMQP 1.0 frame codec for the raw test client: framing by hand, types by ``proton.Data``.

Kept apart from the client so that malformed-input tests can build frames (``encode_frame``,
``described``) without a connection.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from proton import Array, Data, Described, symbol, ulong

# proton's alias for "a Python value proton can encode"; it is not re-exported by ``proton``.
from proton._data import PythonAMQPData

__all__ = [
    "AMQP_FRAME",
    "AMQP_HEADER",
    "COMPOSITES",
    "FRAME_HEADER",
    "HEARTBEAT",
    "MIN_MAX_FRAME_SIZE",
    "SASL_FRAME",
    "SASL_HEADER",
    "AmqpError",
    "Composite",
    "Frame",
    "ProtocolError",
    "described",
    "encode",
    "encode_frame",
    "parse_frame",
    "symbol_map",
]

AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"  # §2.2: protocol id 0, version 1.0.0
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"  # §5.3.1: protocol id 3 (SASL), version 1.0.0
FRAME_HEADER: Final = struct.Struct(">IBBH")  # §2.3.1: size, doff, type, channel
AMQP_FRAME: Final = 0x00  # §2.3.2: frame type of AMQP performatives
SASL_FRAME: Final = 0x01  # §5.3.3: frame type of SASL frames
DOFF_WORDS: Final = 2  # we never send an extended header: the body follows the 8 header bytes
MIN_MAX_FRAME_SIZE: Final = 512  # §2.7.1 open: every peer must accept frames of 512 bytes
HEARTBEAT: Final = FRAME_HEADER.pack(FRAME_HEADER.size, DOFF_WORDS, AMQP_FRAME, 0)  # §2.4.5

# Descriptor code -> (name, field names in order), from AMQP 1.0 parts 2, 3 and 5.
COMPOSITES: Final[dict[int, tuple[str, tuple[str, ...]]]] = {
    code: (name, tuple(names.split()))
    for code, name, names in [
        (0x10, "open", "container_id hostname max_frame_size channel_max idle_time_out "
         "outgoing_locales incoming_locales offered_capabilities desired_capabilities properties"),
        (0x11, "begin", "remote_channel next_outgoing_id incoming_window outgoing_window "
         "handle_max offered_capabilities desired_capabilities properties"),
        (0x12, "attach", "name handle role snd_settle_mode rcv_settle_mode source target "
         "unsettled incomplete_unsettled initial_delivery_count max_message_size "
         "offered_capabilities desired_capabilities properties"),
        (0x13, "flow", "next_incoming_id incoming_window next_outgoing_id outgoing_window "
         "handle delivery_count link_credit available drain echo properties"),
        (0x14, "transfer", "handle delivery_id delivery_tag message_format settled more "
         "rcv_settle_mode state resume aborted batchable"),
        (0x15, "disposition", "role first last settled state batchable"),
        (0x16, "detach", "handle closed error"),
        (0x17, "end", "error"),
        (0x18, "close", "error"),
        (0x1D, "error", "condition description info"),
        (0x23, "received", "section_number section_offset"),
        (0x24, "accepted", ""),
        (0x25, "rejected", "error"),
        (0x26, "released", ""),
        (0x27, "modified", "delivery_failed undeliverable_here message_annotations"),
        (0x28, "source", "address durable expiry_policy timeout dynamic dynamic_node_properties "
         "distribution_mode filter default_outcome outcomes capabilities"),
        (0x29, "target", "address durable expiry_policy timeout dynamic dynamic_node_properties "
         "capabilities"),
        (0x40, "sasl_mechanisms", "sasl_server_mechanisms"),
        (0x41, "sasl_init", "mechanism initial_response hostname"),
        (0x42, "sasl_challenge", "challenge"),
        (0x43, "sasl_response", "response"),
        (0x44, "sasl_outcome", "code additional_data"),
    ]
}  # fmt: skip
_CODES: Final = {name: code for code, (name, _) in COMPOSITES.items()}
# §1.3 also allows symbolic descriptors such as "amqp:open:list".
_SYMBOLIC: Final = {f"amqp:{name.replace('_', '-')}:list": code for name, code in _CODES.items()}
_PERFORMATIVES: Final = frozenset(
    {"open", "begin", "attach", "flow", "transfer", "disposition", "detach", "end", "close"}
    | {"sasl_mechanisms", "sasl_init", "sasl_challenge", "sasl_response", "sasl_outcome"}
)


class ProtocolError(Exception):
    """The peer broke AMQP framing or the handshake, so nothing after it can be trusted."""


@dataclass(frozen=True)
class Composite:
    """A decoded described list (terminus, outcome, error), fields keyed by spec name."""

    name: str
    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


@dataclass(frozen=True)
class Frame:
    """One frame as read from the wire; ``payload`` holds the bytes after a TRANSFER.

    Field names are the spec's with ``_`` for ``-``; ``None`` means the peer omitted the field
    (its spec default applies), kept so tests can tell "absent" from "false".
    """

    channel: int
    performative: str
    fields: dict[str, Any]
    payload: bytes = b""

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


@dataclass(frozen=True)
class AmqpError:
    """An AMQP error (§2.8.14) to put in DETACH, END or CLOSE."""

    condition: str
    description: str | None = None
    info: Mapping[str, PythonAMQPData] | None = None

    def encode(self) -> Described:
        return described(
            "error",
            condition=symbol(self.condition),
            description=self.description,
            info=symbol_map(self.info),
        )


def described(kind: str, /, **values: PythonAMQPData) -> Described:
    """Build composite ``kind`` in field order, dropping trailing nulls as §1.4 allows."""
    code = _CODES[kind]
    names = COMPOSITES[code][1]
    unknown = set(values) - set(names)
    if unknown:
        raise TypeError(f"{kind} has no fields {sorted(unknown)}")
    fields: list[PythonAMQPData] = [values.get(n) for n in names]
    while fields and fields[-1] is None:
        fields.pop()
    return Described(ulong(code), fields)


def symbol_map(values: Mapping[str, PythonAMQPData] | None) -> PythonAMQPData:
    """A map with symbol keys (fields, filter-set), as the spec requires for those types."""
    if values is None:
        return None
    mapping: dict[PythonAMQPData, PythonAMQPData] = {symbol(k): v for k, v in values.items()}
    return mapping


def encode(value: PythonAMQPData) -> bytes:
    data = Data()
    data.put_object(value)
    return data.encode()


def encode_frame(
    channel: int, body: Described, payload: bytes = b"", frame_type: int = AMQP_FRAME
) -> bytes:
    """One whole frame: header, encoded performative, then any transfer payload."""
    encoded = encode(body) + payload
    header = FRAME_HEADER.pack(FRAME_HEADER.size + len(encoded), DOFF_WORDS, frame_type, channel)
    return header + encoded


def _decode_value(value: Any) -> Any:
    """Turn known described lists into Composites, recursively; keep other values as decoded."""
    if isinstance(value, Described):
        descriptor = value.descriptor
        code = _SYMBOLIC.get(descriptor) if isinstance(descriptor, symbol) else descriptor
        if isinstance(code, int) and code in COMPOSITES and isinstance(value.value, list):
            name, names = COMPOSITES[code]
            items = [_decode_value(v) for v in value.value]
            items += [None] * (len(names) - len(items))
            return Composite(name, dict(zip(names, items, strict=False)))
        return Described(descriptor, _decode_value(value.value))
    if isinstance(value, memoryview):  # proton's binary views its own buffer: copy it out
        return value.tobytes()
    if isinstance(value, Array):
        return [_decode_value(v) for v in value.elements]
    if isinstance(value, list):
        return [_decode_value(v) for v in value]
    if isinstance(value, dict):
        return {_decode_value(k): _decode_value(v) for k, v in value.items()}
    return value


def parse_frame(buffer: bytearray, max_frame_size: int) -> Frame | None:
    """Take the next non-empty frame off ``buffer``; None until one is complete.

    Empty frames are heartbeats (§2.4.5) and are dropped here.
    """
    while len(buffer) >= FRAME_HEADER.size:
        size, doff, _, channel = FRAME_HEADER.unpack_from(buffer)
        if size < FRAME_HEADER.size or doff < DOFF_WORDS or doff * 4 > size:
            raise ProtocolError(f"bad frame header: size {size}, doff {doff}")
        if size > max_frame_size:
            raise ProtocolError(f"{size}-byte frame exceeds our max-frame-size {max_frame_size}")
        if len(buffer) < size:
            return None
        body = bytes(buffer[doff * 4 : size])
        del buffer[:size]
        if body:
            data = Data()
            used = data.decode(body)
            data.rewind()
            data.next()
            performative = _decode_value(data.get_object())
            if not isinstance(performative, Composite) or performative.name not in _PERFORMATIVES:
                raise ProtocolError(f"frame body is not a performative: {performative!r}")
            return Frame(channel, performative.name, performative.fields, body[used:])
    return None
