"""The orders table, written behind the shard.

An order is inserted once, when the shard admits it (its `SubmitToME` and the
PENDING `OrderUpdate` of the same log position); later updates apply only when
their position is newer than the row's. A conflicting insert is absorbed, and
told apart by what is already stored:
- same order id, created at this same position: our own replay (harmless);
- same order id from another position: a duplicate order id reached the DB;
- same (user, client order id) under another order id: a duplicate command
  reached the DB (the shard's dedup let a repeated client order id through).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from persister.store import Row, Session
from services.shard.core.orders import parse_order_id

_INSERT = """
INSERT INTO orders (order_id, user_id, client_order_id, symbol, side, order_type,
    time_in_force, price_ticks, quantity_lots, quote_amount, status, filled_lots,
    remaining_lots, shard_id, created_position, updated_position, accepted_at_ms,
    updated_at_ms, user_seq)
SELECT o.order_id, o.user_id, o.client_order_id, o.symbol, o.side, o.order_type,
    o.time_in_force, o.price_ticks, o.quantity_lots, o.quote_amount, o.status, o.filled_lots,
    o.remaining_lots, $14::text, o.position, o.updated_position, o.accepted_at_ms,
    o.updated_at_ms, o.user_seq
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::smallint[],
            $6::smallint[], $7::smallint[], $8::bigint[], $9::bigint[], $10::bigint[],
            $11::smallint[], $12::bigint[], $13::bigint[], $15::bigint[], $16::bigint[],
            $17::bigint[], $18::bigint[], $19::bigint[])
     AS o(order_id, user_id, client_order_id, symbol, side, order_type, time_in_force,
          price_ticks, quantity_lots, quote_amount, status, filled_lots, remaining_lots,
          position, accepted_at_ms, updated_position, updated_at_ms, user_seq)
ON CONFLICT DO NOTHING
RETURNING order_id
"""
_EXISTING = """
SELECT order_id, user_id, client_order_id, created_position FROM orders
WHERE order_id = ANY($1::text[])
   OR (user_id, client_order_id) IN (SELECT * FROM unnest($2::bigint[], $3::text[]))
"""
_UPDATE = """
UPDATE orders AS o
SET status = c.status, filled_lots = c.filled_lots, remaining_lots = c.remaining_lots,
    updated_position = c.position, updated_at_ms = c.time_ms
FROM unnest($1::text[], $2::smallint[], $3::bigint[], $4::bigint[], $5::bigint[],
            $6::bigint[])
     AS c(order_id, status, filled_lots, remaining_lots, position, time_ms)
WHERE o.order_id = c.order_id AND o.updated_position < c.position
RETURNING o.order_id
"""
# What a reader sees of an order (persister.proto `StoredOrder`).
STORED_ORDER_COLUMNS = (
    "order_id, user_id, client_order_id, symbol, side, order_type, price_ticks, "
    "quantity_lots, status, filled_lots, remaining_lots, updated_position, time_in_force, "
    "quote_amount, accepted_at_ms, updated_at_ms, user_seq"
)


def user_sequence(order_id: str) -> int:
    """The user's order sequence an order id carries (0 if it carries none)."""
    parsed = parse_order_id(order_id)
    return 0 if parsed is None else parsed[2]


@dataclass(slots=True)
class NewOrder:
    """An admitted order; the PENDING update of its own position fills in the client id."""

    order_id: str
    user_id: int
    symbol: str
    side: int
    order_type: int
    time_in_force: int
    price_ticks: int
    quantity_lots: int
    quote_amount: int
    position: int
    accepted_at_ms: int
    client_order_id: str = ""
    status: int = 1  # PENDING
    filled_lots: int = 0
    remaining_lots: int = 0
    updated_position: int = 0
    updated_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class OrderChange:
    order_id: str
    status: int
    filled_lots: int
    remaining_lots: int
    position: int
    time_ms: int


@dataclass(slots=True)
class InsertReport:
    inserted: int = 0
    replayed: int = 0
    duplicate_orders: list[NewOrder] = field(default_factory=list)
    duplicate_commands: list[NewOrder] = field(default_factory=list)
    unexplained: list[NewOrder] = field(default_factory=list)


async def insert_orders(
    session: Session, orders: Sequence[NewOrder], shard_id: str
) -> InsertReport:
    columns = order_columns(orders)
    rows = await session.fetch(_INSERT, *columns[:13], shard_id, *columns[13:])
    return await classify_orders(session, orders, {row["order_id"] for row in rows})


def order_columns(orders: Sequence[NewOrder]) -> list[list[object]]:
    """The new orders as the columns `oms_write_rows` takes (migration 0007), in order."""
    return [
        [o.order_id for o in orders],
        [o.user_id for o in orders],
        [o.client_order_id for o in orders],
        [o.symbol for o in orders],
        [o.side for o in orders],
        [o.order_type for o in orders],
        [o.time_in_force for o in orders],
        [o.price_ticks for o in orders],
        [o.quantity_lots for o in orders],
        [o.quote_amount for o in orders],
        [o.status for o in orders],
        [o.filled_lots for o in orders],
        [o.remaining_lots for o in orders],
        [o.position for o in orders],
        [o.accepted_at_ms for o in orders],
        [max(o.updated_position, o.position) for o in orders],
        [max(o.updated_at_ms, o.accepted_at_ms) for o in orders],
        [user_sequence(o.order_id) for o in orders],
    ]


def change_columns(changes: Sequence[OrderChange]) -> list[list[object]]:
    return [
        [c.order_id for c in changes],
        [c.status for c in changes],
        [c.filled_lots for c in changes],
        [c.remaining_lots for c in changes],
        [c.position for c in changes],
        [c.time_ms for c in changes],
    ]


async def classify_orders(
    session: Session, orders: Sequence[NewOrder], inserted: set[str]
) -> InsertReport:
    """What became of each order: inserted, or not, and then why (a read of what is
    stored, only when some were not: a replay, a duplicate order id or command)."""
    report = InsertReport(inserted=len(inserted))
    refused = [o for o in orders if o.order_id not in inserted]
    if not refused:
        return report
    existing = await session.fetch(
        _EXISTING,
        [o.order_id for o in refused],
        [o.user_id for o in refused],
        [o.client_order_id for o in refused],
    )
    by_id = {row["order_id"]: row for row in existing}
    by_command = {(row["user_id"], row["client_order_id"]): row for row in existing}
    for order in refused:
        same_id = by_id.get(order.order_id)
        if same_id is not None:
            if (
                same_id["created_position"] == order.position
                and same_id["client_order_id"] == order.client_order_id
            ):
                report.replayed += 1
            else:
                report.duplicate_orders.append(order)
        elif (order.user_id, order.client_order_id) in by_command:
            report.duplicate_commands.append(order)
        else:
            report.unexplained.append(order)
    return report


async def update_orders(session: Session, changes: Sequence[OrderChange]) -> int:
    """Apply the newest change per order (one per order id); how many rows changed."""
    rows = await session.fetch(_UPDATE, *change_columns(changes))
    return len(rows)


async def read_order(session: Session, order_id: str) -> Row | None:
    return await session.fetchrow(
        f"SELECT {STORED_ORDER_COLUMNS} FROM orders WHERE order_id = $1", order_id
    )


async def read_order_by_client_id(
    session: Session, user_id: int, client_order_id: str
) -> Row | None:
    return await session.fetchrow(
        f"SELECT {STORED_ORDER_COLUMNS} FROM orders WHERE user_id = $1 AND client_order_id = $2",
        user_id,
        client_order_id,
    )
