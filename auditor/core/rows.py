"""What the auditor reads, as plain rows: PostgreSQL's tables and the admin API's answers.

The reading code (`auditor/database_reads.py`, `auditor/public_answers.py`) builds these;
the arithmetic (`money_audit.py`) never sees a connection or a message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.markets.catalog import Market

BUY = 1
SELL = 2
LIMIT = 1
MARKET = 2
PPM = 1_000_000

# Order statuses, as `oms.v1.OrderStatus` numbers them (the public contract).
PENDING = 1
OPEN = 2
PARTIALLY_FILLED = 3
FILLED = 4
CANCELLED = 5
EXPIRED = 6
REJECTED = 7
LIVE_STATUSES = frozenset({PENDING, OPEN, PARTIALLY_FILLED})
KNOWN_STATUSES = frozenset(range(PENDING, REJECTED + 1))

# Ledger accounts, as the `ledger` table's CHECK names them.
USER = "user"
CLEARING = "clearing"
FEES = "fees"
EXTERNAL = "external"


@dataclass(frozen=True, slots=True)
class MarketUnits:
    """One market's published units: what a fill of it moves, and its fees."""

    symbol: str
    base_asset: str
    quote_asset: str
    lot_size: int  # base minor units per lot
    tick_size: int  # quote minor units per tick per lot
    maker_fee_ppm: int
    taker_fee_ppm: int

    @classmethod
    def of(cls, market: Market) -> MarketUnits:
        """A catalog market's units, as the catalog publishes them."""
        return cls(
            market.symbol,
            market.base_asset,
            market.quote_asset,
            market.lot_size,
            market.tick_size,
            market.maker_fee_ppm,
            market.taker_fee_ppm,
        )


@dataclass(frozen=True, slots=True)
class LedgerItem:
    """One `ledger` row. Fed in (shard, position, item_index) order, so that the rows of
    one posting (one reference at one log position) come together."""

    shard_id: str
    position: int
    item_index: int
    user_id: int
    account: str
    asset: str
    amount: int
    reference: str


@dataclass(frozen=True, slots=True)
class OrderOfFill:
    """The `orders` row a fill names, as far as the fill must agree with it."""

    user_id: int
    symbol: str
    side: int
    order_type: int
    price_ticks: int


@dataclass(frozen=True, slots=True)
class FillRow:
    """One `fills` row (one side of a trade), with its order's row or None. Fed in
    (symbol, trade_id) order, so that the two sides of a trade come together."""

    order_id: str
    trade_id: int
    user_id: int
    symbol: str
    side: int
    price_ticks: int
    quantity_lots: int
    fee: int
    maker: bool
    shard_id: str
    position: int
    order: OrderOfFill | None


@dataclass(frozen=True, slots=True)
class OrderRow:
    """One `orders` row, with what its fills add up to (counted by the database)."""

    order_id: str
    user_id: int
    client_order_id: str
    symbol: str
    side: int
    order_type: int
    quantity_lots: int
    status: int
    filled_lots: int
    remaining_lots: int
    fills_lots: int
    shard_id: str = ""
    updated_position: int = 0


@dataclass(frozen=True, slots=True)
class AcknowledgedOrder:
    """An order a client was told was accepted: it must exist, under its client order id."""

    order_id: str
    user_id: int
    client_order_id: str


@dataclass(frozen=True, slots=True)
class AcknowledgedTransfer:
    """A deposit (amount > 0) or withdrawal (amount < 0) the admin API acknowledged."""

    user_id: int
    transfer_id: str
    asset: str
    amount: int


@dataclass(frozen=True, slots=True)
class UserAnswer:
    """One user as the admin API's ListUsers answers: its shard's view when resident,
    else PostgreSQL's."""

    user_id: int
    resident: bool
    balances: Mapping[str, tuple[int, int]]  # asset -> (total, reserved)
    open_orders: int
