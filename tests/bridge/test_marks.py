"""Trade prices reach the shard's risk as marks: matcher StreamLastPrices -> bridge -> PublishMarks.

Real processes (shard, matchers g1 and g2, bridge). After trades, the shard's
GetActor shows each traded symbol's mark at the last trade price and the
unrealized P&L of the position valued at it; after the shard and a matcher are
killed and restarted, the feed reconnects on its own and marks flow again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from protos.oms.v1 import common_pb2, shard_pb2
from tests.bridge.mesh import MeshClients, MeshProcesses
from tests.bridge.mesh_checks import check_invariants, wait_quiet
from tests.bridge.order_updates import wait_order_update
from tests.shard_service.shard_client import (
    BTC_LOT,
    USDT,
    ShardClient,
    eventually,
    hydrate,
    limit_order,
)

SELL = common_pb2.SIDE_SELL
FILLED = common_pb2.ORDER_STATUS_FILLED
FUNDS = 1_000_000_000  # 1,000 USDT in micro-USDT
SOL_UNIT = 1_000_000  # lamports per SOL-USDT lot
# BTC-USDT and SOL-USDT both have tick_size 1: a lot's value is its price in ticks.
FIRST_PRICE, SECOND_PRICE = 6_500_000, 6_600_000
SOL_PRICE = 15_200
ETH_PRICE = 352_000
ETH_LOT = 10_000  # ETH-USDT lot in units of 1e-8 ETH


@pytest.fixture(autouse=True)
async def invariants_hold(mesh: MeshClients) -> AsyncIterator[None]:
    yield
    await wait_quiet(mesh)
    await check_invariants(mesh)


async def trade(
    shard: ShardClient,
    buyer: int,
    seller: int,
    tag: str,
    *,
    price_ticks: int,
    quantity_lots: int,
    symbol: str = "BTC-USDT",
) -> None:
    (sell,) = await shard.run(
        limit_order(
            seller,
            f"{tag}-sell",
            price_ticks=price_ticks,
            quantity_lots=quantity_lots,
            side=SELL,
            symbol=symbol,
        )
    )
    (buy,) = await shard.run(
        limit_order(
            buyer,
            f"{tag}-buy",
            price_ticks=price_ticks,
            quantity_lots=quantity_lots,
            symbol=symbol,
        )
    )
    assert sell.accepted and buy.accepted, (sell, buy)
    for placed in (sell, buy):
        await wait_order_update(shard, placed.order_id, FILLED, from_position=sell.stamp.position)


def marks_of(view: shard_pb2.ActorView) -> dict[str, int]:
    return {mark.symbol: mark.price_ticks for mark in view.marks}


async def test_last_trade_prices_become_marks_and_value_positions(
    mesh: MeshClients, users: tuple[int, ...]
) -> None:
    shard = mesh.shard
    holder, first_seller, buyer, seller, sol_buyer, sol_seller = users[:6]
    await shard.run(
        hydrate(holder, balances=[(USDT, FUNDS)]),
        hydrate(first_seller, balances=[("BTC", 5 * BTC_LOT)]),
        hydrate(buyer, balances=[(USDT, FUNDS)]),
        hydrate(seller, balances=[("BTC", 5 * BTC_LOT)]),
        hydrate(sol_buyer, balances=[(USDT, FUNDS)]),
        hydrate(sol_seller, balances=[("SOL", 200 * SOL_UNIT)]),
    )
    # The holder buys 2 lots at the first price; a later trade between others moves the mark.
    await trade(shard, holder, first_seller, "m1", price_ticks=FIRST_PRICE, quantity_lots=2)
    await trade(shard, buyer, seller, "m2", price_ticks=SECOND_PRICE, quantity_lots=1)
    await trade(
        shard,
        sol_buyer,
        sol_seller,
        "m3",
        price_ticks=SOL_PRICE,
        quantity_lots=100,
        symbol="SOL-USDT",
    )

    holder_view = await eventually(
        lambda: shard.actor(holder),
        lambda view: marks_of(view).get("BTC-USDT") == SECOND_PRICE,
    )
    (position,) = holder_view.state.positions
    assert (position.symbol, position.quantity_lots, position.cost_basis) == (
        "BTC-USDT",
        2,
        2 * FIRST_PRICE,
    )
    assert holder_view.unrealized_pnl == 2 * (SECOND_PRICE - FIRST_PRICE)

    # The other side of the first trade is short against the same mark.
    seller_view = await shard.actor(first_seller)
    assert marks_of(seller_view) == {"BTC-USDT": SECOND_PRICE}
    assert seller_view.unrealized_pnl == -2 * (SECOND_PRICE - FIRST_PRICE)

    # g2's prices come through the same feed: the SOL buyer's mark is its own trade's price.
    sol_view = await eventually(
        lambda: shard.actor(sol_buyer), lambda view: "SOL-USDT" in marks_of(view)
    )
    assert marks_of(sol_view) == {"SOL-USDT": SOL_PRICE}
    assert sol_view.unrealized_pnl == 0

    report = await mesh.bridge_status()
    assert report.counters["marks_received"] >= 2
    assert report.counters["marks_published"] >= 2
    status = await shard.status()
    assert status.counters["ticks_received"] >= 2


async def test_marks_flow_again_after_the_shard_and_a_matcher_are_killed(
    shared_mesh: MeshProcesses, mesh: MeshClients, users: tuple[int, ...]
) -> None:
    shared_mesh.shard.kill()
    shared_mesh.matchers["g1"].kill()
    await asyncio.to_thread(shared_mesh.start, shared_mesh.shard, shared_mesh.matchers["g1"])

    shard = mesh.shard
    buyer, seller = users[:2]
    await shard.run(
        hydrate(buyer, balances=[(USDT, FUNDS)]),
        hydrate(seller, balances=[("ETH", 10 * ETH_LOT)]),
    )
    await trade(
        shard, buyer, seller, "m4", price_ticks=ETH_PRICE, quantity_lots=5, symbol="ETH-USDT"
    )
    view = await eventually(lambda: shard.actor(buyer), lambda v: "ETH-USDT" in marks_of(v))
    assert marks_of(view) == {"ETH-USDT": ETH_PRICE}
    assert view.unrealized_pnl == 0
