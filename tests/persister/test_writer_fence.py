"""The persister's fencing token on a real PostgreSQL: a newer claim refuses every
later write transaction of the older writer, even one that started waiting for the
row before the claim; an older token cannot claim the shard back; the counter path
hands out increasing tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from persister.cursor import read_cursor, write_cursor
from persister.migrations import apply_migrations
from persister.order_rows import (
    NewOrder,
    OrderChange,
    change_columns,
    classify_orders,
    order_columns,
)
from persister.store import Store
from persister.trade_rows import LedgerRow, fill_columns, ledger_columns
from persister.write_behind import ONE_CALL
from persister.writer_fence import WriterFencedError, claim

SHARD = "s9"


async def _store(url: str) -> Store:
    store = await Store.open(url, pool_size=3)
    await apply_migrations(store)
    return store


@pytest.fixture
async def stores(new_database: Callable[[], str]) -> AsyncIterator[tuple[Store, Store]]:
    """Two persisters' stores on one database, as two processes would have."""
    url = new_database()
    old, new = await _store(url), await _store(url)
    yield old, new
    await old.close()
    await new.close()


async def test_a_newer_token_fences_the_old_writer_out(stores: tuple[Store, Store]) -> None:
    old, new = stores
    old.fence = await claim(old, SHARD, 100)
    async with old.transaction() as session:
        await write_cursor(session, SHARD, 10)

    # The old writer is inside a transaction (the row share-locked) when the new one
    # claims: the claim waits for it; that transaction commits; the next is refused.
    async with old.transaction() as session:
        claiming = asyncio.create_task(claim(new, SHARD, 101))
        await asyncio.sleep(0)  # the claim is sent and blocks on the row
        await write_cursor(session, SHARD, 11)
    async with asyncio.timeout(10):
        new.fence = await claiming
    assert new.fence.token == 101
    with pytest.raises(WriterFencedError):
        async with old.transaction() as session:
            await write_cursor(session, SHARD, 12)
    async with new.transaction() as session:
        assert await read_cursor(session, SHARD) == 11  # nothing of the refused one
        await write_cursor(session, SHARD, 13)

    # The deposed writer cannot take the shard back with its old token.
    with pytest.raises(WriterFencedError):
        await claim(old, SHARD, 100)


async def test_without_etcd_the_database_counts_the_tokens(stores: tuple[Store, Store]) -> None:
    old, new = stores
    first = await claim(old, SHARD)
    second = await claim(new, SHARD)
    assert second.token == first.token + 1
    old.fence = first
    with pytest.raises(WriterFencedError):
        async with old.transaction():
            pass


def _order(order_id: str, user_id: int, position: int) -> NewOrder:
    return NewOrder(
        order_id=order_id,
        user_id=user_id,
        symbol="BTC-USDT",
        side=1,
        order_type=1,
        time_in_force=1,
        price_ticks=6_500_000,
        quantity_lots=1,
        quote_amount=0,
        position=position,
        accepted_at_ms=1_000,
        client_order_id=f"c-{order_id}",
    )


def _ledger(position: int, user_id: int) -> list[LedgerRow]:
    return [
        LedgerRow(position, 0, user_id, "user", "USDT", 500, f"deposit:{position}", 1_000),
        LedgerRow(position, 1, 0, "external", "USDT", -500, f"deposit:{position}", 1_000),
    ]


async def _write_in_one_call(
    store: Store, token: int, cursor: int, orders: list[NewOrder], ledger: list[LedgerRow]
) -> dict[str, object]:
    row = await store.one_statement(
        ONE_CALL,
        SHARD,
        token,
        cursor,
        *order_columns(orders),
        *change_columns([OrderChange(o.order_id, 2, 0, 1, o.position + 1, 1_001) for o in orders]),
        *fill_columns([]),
        *ledger_columns(ledger),
    )
    assert row is not None
    return row


async def test_the_write_behind_s_one_call_is_fenced_and_replays_harmlessly(
    stores: tuple[Store, Store],
) -> None:
    """`oms_write_rows` (migration 0007): the fence, the rows and the cursor in one round
    trip; written again (a replay after a restart) it inserts nothing more; with a token
    the shard no longer has, it writes nothing at all."""
    old, new = stores
    old.fence = await claim(old, SHARD, 200)
    orders = [_order(f"{SHARD}:7:{n}", 7, 10 + n) for n in (1, 2)]
    trips, transactions = old.counts.round_trips, old.counts.transactions
    first = await _write_in_one_call(old, 200, 20, orders, _ledger(12, 7))
    assert (old.counts.round_trips - trips, old.counts.transactions - transactions) == (1, 1)
    assert sorted(first["inserted_orders"]) == [o.order_id for o in orders]  # type: ignore[call-overload]
    assert (first["changed_orders"], first["inserted_ledger"]) == (2, 2)
    again = await _write_in_one_call(old, 200, 20, orders, _ledger(12, 7))
    assert (again["inserted_orders"], again["changed_orders"], again["inserted_ledger"]) == (
        [],
        0,
        0,
    )
    async with old.session() as session:
        report = await classify_orders(session, orders, set())
    assert report.replayed == 2 and not report.duplicate_orders

    new.fence = await claim(new, SHARD, 201)
    with pytest.raises(WriterFencedError):
        await _write_in_one_call(old, 200, 30, [_order(f"{SHARD}:7:9", 7, 25)], _ledger(26, 7))
    async with new.session() as session:
        assert await read_cursor(session, SHARD) == 20
        assert await session.fetchval("SELECT count(*) FROM orders") == 2
        assert await session.fetchval("SELECT count(*) FROM ledger") == 2
        statuses = await session.fetch("SELECT status FROM orders")
    assert {row["status"] for row in statuses} == {2}
