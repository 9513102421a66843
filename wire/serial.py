"""RFC-1982 serial number arithmetic on AMQP's 32-bit sequence numbers (AMQP 1.0 §2.6.7).

Delivery counts wrap around at 2**32; comparing them with plain integers breaks at the wrap,
which a drain with credit 2,000,000,000 reaches quickly.
"""

from __future__ import annotations

from typing import Final

SERIAL_MASK: Final = 0xFFFFFFFF
# Half the serial space: a difference at or beyond it is negative (RFC 1982 §3.2).
_HALF: Final = 1 << 31
_MODULUS: Final = 1 << 32


def serial_add(a: int, b: int) -> int:
    """Return ``a + b`` in 32-bit serial space."""
    return (a + b) & SERIAL_MASK


def serial_diff(a: int, b: int) -> int:
    """Return the signed distance ``a - b`` in 32-bit serial space."""
    d = (a - b) & SERIAL_MASK
    return d - _MODULUS if d >= _HALF else d


def link_credit_snd(delivery_count_rcv: int, link_credit_rcv: int, delivery_count_snd: int) -> int:
    """Credit the sender may use, from the receiver's FLOW and the sender's delivery-count.

    AMQP 1.0 §2.6.7: ``link-credit(snd) = delivery-count(rcv) + link-credit(rcv)
    - delivery-count(snd)``.
    The floor of 0 covers a receiver that lowered its credit while deliveries were in flight.
    The counts are close serial numbers, but link-credit is a uint that may reach 2**32 - 1:
    it is added as a plain integer, since serial arithmetic would read a grant of 2**31 or
    more as a distance backwards.
    """
    return max(0, link_credit_rcv - serial_diff(delivery_count_snd, delivery_count_rcv))
