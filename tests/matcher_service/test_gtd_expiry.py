"""GTD orders expire at consensus time (the leader's clock stamped on log entries), also
when the matcher was killed before the expiry and restarted from its log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from protos.oms.v1 import matcher_pb2
from tests.matcher_service.event_replay import kind
from tests.matcher_service.matcher_client import MatcherClient
from tests.matcher_service.matcher_messages import (
    BTC,
    BUY,
    EXPIRED,
    GTD,
    OPEN,
    REFERENCE_TICKS,
    REJECTED,
    SELL,
    OrderFactory,
)
from tests.matcher_service.matcher_process import MatcherProcess, aio_channel

REFERENCE = REFERENCE_TICKS[BTC]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def assert_expires(
    client: MatcherClient, order: matcher_pb2.Order, accepted_sequence: int
) -> None:
    """The order's next event is Expired, not before its expire time; it is gone from the book."""
    (event,) = await client.next_events(order.order_id.split(":")[0], accepted_sequence + 1, 1)
    assert (event.order_id, kind(event)) == (order.order_id, "expired")
    assert event.expired.remaining_lots == order.quantity_lots
    assert event.consensus_time_ms >= order.expire_at_ms
    state = await client.get_order(order.order_id)
    assert state is not None and state.status == EXPIRED
    snapshot = await client.open_orders(order.order_id.split(":")[0], order.user_id)
    assert list(snapshot.orders) == []
    assert snapshot.as_of_sequence == event.sequence


async def test_a_gtd_order_expires_at_its_consensus_time(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    order = orders.limit(users[0], BUY, REFERENCE - 7, 2, time_in_force=GTD)
    order.expire_at_ms = now_ms() + 1_000
    stale = orders.limit(users[0], SELL, REFERENCE + 7, 1, time_in_force=GTD)
    stale.expire_at_ms = now_ms() - 1

    accepted, rejected = await matcher.submit(order, stale)

    assert accepted.order.status == OPEN
    assert rejected.order.status == REJECTED
    assert rejected.reject_reason == matcher_pb2.MATCHER_REJECT_REASON_EXPIRE_TIME_PASSED
    events = await matcher.events(orders.shard)
    assert [(e.order_id, kind(e)) for e in events] == [
        (order.order_id, "accepted"),
        (stale.order_id, "rejected"),
    ]
    await assert_expires(matcher, order, events[-1].sequence)


async def test_a_gtd_order_expires_after_a_crash_and_restart(
    new_matcher: Callable[..., MatcherProcess],
) -> None:
    process = new_matcher()
    await asyncio.to_thread(process.start_serving)
    orders = OrderFactory("gtd-restart")
    order = orders.limit(5, SELL, REFERENCE + 9, 3, time_in_force=GTD)
    order.expire_at_ms = now_ms() + 1_500
    async with aio_channel(process.address) as channel:
        (result,) = await MatcherClient(channel).submit(order)
        assert result.order.status == OPEN

    assert now_ms() < order.expire_at_ms, "too slow: the order expired before the kill"
    process.kill()
    await asyncio.to_thread(process.start_serving)

    async with aio_channel(process.address) as channel:
        await assert_expires(MatcherClient(channel), order, accepted_sequence=1)
