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
from typing import Final

from services.matcher.core.order_record import OrderRecord
from services.matcher.core.orders import CANCELLED, FILLED, OPEN, PARTIALLY_FILLED, OrderSpec

MASK = (1 << 64) - 1
# Weights of the static form (S_*) and of the mutable fields (M_*). The engine's hot
# paths inline `static_digest` and `order_digest` with these; keep them in step.
S_USER, S_SEQ, S_PRICE, S_QUANTITY, S_QUOTE, S_EXPIRE, S_FLAGS, S_ARRIVAL, S_REASON = (
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
M_STATUS, M_REMAINING, M_FILLED, M_NOTIONAL, M_FEES, M_SPENT, M_END = (
    0x19283747,
    0x56473829,
    0x6B1C2D3F,
    0x4A5B6C7D,
    0x3F2E1D0B,
    0x7E6D5C4B,
    0x2B3C4D5F,
)
FINISH = 0x589965CC75374CC3


# The status terms of `order_digest` for the statuses the hot paths set (they inline it).
OPEN_STATUS_DIGEST: Final[int] = OPEN * M_STATUS
PARTIAL_STATUS_DIGEST: Final[int] = PARTIALLY_FILLED * M_STATUS
FILLED_STATUS_DIGEST: Final[int] = FILLED * M_STATUS
CANCELLED_STATUS_DIGEST: Final[int] = CANCELLED * M_STATUS


def text_digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def static_digest(
    spec: OrderSpec, shard_digest: int, symbol_digest: int, arrival: int, reject_reason: int
) -> int:
    """The linear form of what never changes about an order once created."""
    return (
        shard_digest
        + symbol_digest
        + spec.user_id * S_USER
        + spec.user_seq * S_SEQ
        + spec.price_ticks * S_PRICE
        + spec.quantity_lots * S_QUANTITY
        + spec.quote_amount * S_QUOTE
        + spec.expire_at_ms * S_EXPIRE
        + (
            spec.side
            + (spec.order_type << 8)
            + (spec.time_in_force << 16)
            + (spec.self_trade_prevention << 24)
        )
        * S_FLAGS
        + arrival * S_ARRIVAL
        + reject_reason * S_REASON
    ) & MASK


def order_digest(order: OrderRecord) -> int:
    value = (
        order.key_digest
        + order.status * M_STATUS
        + order.remaining_lots * M_REMAINING
        + order.filled_lots * M_FILLED
        + order.filled_notional * M_NOTIONAL
        + order.fees_paid * M_FEES
        + order.quote_spent * M_SPENT
        + order.end_time_ms * M_END
    ) & MASK
    return finish(value)


def finish(value: int) -> int:
    """The nonlinear finish of a record's linear form (`value` already masked to 64 bits)."""
    value = ((value ^ (value >> 32)) * FINISH) & MASK
    return value ^ (value >> 29)
