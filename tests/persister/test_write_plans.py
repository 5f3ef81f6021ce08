"""The write-behind's statements reach `orders` by key however small the table was when
its session first planned them (a real PostgreSQL).

A session keeps a generic plan once five runs found it no worse. Made while `orders`
was empty, the write's UPDATE (orders joined to the batch's arrays) was a sequential
scan, kept as the table grew: every write transaction then read every order. Here a
persister's session writes while the table is young, the table then grows, and the
next writes, both `oms_write_rows` and the row-by-row statements, must read `orders`
through its index: the transaction's own statistics
(`pg_stat_xact_user_tables`) count no sequential scan of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from persister.migrations import apply_migrations
from persister.order_rows import (
    NewOrder,
    OrderChange,
    change_columns,
    insert_orders,
    order_columns,
    update_orders,
)
from persister.store import Session, Store
from persister.trade_rows import fill_columns, ledger_columns
from persister.write_behind import ONE_CALL
from persister.writer_fence import claim

SHARD = "s5"
TOKEN = 40
BATCH = 16
YOUNG_WRITES = 8  # more than the five custom plans a session makes before a generic one
GROWN_ROWS = 20_000


def _orders(first_position: int) -> list[NewOrder]:
    return [
        NewOrder(
            f"{SHARD}:{n + 1}:{first_position + n}", n + 1, "BTC-USDT", 1, 1, 1, 6_500_000,
            1, 0, first_position + n, 1_000, client_order_id=f"c-{first_position + n}",
        )
        for n in range(BATCH)
    ]  # fmt: skip


def _changes(orders: list[NewOrder], position: int) -> list[OrderChange]:
    return [OrderChange(order.order_id, 3, 1, 0, position, 1_001) for order in orders]


@pytest.fixture
async def store(new_database: Callable[[], str]) -> AsyncIterator[Store]:
    # One connection: the plans a session caches are that connection's.
    store = await Store.open(new_database(), pool_size=1)
    await apply_migrations(store)
    store.fence = await claim(store, SHARD, TOKEN)
    yield store
    await store.close()


async def _one_call(session: Session, orders: list[NewOrder], changes: list[OrderChange]) -> None:
    cursor = max(change.position for change in changes) if changes else orders[-1].position
    await session.fetchrow(
        ONE_CALL, SHARD, TOKEN, cursor,
        *order_columns(orders), *change_columns(changes), *fill_columns([]),
        *ledger_columns([]),
    )  # fmt: skip


async def _orders_scanned(session: Session) -> int:
    scans = await session.fetchval(
        "SELECT coalesce(seq_scan, 0) FROM pg_stat_xact_user_tables WHERE relname = 'orders'"
    )
    return int(scans)


async def _grow_orders(store: Store) -> None:
    async with store.session() as session:
        await session.execute(
            """INSERT INTO orders (order_id, user_id, client_order_id, symbol, side, order_type,
                   time_in_force, price_ticks, quantity_lots, quote_amount, status, filled_lots,
                   remaining_lots, shard_id, created_position, updated_position,
                   accepted_at_ms)
               SELECT 'old:' || n, 1 + n % 500, 'old-' || n, 'BTC-USDT', 1, 1, 1, 6500000, 1,
                   0, 2, 0, 1, 'old', n, n, 1000
               FROM generate_series(1, $1) AS n""",
            GROWN_ROWS,
        )


async def test_the_one_call_write_keeps_an_index_plan_as_orders_grows(store: Store) -> None:
    position = 1
    previous: list[NewOrder] = []
    for _ in range(YOUNG_WRITES):
        orders = _orders(position)
        position += BATCH
        async with store.session() as session:
            await _one_call(session, orders, _changes(previous, position))
        previous = orders
    await _grow_orders(store)

    async with store.transaction() as session:
        scanned = await _orders_scanned(session)
        await _one_call(session, _orders(position + BATCH), _changes(previous, position + BATCH))
        assert await _orders_scanned(session) == scanned


async def test_the_row_by_row_statements_keep_an_index_plan_as_orders_grows(
    store: Store,
) -> None:
    position = 1
    previous: list[NewOrder] = []
    for _ in range(YOUNG_WRITES):
        orders = _orders(position)
        position += BATCH
        async with store.transaction() as session:
            await insert_orders(session, orders, SHARD)
            await update_orders(session, _changes(previous, position))
        previous = orders
    await _grow_orders(store)

    async with store.transaction() as session:
        scanned = await _orders_scanned(session)
        assert await update_orders(session, _changes(previous, position + BATCH)) == BATCH
        assert await _orders_scanned(session) == scanned
