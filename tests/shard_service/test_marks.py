"""Mark prices: many ticks are conflated per symbol; the actor sees the newest only."""

from __future__ import annotations

from collections.abc import AsyncIterator

from protos.oms.v1 import shard_pb2
from tests.shard_service.shard_client import (
    BTC,
    BTC_LOT,
    BTC_TICK,
    ShardClient,
    deposit,
    eventually,
    hydrate,
)

TICKS = 500
LOTS = 10
COST_BASIS = LOTS * 6_000_000 * BTC_TICK


async def test_many_ticks_are_conflated_and_the_newest_wins(
    shard: ShardClient, users: tuple[int, ...]
) -> None:
    user = users[0]
    await shard.run(
        hydrate(user, balances=[("BTC", LOTS * BTC_LOT)], positions=[(BTC, LOTS, COST_BASIS)]),
        deposit(user, 1),
    )
    before = await shard.status()
    newest = 6_100_000 + TICKS
    prices = [6_100_000 + index for index in range(1, TICKS + 1)]
    assert prices[-1] == newest

    async def ticks() -> AsyncIterator[shard_pb2.MarkPrices]:
        # Several messages in quick succession, many ticks each.
        for start in range(0, TICKS, 100):
            yield shard_pb2.MarkPrices(
                prices=[
                    shard_pb2.MarkPrice(symbol=BTC, price_ticks=price)
                    for price in prices[start : start + 100]
                ]
            )

    await shard.stub.PublishMarks(ticks(), timeout=10)

    def newest_mark(view: shard_pb2.ActorView) -> bool:
        return [(m.symbol, m.price_ticks) for m in view.marks] == [(BTC, newest)]

    view = await eventually(lambda: shard.actor(user), newest_mark)
    assert view.unrealized_pnl == LOTS * newest * BTC_TICK - COST_BASIS

    after = await shard.status()
    received = after.counters["ticks_received"] - before.counters["ticks_received"]
    conflated = after.counters["ticks_conflated"] - before.counters["ticks_conflated"]
    assert received == TICKS
    # Each conflation interval logs one price for the symbol; the others were dropped.
    # 5 messages can span at most a few intervals, so nearly all ticks are conflated.
    assert TICKS - 5 <= conflated < TICKS
