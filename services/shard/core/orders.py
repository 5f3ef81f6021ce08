"""An order in a user's open-orders index, and its lifecycle as a literal table.

Client-visible lifecycle (`oms.v1` grammar):

    PENDING -> OPEN | REJECTED                      (the matcher's answer)
    OPEN -> PARTIALLY_FILLED* -> FILLED | CANCELLED | EXPIRED

The matcher emits Accepted before any fill or cancel of an order, so the moves
from PENDING straight to a fill or an end are listed only because an Accepted
can be lost in a sequence gap: a fill or a cancel proves the acceptance.
Anything not in the table is refused by `advance` (an invariant error).
Terminal orders leave the index at once; the dedup map remembers their ids.
"""

from __future__ import annotations

from services.shard.core.commands import PlaceOrder
from services.shard.core.errors import OrderTransitionError
from services.shard.core.vocabulary import (
    CANCELLED,
    EXPIRED,
    FILLED,
    OPEN,
    PARTIALLY_FILLED,
    PENDING,
    REJECTED,
    OrderStatus,
)

TRANSITIONS: dict[int, tuple[int, ...]] = {
    PENDING: (OPEN, REJECTED, PARTIALLY_FILLED, FILLED, CANCELLED, EXPIRED),
    OPEN: (PARTIALLY_FILLED, FILLED, CANCELLED, EXPIRED),
    PARTIALLY_FILLED: (PARTIALLY_FILLED, FILLED, CANCELLED, EXPIRED),
    FILLED: (),
    CANCELLED: (),
    EXPIRED: (),
    REJECTED: (),
}

TERMINAL: tuple[int, ...] = (FILLED, CANCELLED, EXPIRED, REJECTED)
LIVE: tuple[int, ...] = (PENDING, OPEN, PARTIALLY_FILLED)


def advance(order: OpenOrder, status: int) -> None:
    """Move `order` to `status`, refusing any move the table does not list."""
    if status not in TRANSITIONS[order.status]:
        raise OrderTransitionError(
            f"order {order.order_id}: {OrderStatus(order.status).name} -> "
            f"{OrderStatus(status).name} is not a lifecycle move"
        )
    order.status = status


class OpenOrder:
    """A live order of one user: admitted, reserved, sent or resting at the matcher.

    `request` is the client's PlaceOrder as admitted, kept by reference (it is
    immutable): what was asked for never changes, only where the order stands.
    """

    __slots__ = (
        "cancel_in_flight",
        "filled_lots",
        "matcher_group",
        "order_id",
        "remaining_lots",
        "request",
        "reserve_asset",
        "status",
    )

    def __init__(
        self, order_id: str, request: PlaceOrder, matcher_group: str, reserve_asset: str
    ) -> None:
        self.order_id = order_id
        self.request = request
        self.matcher_group = matcher_group
        self.reserve_asset = reserve_asset
        self.remaining_lots = request.quantity_lots
        self.filled_lots = 0
        self.status = PENDING
        self.cancel_in_flight = False

    @property
    def client_order_id(self) -> str:
        return self.request.client_order_id

    @property
    def symbol(self) -> str:
        return self.request.symbol

    @property
    def side(self) -> int:
        return self.request.side

    @property
    def order_type(self) -> int:
        return self.request.order_type

    def plain(self) -> tuple[object, ...]:
        """Every field as plain data, in a fixed order (snapshot and digest)."""
        request = tuple(self.request)
        if not self.request.session_id:
            # Without a session the request keeps the plain data (the digest and the
            # snapshot bytes) it had before sessions existed.
            request = request[:-1]
        return (
            self.order_id,
            request,
            self.matcher_group,
            self.reserve_asset,
            self.remaining_lots,
            self.filled_lots,
            self.status,
            self.cancel_in_flight,
        )

    @classmethod
    def from_plain(cls, data: tuple[object, ...]) -> OpenOrder:
        (
            order_id,
            request,
            matcher_group,
            reserve_asset,
            remaining_lots,
            filled_lots,
            status,
            cancel_in_flight,
        ) = data
        if not isinstance(request, tuple):
            raise TypeError("order request must be a tuple")
        order = cls(str(order_id), PlaceOrder(*request), str(matcher_group), str(reserve_asset))
        order.remaining_lots = _int(remaining_lots)
        order.filled_lots = _int(filled_lots)
        order.status = _int(status)
        order.cancel_in_flight = bool(cancel_in_flight)
        return order


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an int, got {value!r}")
    return value


def parse_order_id(order_id: str) -> tuple[str, int, int] | None:
    """`"<shard_id>:<user_id>:<user_seq>"` -> (shard_id, user_id, user_seq), else None."""
    parts = order_id.split(":")
    if len(parts) != 3:
        return None
    shard_id, user_text, seq_text = parts
    if not shard_id or not _is_decimal(user_text) or not _is_decimal(seq_text):
        return None
    return shard_id, int(user_text), int(seq_text)


def _is_decimal(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 20
