"""Contract 4 over the wire: the per-user open-orders snapshot and the sequence it is as-of."""

from __future__ import annotations

import grpc
import pytest

from protos.oms.v1 import matcher_pb2
from services.serving.user_batches import MAX_USERS_PER_QUERY
from tests.matcher_service.event_replay import StreamReplay, snapshot_orders
from tests.matcher_service.matcher_client import READ_TIMEOUT_S, MatcherClient
from tests.matcher_service.matcher_messages import BTC, BUY, REFERENCE_TICKS, OrderFactory
from tests.matcher_service.order_mix import OrderMix


async def assert_snapshots_match_the_stream(
    matcher: MatcherClient, replay: StreamReplay, users: tuple[int, ...]
) -> None:
    """Read the stream up to its end, then compare every user's snapshot with the replay."""
    end = await matcher.last_sequence(replay.shard)
    replay.apply_all(await matcher.events(replay.shard, replay.last_sequence + 1, end))
    for user_id in users:
        snapshot = await matcher.open_orders(replay.shard, user_id)
        assert snapshot.as_of_sequence == replay.last_sequence == end
        assert snapshot_orders(snapshot) == replay.open_for(user_id), user_id
        for state in snapshot.orders:
            assert state.order.user_id == user_id
            assert state.order.order_id.startswith(f"{replay.shard}:")


async def test_open_orders_equal_what_the_event_stream_implies(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    # The same users also trade from a second shard: those orders must not show up.
    other = OrderFactory(f"{orders.shard}-b")
    mix = OrderMix((orders, other), users[:5], seed=11)
    replay = StreamReplay(orders.shard)
    other_replay = StreamReplay(other.shard)

    for _ in range(3):
        await matcher.execute(*mix.batches(5, 30))
        await assert_snapshots_match_the_stream(matcher, replay, users)
        await assert_snapshots_match_the_stream(matcher, other_replay, users)
    assert any(replay.open_for(user_id) for user_id in users)
    assert any(other_replay.open_for(user_id) for user_id in users)


async def test_a_user_without_orders_gets_an_empty_snapshot_as_of_the_shards_end(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    empty = await matcher.open_orders(orders.shard, users[0])
    assert (empty.as_of_sequence, list(empty.orders)) == (0, [])

    await matcher.submit(orders.limit(users[1], BUY, REFERENCE_TICKS[BTC] - 3, 2))
    snapshot = await matcher.open_orders(orders.shard, users[0])
    assert (snapshot.as_of_sequence, list(snapshot.orders)) == (1, [])


async def test_a_batch_of_users_gets_each_users_snapshot_in_order_and_a_huge_one_is_refused(
    matcher: MatcherClient, orders: OrderFactory, users: tuple[int, ...]
) -> None:
    """`GetOpenOrderBatch` (the reconciler's one call per round and group) answers what
    `GetOpenOrders` answers for each user, in the order asked, as of one sequence."""
    mix = OrderMix((orders,), users[:5], seed=5)
    await matcher.execute(*mix.batches(4, 25))
    asked = [*reversed(users), 999_999]  # the last one never traded
    batch = await matcher.stub.GetOpenOrderBatch(
        matcher_pb2.OpenOrdersBatchQuery(oms_shard=orders.shard, user_ids=asked),
        timeout=READ_TIMEOUT_S,
    )
    assert [snapshot.user_id for snapshot in batch.snapshots] == asked
    for snapshot in batch.snapshots:
        single = await matcher.open_orders(orders.shard, snapshot.user_id)
        assert snapshot.as_of_sequence == single.as_of_sequence
        assert list(snapshot.orders) == list(single.orders)
    assert any(snapshot.orders for snapshot in batch.snapshots)
    assert not batch.snapshots[-1].orders

    too_many = list(range(1, MAX_USERS_PER_QUERY + 2))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await matcher.stub.GetOpenOrderBatch(
            matcher_pb2.OpenOrdersBatchQuery(oms_shard=orders.shard, user_ids=too_many),
            timeout=READ_TIMEOUT_S,
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {MAX_USERS_PER_QUERY}" in (refused.value.details() or "")
