"""The queries the mesh's own services make: ListUsers, matcher sequences, the books,
and the shared `ShardLink` client that the gateway, persister and bridge use."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from protos.oms.v1 import shard_pb2
from services.clients.shard_link import ShardLink, ShardUnavailableError
from services.serving.user_batches import MAX_USERS_PER_QUERY
from tests.shard_service.shard_client import (
    USDT,
    WAIT_S,
    ShardClient,
    accepted_event,
    deposit,
    hydrate,
    limit_order,
    matcher_events,
)
from tests.shard_service.shard_process import ShardProcess, aio_channel

PRICE = 6_500_000


@pytest.fixture
async def shard_process(new_shard: Callable[..., ShardProcess]) -> AsyncIterator[ShardProcess]:
    process = new_shard()
    process.start_serving()
    yield process


async def test_list_users_pages_in_id_order_and_filters_by_orders(
    shard_process: ShardProcess,
) -> None:
    async with aio_channel(shard_process.address) as channel:
        shard = ShardClient(channel)
        for user_id in (30, 10, 20, 40):
            await shard.run(hydrate(user_id), deposit(user_id, 10_000_000_000))
        (placed,) = await shard.run(limit_order(20, "q-1", price_ticks=PRICE, quantity_lots=1))
        assert placed.accepted
        await shard.run(matcher_events([accepted_event(1, placed.order_id, 20)]))

        first = await shard.stub.ListUsers(shard_pb2.UserPageRequest(limit=3))
        assert list(first.user_ids) == [10, 20, 30] and first.next_after_user_id == 30
        rest = await shard.stub.ListUsers(shard_pb2.UserPageRequest(after_user_id=30, limit=3))
        assert list(rest.user_ids) == [40] and rest.next_after_user_id == 0
        holders = await shard.stub.ListUsers(
            shard_pb2.UserPageRequest(limit=10, with_orders_only=True)
        )
        assert list(holders.user_ids) == [20]

        snapshot = await shard.in_flight()
        assert dict(snapshot.matcher_sequences) == {"g1": 1}
        status = await shard.status()
        usdt = next(books for books in status.accounts if books.asset == USDT)
        assert usdt.deposits == 4 * 10_000_000_000 and usdt.resident == usdt.deposits
        assert usdt.clearing == usdt.fees == 0


async def test_actor_batch_answers_each_users_view_in_order_and_refuses_a_huge_one(
    shard_process: ShardProcess,
) -> None:
    """`GetActorBatch` (the reconciler's one call per round) answers what `GetActor`
    answers for each user, in the order asked, as of one applied position."""
    async with aio_channel(shard_process.address) as channel:
        shard = ShardClient(channel)
        for user_id in (11, 12):
            await shard.run(hydrate(user_id), deposit(user_id, 10_000_000_000))
        (placed,) = await shard.run(limit_order(12, "b-1", price_ticks=PRICE, quantity_lots=1))
        assert placed.accepted

        asked = [12, 99, 11]  # 99 is not resident
        batch = await shard.stub.GetActorBatch(
            shard_pb2.ActorBatchQuery(user_ids=asked), timeout=WAIT_S
        )
        assert [view.user_id for view in batch.views] == asked
        assert len({view.as_of_position for view in batch.views}) == 1
        for view in batch.views:
            single = await shard.actor(view.user_id)
            assert view.resident == single.resident
            assert list(view.open_orders) == list(single.open_orders)
            assert view.state == single.state
        assert [order.order_id for order in batch.views[0].open_orders] == [placed.order_id]
        assert not batch.views[1].resident

        too_many = list(range(1, MAX_USERS_PER_QUERY + 2))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await shard.stub.GetActorBatch(
                shard_pb2.ActorBatchQuery(user_ids=too_many), timeout=WAIT_S
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_shard_link_batches_commands_and_returns_finals(
    shard_process: ShardProcess,
) -> None:
    link = ShardLink(shard_process.address)
    try:
        await link.send([hydrate(5)])
        funded = await link.execute(deposit(5, 10_000_000_000))
        assert funded.accepted, funded
        orders = [limit_order(5, f"l-{n}", price_ticks=PRICE, quantity_lots=1) for n in range(50)]
        results = await asyncio.gather(*(link.execute(order) for order in orders))
        assert all(result.accepted for result in results)
        assert len({result.order_id for result in results}) == 50
        assert link.sent_batches < link.sent_commands  # one loop turn, one batch
        again = await link.execute(limit_order(5, "l-0", price_ticks=PRICE, quantity_lots=1))
        assert again.duplicate and again.order_id == results[0].order_id
    finally:
        await link.close()


async def test_shard_link_loses_nothing_queued_after_the_shard_restarts(
    shard_process: ShardProcess,
) -> None:
    link = ShardLink(shard_process.address)
    try:
        await link.send([hydrate(8)])
        assert (await link.execute(deposit(8, 1_000))).accepted
        shard_process.kill()
        with pytest.raises(ShardUnavailableError):
            await link.execute(deposit(8, 1_000))
        await link.wait_broken()
        shard_process.start_serving()
        await link.wait_ready(10)
        # The first commands after the break: a mesh command (no answer to notice its loss)
        # and a client command that only succeeds if the mesh command arrived first.
        await link.send([hydrate(9)])
        async with asyncio.timeout(10):
            funded = await link.execute(deposit(9, 2_000))
        assert funded.accepted and not funded.parked, funded
        assert link.breaks >= 1
    finally:
        await link.close()


async def test_shard_link_times_out_a_command_that_gets_no_final_result(
    shard_process: ShardProcess,
) -> None:
    link = ShardLink(shard_process.address)
    try:
        # No persister answers the hydration: the deposit stays parked, never final.
        with pytest.raises(TimeoutError):
            await link.execute(deposit(404, 1_000), timeout_s=0.3)
        assert link.timeouts == 1
        await link.send([hydrate(405)])
        assert (await link.execute(deposit(405, 1_000), timeout_s=5)).accepted
    finally:
        await link.close()
