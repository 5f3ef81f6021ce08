"""An order as the matcher holds it: the submitted spec and its lifecycle.

`OrderSpec` is what the OMS submitted, immutable (events keep a reference to
it). `order_record.OrderRecord` adds the mutable lifecycle. Status moves only along the
edges of `ORDER_TRANSITIONS`:

    (new) -> OPEN | REJECTED
    OPEN | PARTIALLY_FILLED -> PARTIALLY_FILLED | FILLED | CANCELLED | EXPIRED

A record is *live* while OPEN or PARTIALLY_FILLED; between commands every live
record rests in a book. `remaining_lots` is quantity minus filled for orders
sized in lots, and stays 0 for market buys (sized by `quote_amount`).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from protos.oms.v1 import common_pb2
from services.matcher.core.errors import MatcherInvariantError

NEW: Final[int] = common_pb2.ORDER_STATUS_UNSPECIFIED
OPEN: Final[int] = common_pb2.ORDER_STATUS_OPEN
PARTIALLY_FILLED: Final[int] = common_pb2.ORDER_STATUS_PARTIALLY_FILLED
FILLED: Final[int] = common_pb2.ORDER_STATUS_FILLED
CANCELLED: Final[int] = common_pb2.ORDER_STATUS_CANCELLED
EXPIRED: Final[int] = common_pb2.ORDER_STATUS_EXPIRED
REJECTED: Final[int] = common_pb2.ORDER_STATUS_REJECTED

# The hot paths test liveness as `status <= LAST_LIVE` (OPEN=2, PARTIALLY_FILLED=3).
LAST_LIVE: Final[int] = PARTIALLY_FILLED

ORDER_TRANSITIONS: Final[dict[int, frozenset[int]]] = {
    NEW: frozenset({OPEN, REJECTED}),
    OPEN: frozenset({PARTIALLY_FILLED, FILLED, CANCELLED, EXPIRED}),
    PARTIALLY_FILLED: frozenset({PARTIALLY_FILLED, FILLED, CANCELLED, EXPIRED}),
    FILLED: frozenset(),
    CANCELLED: frozenset(),
    EXPIRED: frozenset(),
    REJECTED: frozenset(),
}

BUY: Final[int] = common_pb2.SIDE_BUY
SELL: Final[int] = common_pb2.SIDE_SELL
LIMIT: Final[int] = common_pb2.ORDER_TYPE_LIMIT
MARKET: Final[int] = common_pb2.ORDER_TYPE_MARKET
TIF_UNSPECIFIED: Final[int] = common_pb2.TIME_IN_FORCE_UNSPECIFIED
GTC: Final[int] = common_pb2.TIME_IN_FORCE_GTC
IOC: Final[int] = common_pb2.TIME_IN_FORCE_IOC
FOK: Final[int] = common_pb2.TIME_IN_FORCE_FOK
GTD: Final[int] = common_pb2.TIME_IN_FORCE_GTD
POST_ONLY: Final[int] = common_pb2.TIME_IN_FORCE_POST_ONLY


# Builds a NamedTuple from a tuple of its fields without the Python-level `__new__`
# NamedTuple generates (about half the cost); used on the hot paths only.
new_record = tuple.__new__


class OrderTransitionError(MatcherInvariantError):
    """A status change the transition table does not list."""


class OrderSpec(NamedTuple):
    """The submitted order (`oms.v1.Order`) plus the parts of its id."""

    order_id: str
    user_id: int
    symbol: str
    side: int
    order_type: int
    time_in_force: int
    price_ticks: int
    quantity_lots: int
    quote_amount: int
    expire_at_ms: int
    self_trade_prevention: int
    oms_shard: str  # "" when the id is malformed
    user_seq: int  # 0 when the id is malformed


class OrderView(NamedTuple):
    """An order's state at one instant (`oms.v1.OrderState`)."""

    spec: OrderSpec
    status: int
    filled_lots: int
    remaining_lots: int
    filled_notional: int
    fees_paid: int
    quote_spent: int


def unrecorded_view(spec: OrderSpec) -> OrderView:
    """The state reported for an order rejected before it was recorded (malformed id)."""
    return OrderView(spec, REJECTED, 0, spec.quantity_lots, 0, 0, 0)
