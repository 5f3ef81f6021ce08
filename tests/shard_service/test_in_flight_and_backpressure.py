"""GetInFlight (the bridge's work queue) and backpressure, each on a dedicated shard."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from protos.oms.v1 import common_pb2, shard_pb2
from tests.shard_service.shard_client import (
    USDT,
    ShardClient,
    accepted_event,
    balance,
    cancel,
    deposit,
    hydrate,
    limit_order,
    matcher_events,
    unpositioned,
)
from tests.shard_service.shard_process import ShardProcess, aio_channel

USER = 7
PRICE = 6_500_000


async def _client_of(process: ShardProcess) -> AsyncIterator[ShardClient]:
    process.start_serving()
    async with aio_channel(process.address) as channel:
        yield ShardClient(channel)


@pytest.fixture
async def own_shard(new_shard: Callable[..., ShardProcess]) -> AsyncIterator[ShardClient]:
    async for client in _client_of(new_shard()):
        yield client


@pytest.fixture
async def tiny_shard(new_shard: Callable[..., ShardProcess]) -> AsyncIterator[ShardClient]:
    async for client in _client_of(new_shard(environment={"OMS_SHARD_MAX_IN_FLIGHT": "2"})):
        yield client


def _in_flight(snapshot: shard_pb2.InFlightSnapshot) -> list[tuple[str, str]]:
    out = []
    for item in snapshot.items:
        kind = item.WhichOneof("egress")
        order_id = item.submit.order.order_id if kind == "submit" else item.cancel.order_id
        out.append((kind or "", order_id))
    return sorted(out)


async def test_in_flight_lists_exactly_the_unanswered_sagas(own_shard: ShardClient) -> None:
    shard = own_shard
    assert not (await shard.in_flight()).items
    await shard.run(hydrate(USER), deposit(USER, 10_000_000_000))
    first, second = await shard.run(
        limit_order(USER, "f-1", price_ticks=PRICE, quantity_lots=1),
        limit_order(USER, "f-2", price_ticks=PRICE, quantity_lots=2),
    )
    assert first.accepted and second.accepted
    snapshot = await shard.in_flight()
    assert _in_flight(snapshot) == [("submit", first.order_id), ("submit", second.order_id)]
    assert snapshot.as_of_position >= second.stamp.position
    submits = {item.submit.order.order_id: item.submit for item in snapshot.items}
    assert submits[second.order_id].order.quantity_lots == 2
    assert submits[second.order_id].matcher_group == "g1"

    await shard.run(matcher_events([accepted_event(1, first.order_id, USER)]))
    assert _in_flight(await shard.in_flight()) == [("submit", second.order_id)]

    (cancelling,) = await shard.run(cancel(USER, first.order_id))
    assert cancelling.accepted, cancelling
    snapshot = await shard.in_flight()
    assert _in_flight(snapshot) == [("cancel", first.order_id), ("submit", second.order_id)]
    status = await shard.status()
    assert status.in_flight_sagas == 2
    # A timer entry (every 100 ms) may land between the two queries.
    assert cancelling.stamp.position <= snapshot.as_of_position <= status.applied_position


async def test_backpressure_is_retryable_and_changes_nothing(tiny_shard: ShardClient) -> None:
    shard = tiny_shard
    await shard.run(hydrate(USER), deposit(USER, 10_000_000_000))
    one, two = await shard.run(
        limit_order(USER, "k-1", price_ticks=PRICE, quantity_lots=1),
        limit_order(USER, "k-2", price_ticks=PRICE, quantity_lots=1),
    )
    assert one.accepted and two.accepted
    before = unpositioned(await shard.actor(USER))
    (third,) = await shard.run(limit_order(USER, "k-3", price_ticks=PRICE, quantity_lots=1))
    assert not third.accepted
    assert third.reject_reason == shard_pb2.SHARD_REJECT_REASON_BACKPRESSURE
    assert third.retryable
    assert unpositioned(await shard.actor(USER)) == before
    assert (await shard.status()).counters["refused_backpressure"] == 1

    # Once the matcher answers one saga, the retry (same client order id) gets through.
    await shard.run(matcher_events([accepted_event(1, one.order_id, USER)]))
    (retried,) = await shard.run(limit_order(USER, "k-3", price_ticks=PRICE, quantity_lots=1))
    assert retried.accepted, retried
    assert retried.order_id == f"s1:{USER}:3"
    assert retried.status == common_pb2.ORDER_STATUS_PENDING
    view = await shard.actor(USER)
    assert len(view.open_orders) == 3
    assert balance(view, USDT).reserved == 3 * balance(before, USDT).reserved // 2
