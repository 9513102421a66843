"""AMQP's decimal32/64/128 (AMQP 1.0 §1.6.17-19) as Python's ``Decimal``, read and written.

IEEE 754-2008 decimals in the binary integer encoding. The server never interprets them (its
codec keeps their bytes, :class:`~sluicegate.wire.amqp_types.Encoded`); a client that reads
every field (the Spark connector) gives them as ``Decimal`` and writes a ``Decimal`` back as a
decimal128, the one width that holds any of them.
"""

from __future__ import annotations

from decimal import Context, Decimal
from typing import Final

from sluicegate.wire.errors import DecodeError, EncodeError

# By constructor: bytes, the exponent continuation's width w (the combination field has w + 5
# bits), the bias.
_DECIMALS: Final = {0x74: (4, 6, 101), 0x84: (8, 8, 398), 0x94: (16, 12, 6176)}
_DECIMAL128_BIAS: Final = 6176
_DECIMAL128_DIGITS: Final = 34


def read_decimal(buf: bytes, pos: int) -> tuple[Decimal, int]:
    """The decimal32/64/128 at ``pos`` (infinities and NaNs included) and where it ends."""
    width, w, bias = _DECIMALS[buf[pos]]
    end = pos + 1 + width
    if end > len(buf):
        raise DecodeError("a decimal runs past the end of the message")
    bits = int.from_bytes(buf[pos + 1 : end], "big")
    total = width * 8
    trailing_bits = total - 1 - (w + 5)
    sign = bits >> (total - 1)
    combination = (bits >> trailing_bits) & ((1 << (w + 5)) - 1)
    trailing = bits & ((1 << trailing_bits) - 1)
    if combination >> (w + 3) == 0b11:
        if (combination >> (w + 1)) & 0b11 == 0b11:
            special = "NaN" if (combination >> w) & 1 else "Infinity"
            return Decimal(("-" if sign else "") + special), end
        exponent = (combination >> 1) & ((1 << (w + 2)) - 1)
        coefficient = ((0b1000 | (combination & 1)) << trailing_bits) | trailing
    else:
        exponent = combination >> 3
        coefficient = ((combination & 0b111) << trailing_bits) | trailing
    digits = tuple(int(digit) for digit in str(coefficient))
    return Decimal((sign, digits, exponent - bias)), end


def decimal128(value: Decimal) -> bytes:
    """A decimal128 in the binary integer encoding (34 digits; beyond that, rounded)."""
    if not value.is_finite():
        special = 0x7C if value.is_nan() else 0x78
        return b"\x94" + bytes((special | (0x80 if value.is_signed() else 0),)) + bytes(15)
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    if len(digits) > _DECIMAL128_DIGITS:
        value = Context(prec=_DECIMAL128_DIGITS).plus(value)
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
    coefficient = int("".join(map(str, digits)) or "0")
    biased = exponent + _DECIMAL128_BIAS
    if not 0 <= biased < 3 * (1 << 12):
        raise EncodeError(f"decimal {value} is out of decimal128's range")
    # A coefficient of at most 34 digits is below 2**113: the combination field's first form.
    bits = (sign << 127) | (biased << 113) | coefficient
    return b"\x94" + bits.to_bytes(16, "big")
