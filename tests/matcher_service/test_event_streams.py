"""Contract 3 over the wire: ordered, contiguous, exactly-once events per OMS shard; resumes."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import grpc
import pytest

from protos.oms.v1 import matcher_pb2
from tests.matcher_service.event_replay import StreamReplay, assert_contiguous, kind
from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_messages import (
    BTC,
    BUY,
    PARTIALLY_FILLED,
    REFERENCE_TICKS,
    SELL,
    OrderFactory,
)
from tests.matcher_service.matcher_process import MatcherProcess, aio_channel
from tests.matcher_service.order_mix import OrderMix

REFERENCE = REFERENCE_TICKS[BTC]


async def test_orders_of_two_shards_crossing_land_in_each_shards_own_stream(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    other = OrderFactory(f"{orders.shard}-b")
    maker = orders.limit(users[0], SELL, REFERENCE + 5, 2)
    taker = other.limit(users[1], BUY, REFERENCE + 5, 3)
    await matcher.submit(maker)
    (taker_result,) = await matcher.submit(taker)
    assert taker_result.order.status == PARTIALLY_FILLED

    maker_events = await matcher.events(orders.shard)
    taker_events = await matcher.events(other.shard)

    assert [(e.sequence, e.order_id, kind(e)) for e in maker_events] == [
        (1, maker.order_id, "accepted"),
        (2, maker.order_id, "fill"),
    ]
    assert [(e.sequence, e.order_id, kind(e)) for e in taker_events] == [
        (1, taker.order_id, "accepted"),
        (2, taker.order_id, "fill"),
    ]
    maker_fill, taker_fill = maker_events[1].fill, taker_events[1].fill
    notional = (REFERENCE + 5) * 2
    assert maker_fill.trade_id == taker_fill.trade_id
    assert (maker_fill.maker, taker_fill.maker) == (True, False)
    assert (maker_fill.side, taker_fill.side) == (SELL, BUY)
    assert maker_fill.price_ticks == taker_fill.price_ticks == REFERENCE + 5
    assert maker_fill.quantity_lots == taker_fill.quantity_lots == 2
    assert maker_fill.notional == taker_fill.notional == notional
    assert (maker_fill.fee, taker_fill.fee) == (
        notional * 1_000 // 10**6,
        notional * 2_000 // 10**6,
    )
    assert (maker_fill.remaining_lots, maker_fill.order_done) == (0, True)
    assert (taker_fill.remaining_lots, taker_fill.order_done) == (1, False)
    assert maker_events[1].consensus_time_ms == taker_events[1].consensus_time_ms
    assert all(e.oms_shard == orders.shard and e.user_id == users[0] for e in maker_events)
    assert all(e.oms_shard == other.shard and e.user_id == users[1] for e in taker_events)


async def test_events_are_contiguous_per_shard_and_follow_each_orders_grammar(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    factories = (orders, OrderFactory(f"{orders.shard}-b"))
    mix = OrderMix(factories, users[:6], seed=3)
    await matcher.execute(*mix.batches(12, 40))

    replays = []
    for factory in factories:
        events = await matcher.events(factory.shard)
        assert_contiguous(events)
        replays.append(StreamReplay(factory.shard).apply_all(events))

    created = Counter(order_id for replay in replays for order_id in replay.created)
    assert created == Counter(order.order_id for order in mix.submitted)  # each exactly once
    trades: Counter[int] = Counter()
    for replay in replays:
        trades.update(replay.trade_ids)
    assert trades and set(trades.values()) == {2}  # a maker fill and a taker fill per trade


async def test_subscribe_from_a_middle_sequence_resumes_exactly_there(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    mix = OrderMix((orders,), users[:4], seed=5)
    await matcher.execute(*mix.batches(4, 25))
    everything = await matcher.events(orders.shard)
    assert len(everything) > 20

    for middle in (2, len(everything) // 2, len(everything)):
        resumed = await matcher.events(orders.shard, middle, len(everything))
        assert resumed == everything[middle - 1 :]

    # From the end + 1: nothing yet; the next event arrives live, exactly once.
    live = asyncio.create_task(matcher.next_events(orders.shard, len(everything) + 1, 1))
    new_order = orders.limit(users[0], BUY, REFERENCE - 50, 1)
    await matcher.submit(new_order)
    (event,) = await live
    assert (event.sequence, event.order_id, kind(event)) == (
        len(everything) + 1,
        new_order.order_id,
        "accepted",
    )


async def test_a_sequence_older_than_the_retained_window_is_out_of_range(
    new_matcher: Callable[..., MatcherProcess],
) -> None:
    process = new_matcher(environment={"OMS_MATCHER_RETAINED_EVENTS": "4"})
    await asyncio.to_thread(process.start_serving)
    orders = OrderFactory("window")
    async with aio_channel(process.address) as channel:
        client = MatcherClient(channel)
        await client.submit(*(orders.limit(7, BUY, REFERENCE - k, 1) for k in range(1, 7)))

        retained = await client.events(orders.shard, 3)
        assert [event.sequence for event in retained] == [3, 4, 5, 6]
        for too_old in (1, 2):
            call = client.stub.Subscribe(
                matcher_pb2.SubscribeRequest(oms_shard=orders.shard, from_sequence=too_old)
            )
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await anext(aiter(call))
            assert raised.value.code() == grpc.StatusCode.OUT_OF_RANGE
