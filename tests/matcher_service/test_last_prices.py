"""StreamLastPrices: the last trade price per symbol, after a crossing trade, never ahead
of the log: a price is streamed only once its trade is durable."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from protos.oms.v1 import matcher_pb2
from tests.matcher_service.held_log import (
    held_host,
    serve,
    serving_at_newest_version,
    stop_host,
    wait_until,
)
from tests.matcher_service.matcher_client import READ_TIMEOUT_S, MatcherClient
from tests.matcher_service.matcher_messages import (
    BTC,
    BUY,
    ETH,
    REFERENCE_TICKS,
    SELL,
    OrderFactory,
    submits,
)
from tests.matcher_service.matcher_process import aio_channel

REFERENCE = REFERENCE_TICKS[BTC]


async def price_of_trade(stream: grpc.aio.UnaryStreamCall, trade_id: int) -> matcher_pb2.LastPrice:
    """Read the price stream until the given trade shows up (earlier trades may come first)."""

    async def read() -> matcher_pb2.LastPrice:
        async for price in stream:
            if price.trade_id == trade_id:
                found: matcher_pb2.LastPrice = price
                return found
        raise AssertionError("the price stream ended")

    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            return await read()
    finally:
        stream.cancel()


async def test_the_last_trade_price_is_streamed_after_a_crossing_trade(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    subscribed_before = matcher.stub.StreamLastPrices(matcher_pb2.LastPriceRequest(symbols=[BTC]))
    price = REFERENCE + 37
    await matcher.submit(orders.limit(users[0], SELL, price, 2))
    await matcher.submit(orders.limit(users[1], BUY, price + 3, 2))
    fill = (await matcher.events(orders.shard))[-1]
    assert fill.WhichOneof("event") == "fill"
    expected = matcher_pb2.LastPrice(
        symbol=BTC,
        price_ticks=price,  # the resting order's price
        trade_id=fill.fill.trade_id,
        consensus_time_ms=fill.consensus_time_ms,
    )

    assert await price_of_trade(subscribed_before, fill.fill.trade_id) == expected

    # A stream opened later starts with the current last price of each wanted symbol.
    everything = matcher.stub.StreamLastPrices(matcher_pb2.LastPriceRequest())
    assert await price_of_trade(everything, fill.fill.trade_id) == expected
    eth_only = matcher.stub.StreamLastPrices(matcher_pb2.LastPriceRequest(symbols=[ETH]))
    eth = orders.limit(users[2], SELL, REFERENCE_TICKS[ETH], 3, symbol=ETH)
    await matcher.submit(eth)
    await matcher.submit(orders.limit(users[3], BUY, REFERENCE_TICKS[ETH], 3, symbol=ETH))
    eth_fill = (await matcher.events(orders.shard))[-1]
    eth_price = await price_of_trade(eth_only, eth_fill.fill.trade_id)
    assert (eth_price.symbol, eth_price.price_ticks) == (ETH, REFERENCE_TICKS[ETH])


async def test_a_price_is_streamed_only_once_its_trade_is_durable(tmp_path: Path) -> None:
    """In-process, on a log whose durability the test releases record by record."""
    host, log = held_host(tmp_path)
    serving, _ = serve(host)
    try:
        await serving_at_newest_version(host)
        orders = OrderFactory("held")
        async with aio_channel(f"127.0.0.1:{host.bound_port}") as channel:
            client = MatcherClient(channel)
            await client.submit(
                orders.limit(1, SELL, REFERENCE + 1, 1), orders.limit(1, SELL, REFERENCE + 2, 1)
            )
            prices = aiter(client.stub.StreamLastPrices(matcher_pb2.LastPriceRequest()))
            log.holding = True
            execute = client.stub.Execute()
            await execute.write(submits(orders.limit(2, BUY, REFERENCE + 1, 1)))  # trade 1
            await wait_until(lambda: len(log.held) == 1)
            await execute.write(submits(orders.limit(2, BUY, REFERENCE + 2, 1)))  # trade 2
            await wait_until(lambda: host.node.sequencer.statistics().pending_entries == 1)

            log.release_next()  # trade 1 is durable; trade 2 gets applied, its record held
            await wait_until(lambda: len(log.held) == 1)
            async with asyncio.timeout(READ_TIMEOUT_S):
                first = await anext(prices)
            assert (first.trade_id, first.price_ticks) == (1, REFERENCE + 1), (
                f"streamed {first} while trade 2 was not durable"
            )

            log.release_next()
            async with asyncio.timeout(READ_TIMEOUT_S):
                second = await anext(prices)
            assert (second.trade_id, second.price_ticks) == (2, REFERENCE + 2)
            await execute.done_writing()
            assert len([result async for result in execute]) == 2
    finally:
        await stop_host(host, log, serving)


async def test_prices_conflate_to_the_newest_within_the_interval_asked(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    # Long enough that three trades made one after another fall inside one interval.
    stream = matcher.stub.StreamLastPrices(
        matcher_pb2.LastPriceRequest(symbols=[BTC], min_interval_ms=2_000)
    )
    trade_ids: list[int] = []
    for step in range(3):
        price = REFERENCE + 50 + step
        await matcher.submit(orders.limit(users[0], SELL, price, 1))
        await matcher.submit(orders.limit(users[1], BUY, price, 1))
        fill = (await matcher.events(orders.shard))[-1]
        trade_ids.append(fill.fill.trade_id)

    received: list[matcher_pb2.LastPrice] = []

    async def read_until_newest() -> None:
        async for price in stream:
            received.append(price)
            if price.trade_id == trade_ids[-1]:
                return

    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            await read_until_newest()
    finally:
        stream.cancel()
    assert received[-1].price_ticks == REFERENCE + 52
    assert trade_ids[1] not in {price.trade_id for price in received}  # conflated away
