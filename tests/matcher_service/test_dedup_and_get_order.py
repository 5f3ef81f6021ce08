"""Contract 1 + 2 over the wire: a known order id creates nothing and returns the existing order.

"Creates nothing" is read from the shard's event stream: after the duplicates, a
fence order is the next thing in the stream, so no event was emitted for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from protos.oms.v1 import matcher_pb2
from services.clients.matcher_results import EXCEPTIONS_ONLY_METADATA
from tests.matcher_service.event_replay import kind
from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_messages import (
    BTC,
    BUY,
    CANCELLED,
    FILLED,
    IOC,
    OPEN,
    PARTIALLY_FILLED,
    REFERENCE_TICKS,
    REJECTED,
    SELL,
    OrderFactory,
    batch,
    cancel,
    submits,
)
from tests.matcher_service.matcher_process import MatcherProcess, aio_channel

REFERENCE = REFERENCE_TICKS[BTC]


def copy_of(order: matcher_pb2.Order, **changes: int) -> matcher_pb2.Order:
    """The same order id with other content (a buggy or replayed client)."""
    changed = matcher_pb2.Order()
    changed.CopyFrom(order)
    for name, value in changes.items():
        setattr(changed, name, value)
    return changed


async def test_a_duplicate_in_the_same_batch_returns_the_first_order(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    before = await matcher.last_sequence(orders.shard)
    order = orders.limit(users[0], BUY, REFERENCE - 10, 2)
    other_price = copy_of(order, price_ticks=REFERENCE - 20, quantity_lots=5)

    first, again, changed = await matcher.submit(order, order, other_price)

    assert not first.duplicate and first.order.status == OPEN
    assert first.order.order == order
    assert again.duplicate and again.order == first.order
    assert changed.duplicate and changed.order == first.order  # the existing order wins
    assert not again.reject_reason and not changed.reject_reason
    events = await matcher.events_before_fence(orders, users[-1], before)
    assert [(e.order_id, kind(e)) for e in events] == [(order.order_id, "accepted")]
    assert await matcher.get_order(order.order_id) == first.order
    snapshot = await matcher.open_orders(orders.shard, users[0])
    assert list(snapshot.orders) == [first.order]


async def test_a_duplicate_in_a_later_batch_returns_the_current_state(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    maker = orders.limit(users[0], SELL, REFERENCE, 3)
    taker = orders.limit(users[1], BUY, REFERENCE, 1)
    await matcher.submit(maker)
    await matcher.submit(taker)
    before = await matcher.last_sequence(orders.shard)

    (maker_again,) = await matcher.submit(maker)
    taker_again, maker_changed = await matcher.submit(taker, copy_of(maker, side=BUY))

    assert maker_again.duplicate
    assert maker_again.order.status == PARTIALLY_FILLED
    assert (maker_again.order.filled_lots, maker_again.order.remaining_lots) == (1, 2)
    assert maker_again.order == await matcher.get_order(maker.order_id)
    assert maker_changed.duplicate and maker_changed.order == maker_again.order
    assert taker_again.duplicate and taker_again.order.status == FILLED
    assert taker_again.order == await matcher.get_order(taker.order_id)
    assert await matcher.events_before_fence(orders, users[-1], before) == []


async def test_a_duplicate_after_the_order_finished_creates_nothing(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    resting = orders.limit(users[0], BUY, REFERENCE - 5, 2)
    unfilled_ioc = orders.limit(users[1], SELL, REFERENCE + 5, 1, time_in_force=IOC)
    out_of_band = orders.limit(users[2], BUY, REFERENCE * 2, 1)
    await matcher.submit(resting, unfilled_ioc, out_of_band)
    await matcher.run(cancel(resting))
    before = await matcher.last_sequence(orders.shard)

    # The rejected id comes back now with a valid price: still the rejected order.
    results = await matcher.submit(
        resting, unfilled_ioc, copy_of(out_of_band, price_ticks=REFERENCE)
    )

    assert [result.duplicate for result in results] == [True, True, True]
    assert [result.order.status for result in results] == [CANCELLED, CANCELLED, REJECTED]
    assert results[2].reject_reason == matcher_pb2.MATCHER_REJECT_REASON_OUTSIDE_PRICE_BAND
    assert results[2].order.order.price_ticks == REFERENCE * 2
    for result in results:
        assert result.order == await matcher.get_order(result.order.order.order_id)
    assert await matcher.events_before_fence(orders, users[-1], before) == []
    assert list((await matcher.open_orders(orders.shard, users[0])).orders) == []


async def test_get_order_answers_by_id_and_not_found_for_unknown_ids(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    maker = orders.limit(users[0], SELL, REFERENCE + 1, 4)
    taker = orders.limit(users[1], BUY, REFERENCE + 1, 3)
    (accepted,) = await matcher.submit(maker)
    assert await matcher.get_order(maker.order_id) == accepted.order

    await matcher.submit(taker)
    state = await matcher.get_order(maker.order_id)
    assert state is not None
    assert state.order == maker
    assert state.status == PARTIALLY_FILLED
    assert (state.filled_lots, state.remaining_lots) == (3, 1)
    assert state.filled_notional == (REFERENCE + 1) * 3  # tick_size 1
    assert state.fees_paid == state.filled_notional * 1_000 // 1_000_000  # maker fee
    taker_state = await matcher.get_order(taker.order_id)
    assert taker_state is not None and taker_state.status == FILLED
    assert taker_state.fees_paid == taker_state.filled_notional * 2_000 // 1_000_000

    assert await matcher.get_order(orders.order_id(users[0])) is None  # well formed, unknown
    assert await matcher.get_order("not an order id") is None


async def test_an_id_is_known_for_the_orders_life_and_the_dedup_horizon_after_it(
    new_matcher: Callable[..., MatcherProcess],
) -> None:
    horizon_ms = 1_000
    process = new_matcher(environment={"OMS_MATCHER_DEDUP_HORIZON_MS": str(horizon_ms)})
    await asyncio.to_thread(process.start_serving)
    orders = OrderFactory("horizon")
    finished = orders.limit(4, SELL, REFERENCE + 3, 1, time_in_force=IOC)  # nothing to match
    resting = orders.limit(4, BUY, REFERENCE - 3, 1)
    async with aio_channel(process.address) as channel:
        client = MatcherClient(channel)
        await client.submit(finished, resting)
        ended = (await client.events(orders.shard))[1]
        assert (ended.order_id, kind(ended)) == (finished.order_id, "cancelled")
        (again,) = await client.submit(finished)
        assert again.duplicate

        deadline = time.monotonic() + 10 * horizon_ms / 1000
        while await client.get_order(finished.order_id) is not None:
            assert time.monotonic() < deadline, "the finished order was never forgotten"
            await asyncio.sleep(0.05)
        assert time.time_ns() // 1_000_000 >= ended.consensus_time_ms + horizon_ms

        (still_resting,) = await client.submit(resting)  # live orders are never forgotten
        assert still_resting.duplicate and still_resting.order.status == OPEN
        (anew,) = await client.submit(finished)  # past the horizon the id is free again
        assert not anew.duplicate


async def test_a_caller_asking_for_exceptions_only_hears_of_duplicates_and_unknown_cancels(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    """The bridge reads Execute's results only to count duplicates and cancels of unknown
    ids: with EXCEPTIONS_ONLY a batch of fresh orders is answered with no message at all,
    the stream ends when the writer's side does, and an exceptional one is reported."""
    fresh = [orders.limit(users[0], BUY, REFERENCE - 30 - n, 1) for n in range(3)]
    unknown = orders.limit(users[1], BUY, REFERENCE - 40, 1)  # never submitted
    batches = [
        submits(*fresh),
        submits(fresh[0], orders.limit(users[0], BUY, REFERENCE - 50, 1)),
        batch(cancel(unknown)),
    ]
    call = matcher.stub.Execute(iter(batches), metadata=EXCEPTIONS_ONLY_METADATA)
    answers = [answer async for answer in call]
    assert [[(r.duplicate, r.not_found) for r in a.results] for a in answers] == [
        [(True, False)],
        [(False, True)],
    ]
    assert answers[0].results[0].correlation_id == batches[1].commands[0].correlation_id
    # Every order of the silent batches was logged all the same.
    for order in fresh:
        state = await matcher.get_order(order.order_id)
        assert state is not None and state.status == OPEN
