"""Write-behind: orders, fills and ledger rows land in PostgreSQL exactly as the shard's
egress says; the DB-side dedup lookup answers a retry past the shard's memory; the oracle
counters move when a duplicate reaches the DB; a row the DB refuses is counted and skipped
without stalling the stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from protos.oms.v1 import common_pb2, matcher_pb2, shard_pb2
from tests.persister.conftest import Mesh
from tests.persister.egress_rows import egress_through, ledger_rows, table_ledger
from tests.persister.persister_client import PersisterClient, sql
from tests.shard_service.shard_client import (
    BTC_LOT,
    USDT,
    ShardClient,
    accepted_event,
    deposit,
    eventually,
    fill_event,
    limit_order,
    matcher_events,
)
from tests.shard_service.shard_process import aio_channel

PRICE = 6_500_000
ORACLES = ("duplicate_command_reached_db", "duplicate_order_reached_db", "rejected_rows")


@pytest.fixture
async def clients(
    start_mesh: Callable[..., Mesh],
) -> AsyncIterator[tuple[Mesh, ShardClient, PersisterClient]]:
    mesh = start_mesh()
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        yield mesh, ShardClient(shard_channel), PersisterClient(persister_channel)


async def _committed(persister: PersisterClient, position: int) -> dict[str, int]:
    return await eventually(persister.counters, lambda c: c["committed_position"] >= position)


def _rejected(order_id: str, user_id: int, sequence: int) -> matcher_pb2.MatcherEvent:
    event = matcher_pb2.MatcherEvent(
        sequence=sequence, oms_shard="s1", order_id=order_id, user_id=user_id
    )
    event.rejected.reason = matcher_pb2.MATCHER_REJECT_REASON_BELOW_MIN_NOTIONAL
    return event


async def test_orders_fills_and_ledger_rows_match_the_egress(
    clients: tuple[Mesh, ShardClient, PersisterClient],
) -> None:
    mesh, shard, persister = clients
    buyer = (await persister.create_user()).user_id
    seller = (await persister.create_user()).user_id
    await shard.run(deposit(buyer, 10_000_000_000), deposit(seller, 5 * BTC_LOT, asset="BTC"))
    (buy,) = await shard.run(limit_order(buyer, "b-1", price_ticks=PRICE, quantity_lots=3))
    (sell,) = await shard.run(
        limit_order(seller, "s-1", price_ticks=PRICE, quantity_lots=1, side=common_pb2.SIDE_SELL)
    )
    assert buy.accepted and sell.accepted
    events = [
        accepted_event(1, buy.order_id, buyer),
        accepted_event(2, sell.order_id, seller),
        fill_event(
            3, buy.order_id, buyer, price_ticks=PRICE, quantity_lots=1, remaining_lots=2,
            trade_id=11,
        ),
        fill_event(
            4, sell.order_id, seller, price_ticks=PRICE, quantity_lots=1, remaining_lots=0,
            trade_id=11, side=common_pb2.SIDE_SELL,
        ),
    ]  # fmt: skip
    await shard.run(matcher_events(events))
    (last,) = await shard.run(deposit(buyer, 1))
    await _committed(persister, last.stamp.position)

    egress = await egress_through(
        shard, ["submit", "order_update", "fill", "ledger"], last.stamp.position
    )
    async with sql(mesh.database_url) as connection:
        assert await table_ledger(connection) == ledger_rows(egress)
        unbalanced = await connection.fetch(
            "SELECT reference, asset, sum(amount) FROM ledger GROUP BY reference, asset "
            "HAVING sum(amount) <> 0 AND reference NOT LIKE 'trade:%'"
        )
        trades = await connection.fetch(
            "SELECT asset, sum(amount) AS net FROM ledger WHERE reference LIKE 'trade:11:%' "
            "AND account <> 'fees' GROUP BY asset"
        )
        fills = await connection.fetch(
            "SELECT order_id, trade_id, user_id, quantity_lots, price_ticks FROM fills "
            "ORDER BY order_id"
        )
        cursor = await connection.fetchval("SELECT position FROM persister_cursor")
    assert unbalanced == []  # every transfer's entry balances on its own
    # Both legs of trade 11 settled here: per asset, users + clearing net out to the fees.
    fees = sum(item.fill.fee for item in egress if item.WhichOneof("egress") == "fill")
    assert {row["asset"]: row["net"] for row in trades} == {USDT: -fees, "BTC": 0}
    assert [tuple(row.values()) for row in fills] == sorted(
        [(buy.order_id, 11, buyer, 1, PRICE), (sell.order_id, 11, seller, 1, PRICE)]
    )
    assert cursor >= last.stamp.position

    stored = await persister.stored_order(buy.order_id, buyer)
    assert stored.client_order_id == "b-1" and stored.symbol == "BTC-USDT"
    assert stored.status == common_pb2.ORDER_STATUS_PARTIALLY_FILLED
    assert (stored.filled_lots, stored.remaining_lots, stored.quantity_lots) == (1, 2, 3)
    assert stored.price_ticks == PRICE and stored.side == common_pb2.SIDE_BUY
    sold = await persister.stored_order(sell.order_id)
    assert sold.status == common_pb2.ORDER_STATUS_FILLED and sold.remaining_lots == 0
    counters = await persister.counters()
    assert all(counters[name] == 0 for name in ORACLES), counters
    assert counters["orders_inserted"] == 2 and counters["fills_inserted"] == 2


async def test_a_retry_past_the_shards_memory_is_answered_by_the_database(
    clients: tuple[Mesh, ShardClient, PersisterClient],
) -> None:
    """A whale's 1001 orders push the first client id out of the shard's exact recent map
    (1000 per user); its Bloom filters still say "possibly seen", so the retry parks behind
    a DedupLookup that the persister answers from the orders table."""
    _, shard, persister = clients
    whale = (await persister.create_user(tier=shard_pb2.USER_TIER_WHALE)).user_id
    await shard.run(deposit(whale, 10_000_000_000_000))
    orders = [
        limit_order(whale, f"w-{n}", price_ticks=PRICE, quantity_lots=1) for n in range(1_001)
    ]
    placed = await shard.run(*orders)
    assert all(result.accepted for result in placed)
    closing = [_rejected(r.order_id, whale, n + 1) for n, r in enumerate(placed)]
    await shard.run(matcher_events(closing))

    (retry,) = await shard.run(limit_order(whale, "w-0", price_ticks=PRICE, quantity_lots=1))
    assert retry.duplicate and retry.accepted, retry
    assert retry.order_id == placed[0].order_id
    counters = await persister.counters()
    assert counters["dedup_answers_seen"] == 1 and counters["dedup_queries"] >= 1
    status = await shard.status()
    assert status.counters["dedup_answers_seen"] == 1


async def test_duplicates_that_reach_the_database_move_the_oracle_counters(
    clients: tuple[Mesh, ShardClient, PersisterClient],
) -> None:
    mesh, shard, persister = clients
    user = (await persister.create_user()).user_id
    async with sql(mesh.database_url) as connection:
        # Rows the shard knows nothing about: a client id already used under another
        # order id, and the very order id the shard will hand out second.
        for order_id, client_id in (("s9:1:1", "dup-cmd"), (f"s1:{user}:2", "other")):
            await connection.execute(
                "INSERT INTO orders (order_id, user_id, client_order_id, symbol, side, "
                "order_type, time_in_force, price_ticks, quantity_lots, quote_amount, status, "
                "filled_lots, remaining_lots, shard_id, created_position, updated_position, "
                "accepted_at_ms) VALUES ($1, $2, $3, 'BTC-USDT', 1, 1, 1, 1, 1, 0, 2, 0, 1, "
                "'s9', 1, 1, 0)",
                order_id,
                user,
                client_id,
            )
    await shard.run(deposit(user, 10_000_000_000))
    first, second, third = await shard.run(
        *(
            limit_order(user, cid, price_ticks=PRICE, quantity_lots=1)
            for cid in ("dup-cmd", "x", "y")
        )
    )
    assert first.accepted and second.accepted and third.accepted
    counters = await _committed(persister, third.stamp.position)
    assert counters["duplicate_command_reached_db"] == 1, counters
    assert counters["duplicate_order_reached_db"] == 1, counters
    assert counters["rejected_rows"] == 0
    assert counters["orders_inserted"] == 1  # the third order is unaffected
    assert (await persister.stored_order(third.order_id)).client_order_id == "y"


async def test_a_row_the_database_refuses_is_counted_and_the_stream_goes_on(
    clients: tuple[Mesh, ShardClient, PersisterClient],
) -> None:
    mesh, shard, persister = clients
    user = (await persister.create_user()).user_id
    async with sql(mesh.database_url) as connection:
        await connection.execute(
            "ALTER TABLE ledger ADD CONSTRAINT test_poison CHECK (reference <> 'poison')"
        )
    # One batch: the poisoned transfer between two good ones.
    results = await shard.run(
        deposit(user, 100, transfer_id="good-1"),
        deposit(user, 200, transfer_id="poison"),
        deposit(user, 300, transfer_id="good-2"),
    )
    assert all(result.accepted for result in results)
    (later,) = await shard.run(deposit(user, 400, transfer_id="good-3"))
    counters = await _committed(persister, later.stamp.position)
    assert counters["rejected_rows"] == 2, counters  # both rows of the poisoned entry
    assert counters["batch_fallbacks"] >= 1
    async with sql(mesh.database_url) as connection:
        references = await connection.fetch(
            "SELECT reference, sum(amount) FROM ledger WHERE user_id = $1 GROUP BY reference "
            "ORDER BY reference",
            user,
        )
    assert [tuple(row.values()) for row in references] == [
        ("good-1", 100),
        ("good-2", 300),
        ("good-3", 400),
    ]
