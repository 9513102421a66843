"""The AMQP 1.0 types a Python value cannot tell apart on its own (AMQP 1.0 §1.6), one wrapper each.

A plain ``int`` could be any of eight integer types and a ``str`` a string or a symbol; a value
that must keep its AMQP type (a symbol key, a consumer count RabbitMQ's clients read as a uint, a
Spark column of 32-bit floats) is one of these, and :mod:`sluicegate.wire.encoding` writes each as
its type. Decoding gives them back where the reader keeps types (the Spark connector's reader).
"""

from __future__ import annotations

from typing import TypeAlias

# What decoding yields: AMQP scalars map to Python scalars, compounds to lists and dicts.
Value: TypeAlias = (
    "bool | int | float | str | bytes | list[Value] | dict[Value, Value] | Described | Encoded"
    " | None"
)


class Symbol(str):
    """An AMQP symbol: kept distinct from a string so that re-encoding keeps its type."""

    __slots__ = ()


class Timestamp(int):
    """An AMQP timestamp in milliseconds since the epoch."""

    __slots__ = ()


class Byte(int):
    """An AMQP byte (8-bit signed)."""

    __slots__ = ()


class Short(int):
    """An AMQP short (16-bit signed)."""

    __slots__ = ()


class Int(int):
    """An AMQP int (32-bit signed)."""

    __slots__ = ()


class UInt(int):
    """An AMQP uint (32-bit unsigned): RabbitMQ's consumer counts are uints."""

    __slots__ = ()


class ULong(int):
    """An AMQP ulong (64-bit unsigned): RabbitMQ's message counts are ulongs."""

    __slots__ = ()


class Float32(float):
    """An AMQP float (32 bits): kept apart from a double so that it is encoded back as one."""

    __slots__ = ()


class Utf8Array(list[str]):
    """An AMQP array of utf8 (§1.6.24), not a list of strings: RabbitMQ's queue replicas."""

    __slots__ = ()


class Described:
    """A described value whose descriptor this codec does not interpret."""

    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor: Value, value: Value) -> None:
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Described)
            and self.descriptor == other.descriptor
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((repr(self.descriptor), repr(self.value)))

    def __repr__(self) -> str:
        return f"Described({self.descriptor!r}, {self.value!r})"


class Encoded:
    """A value the server carries but never interprets, kept as its exact encoding.

    AMQP's decimal32/64/128 (IEEE 754 decimal floating point, §1.6.13-15) have no exact Python
    counterpart a broker needs; a message may still carry them in its properties or annotations,
    so they decode to their bytes and re-encode unchanged when a section is rewritten.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Encoded) and self.raw == other.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"Encoded({self.raw!r})"
