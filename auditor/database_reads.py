"""The auditor's reads of PostgreSQL: one read-only snapshot, streamed through the audit.

Everything is read in one REPEATABLE READ READ ONLY transaction, so the ledger, the
fills and the orders are of one moment of the write-behind (a persister commits a
batch's rows and its cursor together). Rows are streamed in the orders the audit
needs (the ledger by log place, the fills by trade) with server-side cursors: the
auditor's memory is its per-user sums, not the tables.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import asyncpg

from auditor.core.money_audit import MoneyAudit
from auditor.core.rows import AcknowledgedOrder, FillRow, LedgerItem, OrderOfFill, OrderRow

PREFETCH_ROWS = 5_000
LOOKUP_CHUNK = 10_000

LEDGER = """
SELECT shard_id, position, item_index, user_id, account, asset, amount, reference
FROM ledger ORDER BY shard_id, position, item_index
"""
# Both sides of a trade together (a trade id is unique in its matcher group, so
# symbol and trade id name one trade), each with its order's row, if any.
FILLS = """
SELECT f.order_id, f.trade_id, f.user_id, f.symbol, f.side, f.price_ticks, f.quantity_lots,
       f.fee, f.maker, f.shard_id, f.position,
       o.order_id IS NOT NULL AS has_order, o.user_id AS order_user_id,
       o.symbol AS order_symbol, o.side AS order_side, o.order_type, o.price_ticks AS limit_ticks
FROM fills f LEFT JOIN orders o ON o.order_id = f.order_id
ORDER BY f.symbol, f.trade_id, f.maker
"""
ORDERS = """
SELECT o.order_id, o.user_id, o.client_order_id, o.symbol, o.side, o.order_type,
       o.quantity_lots, o.status, o.filled_lots, o.remaining_lots,
       coalesce(f.lots, 0)::bigint AS fills_lots, o.shard_id, o.updated_position
FROM orders o
LEFT JOIN (SELECT order_id, sum(quantity_lots) AS lots FROM fills GROUP BY order_id) f
    ON f.order_id = o.order_id
"""
CURSORS = """
SELECT shard_id, position FROM persister_cursor
"""
STORED_BALANCES = """
SELECT user_id, asset, total FROM balances WHERE user_id = ANY($1::bigint[])
"""
ACKNOWLEDGED = """
SELECT order_id, user_id, client_order_id FROM orders WHERE order_id = ANY($1::text[])
"""


async def read_database(
    connection: asyncpg.Connection,
    audit: MoneyAudit,
    *,
    flat: bool,
    stored_users: Collection[int],
    acknowledged: Sequence[AcknowledgedOrder],
) -> None:
    """Feed `audit` one snapshot of the database and finish it; `stored_users` (those no
    shard holds) are compared with their stored balances."""
    async with connection.transaction(isolation="repeatable_read", readonly=True):
        audit.persister_cursors(
            {row["shard_id"]: row["position"] for row in await connection.fetch(CURSORS)}
        )
        async for row in connection.cursor(LEDGER, prefetch=PREFETCH_ROWS):
            audit.ledger_item(
                LedgerItem(
                    row["shard_id"],
                    row["position"],
                    row["item_index"],
                    row["user_id"],
                    row["account"],
                    row["asset"],
                    row["amount"],
                    row["reference"],
                )
            )
        async for row in connection.cursor(FILLS, prefetch=PREFETCH_ROWS):
            order = (
                OrderOfFill(
                    row["order_user_id"],
                    row["order_symbol"],
                    row["order_side"],
                    row["order_type"],
                    row["limit_ticks"],
                )
                if row["has_order"]
                else None
            )
            audit.fill(
                FillRow(
                    row["order_id"],
                    row["trade_id"],
                    row["user_id"],
                    row["symbol"],
                    row["side"],
                    row["price_ticks"],
                    row["quantity_lots"],
                    row["fee"],
                    row["maker"],
                    row["shard_id"],
                    row["position"],
                    order,
                )
            )
        async for row in connection.cursor(ORDERS, prefetch=PREFETCH_ROWS):
            audit.order(
                OrderRow(
                    row["order_id"],
                    row["user_id"],
                    row["client_order_id"],
                    row["symbol"],
                    row["side"],
                    row["order_type"],
                    row["quantity_lots"],
                    row["status"],
                    row["filled_lots"],
                    row["remaining_lots"],
                    row["fills_lots"],
                    row["shard_id"],
                    row["updated_position"],
                ),
                flat=flat,
            )
        stored: dict[str, tuple[int, str]] = {}
        ids = [order.order_id for order in acknowledged]
        for start in range(0, len(ids), LOOKUP_CHUNK):
            for row in await connection.fetch(ACKNOWLEDGED, ids[start : start + LOOKUP_CHUNK]):
                stored[row["order_id"]] = (row["user_id"], row["client_order_id"])
        balances: dict[int, dict[str, int]] = {user_id: {} for user_id in stored_users}
        for row in await connection.fetch(STORED_BALANCES, sorted(stored_users)):
            balances[row["user_id"]][row["asset"]] = row["total"]
    audit.finish()
    audit.acknowledged_orders(acknowledged, stored)
    audit.compare_stored(balances)
