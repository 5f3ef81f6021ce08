"""Orders placed on the shard reach their matcher group through the bridge and come back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from protos.oms.v1 import common_pb2, matcher_pb2
from tests.bridge.mesh import MeshClients
from tests.bridge.mesh_checks import check_invariants, wait_quiet
from tests.bridge.order_updates import post_only_order, wait_order_update
from tests.shard_service.shard_client import (
    BTC_LOT,
    USDT,
    balance,
    cancel,
    hydrate,
    limit_order,
)

BUY = common_pb2.SIDE_BUY
SELL = common_pb2.SIDE_SELL
OPEN = common_pb2.ORDER_STATUS_OPEN
FILLED = common_pb2.ORDER_STATUS_FILLED
CANCELLED = common_pb2.ORDER_STATUS_CANCELLED
REJECTED = common_pb2.ORDER_STATUS_REJECTED
FUNDS = 1_000_000_000  # 1,000 USDT in micro-USDT
BTC_HELD = 5 * BTC_LOT
PRICE = 6_500_000  # ticks; BTC-USDT tick_size 1: notional = price * lots
# services/markets/default_markets.toml: maker 1,000 ppm, taker 2,000 ppm, in the quote asset.
MAKER_PPM, TAKER_PPM = 1_000, 2_000


@pytest.fixture(autouse=True)
async def invariants_hold(mesh: MeshClients) -> AsyncIterator[None]:
    yield
    await wait_quiet(mesh)
    await check_invariants(mesh)


async def test_crossing_orders_fill_and_move_balances_exactly(
    mesh: MeshClients, users: tuple[int, ...]
) -> None:
    shard = mesh.shard
    buyer, seller = users[:2]
    await shard.run(
        hydrate(buyer, balances=[(USDT, FUNDS)]), hydrate(seller, balances=[("BTC", BTC_HELD)])
    )
    (sell,) = await shard.run(
        limit_order(seller, "sell-1", price_ticks=PRICE, quantity_lots=2, side=SELL)
    )
    assert sell.accepted, sell
    await wait_order_update(shard, sell.order_id, OPEN, from_position=sell.stamp.position)
    (buy,) = await shard.run(limit_order(buyer, "buy-1", price_ticks=PRICE, quantity_lots=2))
    assert buy.accepted, buy
    for placed in (sell, buy):
        await wait_order_update(shard, placed.order_id, FILLED, from_position=sell.stamp.position)
        state = await mesh.matchers["g1"].get_order(placed.order_id)
        assert state is not None and state.status == FILLED

    notional = PRICE * 2  # 13,000,000 micro-USDT = 13 USDT
    taker_fee = notional * TAKER_PPM // 1_000_000  # 26,000
    maker_fee = notional * MAKER_PPM // 1_000_000  # 13,000
    buyer_view, seller_view = await shard.actor(buyer), await shard.actor(seller)
    assert (balance(buyer_view, USDT).total, balance(buyer_view, USDT).reserved) == (
        FUNDS - notional - taker_fee,
        0,
    )
    assert (balance(buyer_view, "BTC").total, balance(buyer_view, "BTC").reserved) == (
        2 * BTC_LOT,
        0,
    )
    assert (balance(seller_view, USDT).total, balance(seller_view, USDT).reserved) == (
        notional - maker_fee,
        0,
    )
    assert (balance(seller_view, "BTC").total, balance(seller_view, "BTC").reserved) == (
        BTC_HELD - 2 * BTC_LOT,
        0,
    )
    assert not buyer_view.open_orders and not seller_view.open_orders


async def test_sol_order_goes_to_the_g2_matcher_and_cancel_releases_it(
    mesh: MeshClients, users: tuple[int, ...]
) -> None:
    shard = mesh.shard
    user = users[0]
    await shard.run(hydrate(user, balances=[(USDT, FUNDS)]))
    # SOL-USDT: reference 15,000 ticks, tick_size 1; 100 lots at 14,000 = 1.4 USDT notional.
    price, lots = 14_000, 100
    (placed,) = await shard.run(
        limit_order(user, "sol-1", price_ticks=price, quantity_lots=lots, symbol="SOL-USDT")
    )
    assert placed.accepted, placed
    await wait_order_update(shard, placed.order_id, OPEN, from_position=placed.stamp.position)
    at_g2 = await mesh.matchers["g2"].get_order(placed.order_id)
    assert at_g2 is not None and at_g2.status == OPEN
    assert await mesh.matchers["g1"].get_order(placed.order_id) is None
    reserved = price * lots + price * lots * TAKER_PPM // 1_000_000
    assert balance(await shard.actor(user), USDT).reserved == reserved

    (cancelling,) = await shard.run(cancel(user, placed.order_id))
    assert cancelling.accepted, cancelling
    await wait_order_update(shard, placed.order_id, CANCELLED, from_position=placed.stamp.position)
    at_g2 = await mesh.matchers["g2"].get_order(placed.order_id)
    assert at_g2 is not None and at_g2.status == CANCELLED
    usdt = balance(await shard.actor(user), USDT)
    assert (usdt.total, usdt.reserved) == (FUNDS, 0)


async def test_post_only_that_would_cross_is_rejected_and_released(
    mesh: MeshClients, users: tuple[int, ...]
) -> None:
    shard = mesh.shard
    buyer, seller = users[:2]
    await shard.run(
        hydrate(buyer, balances=[(USDT, FUNDS)]), hydrate(seller, balances=[("BTC", BTC_HELD)])
    )
    (resting,) = await shard.run(
        limit_order(seller, "ask-1", price_ticks=PRICE, quantity_lots=1, side=SELL)
    )
    await wait_order_update(shard, resting.order_id, OPEN, from_position=resting.stamp.position)
    (post_only,) = await shard.run(
        post_only_order(buyer, "po-1", price_ticks=PRICE, quantity_lots=1, side=BUY)
    )
    assert post_only.accepted, post_only
    update = await wait_order_update(
        shard, post_only.order_id, REJECTED, from_position=post_only.stamp.position
    )
    assert update.matcher_reason == matcher_pb2.MATCHER_REJECT_REASON_POST_ONLY_WOULD_CROSS
    usdt = balance(await shard.actor(buyer), USDT)
    assert (usdt.total, usdt.reserved) == (FUNDS, 0)

    # Leave the book empty for the invariants: the resting ask is cancelled.
    await shard.run(cancel(seller, resting.order_id))
    await wait_order_update(
        shard, resting.order_id, CANCELLED, from_position=resting.stamp.position
    )
