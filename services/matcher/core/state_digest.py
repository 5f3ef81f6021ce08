"""Stable digests for the incremental state hash (never Python's salted `hash`).

The state hash sums one 64-bit digest per order record in the dedup index
(mod 2^64), refreshed whenever a record changes, so hashing a state with
millions of resting orders costs O(symbols + shards). A record's digest is a
nonlinear finish of a linear form: a static part fixed at creation (its id
parts, submitted fields, arrival number and reject reason; names enter through
stable blake2b digests) plus its mutable fields. The arrival number pins its
place in its level's FIFO.
Constants are below 2^31 so the products stay small integers (cheap in CPython).
"""

from __future__ import annotations

import hashlib

from services.matcher.core.orders import OrderRecord, OrderSpec

MASK = (1 << 64) - 1
_S0, _S1, _S2, _S3, _S4, _S5, _S6, _S7, _S8 = (
    0x7A3B5C1D,
    0x5F4E3D2B,
    0x6C8B9A71,
    0x4D2E1F37,
    0x3B5A7C9F,
    0x2E4D6F81,
    0x71B3D5E7,
    0x51627385,
    0x6D7E8F91,
)
_M0, _M1, _M2, _M3, _M4, _M5, _M6 = (
    0x19283747,
    0x56473829,
    0x6B1C2D3F,
    0x4A5B6C7D,
    0x3F2E1D0B,
    0x7E6D5C4B,
    0x2B3C4D5F,
)
_FINISH = 0x589965CC75374CC3


def text_digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def static_digest(
    spec: OrderSpec, shard_digest: int, symbol_digest: int, arrival: int, reject_reason: int
) -> int:
    """The linear form of what never changes about an order once created."""
    return (
        shard_digest
        + symbol_digest
        + spec.user_id * _S0
        + spec.user_seq * _S1
        + spec.price_ticks * _S2
        + spec.quantity_lots * _S3
        + spec.quote_amount * _S4
        + spec.expire_at_ms * _S5
        + (
            spec.side
            + (spec.order_type << 8)
            + (spec.time_in_force << 16)
            + (spec.self_trade_prevention << 24)
        )
        * _S6
        + arrival * _S7
        + reject_reason * _S8
    ) & MASK


def order_digest(order: OrderRecord) -> int:
    value = (
        order.key_digest
        + order.status * _M0
        + order.remaining_lots * _M1
        + order.filled_lots * _M2
        + order.filled_notional * _M3
        + order.fees_paid * _M4
        + order.quote_spent * _M5
        + order.end_time_ms * _M6
    ) & MASK
    value = ((value ^ (value >> 32)) * _FINISH) & MASK
    return value ^ (value >> 29)
