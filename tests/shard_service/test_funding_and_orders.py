"""Hydrate, deposit, place a limit buy: the reservation, GetActor and the SubmitToME egress."""

from __future__ import annotations

from protos.oms.v1 import common_pb2, shard_pb2
from tests.shard_service.shard_client import (
    BTC,
    USDT,
    ShardClient,
    balance,
    deposit,
    hydrate,
    limit_order,
    reservation_of_limit_buy,
)


async def test_deposit_and_limit_buy_reserve_and_submit(
    shard: ShardClient, users: tuple[int, ...]
) -> None:
    user = users[0]
    # HydrateUser itself has no ShardResult; the deposit behind it in the batch is
    # answered at once (not parked) because the user is resident by then.
    (funded,) = await shard.run(hydrate(user), deposit(user, 10_000_000_000))
    assert funded.accepted and not funded.parked, funded

    price, quantity = 6_500_000, 3
    (placed,) = await shard.run(limit_order(user, "c-1", price_ticks=price, quantity_lots=quantity))
    assert placed.accepted, placed
    assert placed.order_id == f"s1:{user}:1"
    assert placed.status == common_pb2.ORDER_STATUS_PENDING
    assert placed.stamp.position > 0

    view = await shard.actor(user)
    assert view.resident
    reserved = reservation_of_limit_buy(price, quantity)
    assert reserved == 19_500_000 + 39_000  # notional + 2_000 ppm max fee
    usdt = balance(view, USDT)
    assert (usdt.total, usdt.reserved) == (10_000_000_000, reserved)
    (order,) = view.open_orders
    assert order.order_id == placed.order_id
    assert order.status == common_pb2.ORDER_STATUS_PENDING
    assert (order.reserved, order.reserved_asset) == (reserved, USDT)
    assert order.remaining_lots == quantity

    def has_submit(items: list[shard_pb2.ShardEgress]) -> bool:
        return any(item.submit.order.order_id == placed.order_id for item in items)

    items = await shard.egress(["submit"], until=has_submit)
    assert all(item.WhichOneof("egress") == "submit" for item in items)
    (submit,) = [item for item in items if item.submit.order.order_id == placed.order_id]
    assert submit.submit.matcher_group == "g1"
    assert submit.submit.order.symbol == BTC
    assert submit.submit.order.price_ticks == price
    assert submit.submit.order.quantity_lots == quantity
    assert submit.stamp.position == placed.stamp.position
