"""Matcher events through Execute: accepted then filled, settlement, egress, idempotence."""

from __future__ import annotations

from protos.oms.v1 import common_pb2, shard_pb2
from tests.shard_service.shard_client import (
    BTC,
    BTC_LOT,
    USDT,
    ShardClient,
    accepted_event,
    balance,
    deposit,
    fill_event,
    hydrate,
    limit_order,
    matcher_events,
    next_sequence,
    reservation_of_limit_buy,
    unpositioned,
)

FUNDS = 10_000_000_000


async def test_accept_then_fill_settles_and_releases_the_rest(
    shard: ShardClient, users: tuple[int, ...]
) -> None:
    user = users[0]
    limit, quantity, fill_price = 6_500_000, 3, 6_400_000
    await shard.run(hydrate(user), deposit(user, FUNDS))
    (placed,) = await shard.run(limit_order(user, "m-1", price_ticks=limit, quantity_lots=quantity))
    assert placed.accepted, placed
    order_id = placed.order_id
    reserved = reservation_of_limit_buy(limit, quantity)
    assert balance(await shard.actor(user), USDT).reserved == reserved

    assert not await shard.run(matcher_events([accepted_event(next_sequence(), order_id, user)]))
    view = await shard.actor(user)
    assert [(o.order_id, o.status) for o in view.open_orders] == [
        (order_id, common_pb2.ORDER_STATUS_OPEN)
    ]

    fill = fill_event(
        next_sequence(),
        order_id,
        user,
        price_ticks=fill_price,
        quantity_lots=quantity,
        remaining_lots=0,
        trade_id=next_sequence() + 10_000,
    )
    assert fill.fill.order_done
    await shard.run(matcher_events([fill]))
    after = await shard.actor(user)
    cost = fill.fill.notional + fill.fill.fee
    assert cost == 19_200_000 + 38_400 < reserved  # price improvement: the rest is released
    usdt = balance(after, USDT)
    assert (usdt.total, usdt.reserved) == (FUNDS - cost, 0)
    btc = balance(after, "BTC")
    assert (btc.total, btc.reserved) == (quantity * BTC_LOT, 0)
    assert not after.open_orders
    (position,) = after.state.positions
    assert (position.symbol, position.quantity_lots) == (BTC, quantity)

    def settled(items: list[shard_pb2.ShardEgress]) -> bool:
        return any(
            item.order_update.order_id == order_id
            and item.order_update.status == common_pb2.ORDER_STATUS_FILLED
            for item in items
        )

    items = await shard.egress(
        ["order_update", "fill", "ledger"], from_position=placed.stamp.position, until=settled
    )
    trade_reference = f"trade:{fill.fill.trade_id}:{order_id}"
    mine = [
        item
        for item in items
        if order_id in (item.order_update.order_id, item.fill.order_id)
        or item.ledger.reference == trade_reference
    ]
    statuses = [item.order_update.status for item in mine if item.HasField("order_update")]
    assert statuses == [
        common_pb2.ORDER_STATUS_PENDING,
        common_pb2.ORDER_STATUS_OPEN,
        common_pb2.ORDER_STATUS_FILLED,
    ]
    (fill_record,) = [item.fill for item in mine if item.HasField("fill")]
    assert (fill_record.price_ticks, fill_record.quantity_lots, fill_record.fee) == (
        fill_price,
        quantity,
        fill.fill.fee,
    )
    ledger = [item.ledger for item in mine if item.HasField("ledger")]
    assert ledger, "the fill posts ledger rows"
    assert len(ledger) == 5
    assert sum(row.amount for row in ledger if row.asset == USDT) == 0  # double entry
    assert sum(row.amount for row in ledger if row.asset == "BTC") == 0
    user_usdt = sum(row.amount for row in ledger if row.asset == USDT and row.user_id == user)
    assert user_usdt == -cost

    # The same event again (same sequence) is a duplicate: nothing changes.
    duplicates_before = (await shard.status()).counters["matcher_events_duplicate"]
    await shard.run(matcher_events([fill]))
    status = await shard.status()
    assert status.counters["matcher_events_duplicate"] == duplicates_before + 1
    assert unpositioned(await shard.actor(user)) == unpositioned(after)
