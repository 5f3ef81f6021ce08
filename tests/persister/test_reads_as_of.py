"""Reads of what the shard wrote behind, exact as of a shard position.

The persister follows the shard's egress with `through_positions`, so its
written-through position reaches the shard's even while the shard logs only
timers; a read as of a position waits for the writes before it (so an order
whose row is still in the write-behind is found), and says BEHIND, retryable,
once its wait is over.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from protos.oms.v1 import common_pb2, persister_pb2
from tests.persister.conftest import Mesh
from tests.persister.persister_client import PersisterClient, reason_of
from tests.shard_service.shard_client import (
    BTC_LOT,
    ShardClient,
    accepted_event,
    deposit,
    eventually,
    fill_event,
    limit_order,
    matcher_events,
)
from tests.shard_service.shard_process import aio_channel

PRICE = 6_500_000
READ_WAIT_MS = 300


async def test_written_through_follows_the_shard_past_positions_with_nothing_to_write(
    start_mesh: Callable[..., Mesh],
) -> None:
    mesh = start_mesh()
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        shard = ShardClient(shard_channel)
        persister = PersisterClient(persister_channel)
        user = (await persister.create_user()).user_id
        (funded,) = await shard.run(deposit(user, 1_000))
        # Only timers are logged from now on (every 100 ms): nothing for the persister.
        applied = await eventually(
            shard.status, lambda s: s.applied_position > funded.stamp.position + 5
        )
        await eventually(
            persister.counters,
            lambda c: c["committed_position"] >= applied.applied_position,
        )


async def test_reads_as_of_a_position_see_every_write_before_it(
    start_mesh: Callable[..., Mesh],
) -> None:
    mesh = start_mesh(persister_environment={"OMS_PERSISTER_READ_WAIT_MS": str(READ_WAIT_MS)})
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        shard = ShardClient(shard_channel)
        persister = PersisterClient(persister_channel)
        buyer = (await persister.create_user()).user_id
        seller = (await persister.create_user()).user_id
        await shard.run(deposit(buyer, 10_000_000_000), deposit(seller, 5 * BTC_LOT, asset="BTC"))
        placed = []
        for n in range(5):
            (order,) = await shard.run(
                limit_order(buyer, f"b-{n}", price_ticks=PRICE, quantity_lots=1)
            )
            placed.append(order)
            # At once, as of the order's own position: the row is there (waited for).
            stored = await persister.stub.GetStoredOrder(
                persister_pb2.StoredOrderQuery(
                    user_id=buyer, client_order_id=f"b-{n}", as_of_position=order.stamp.position
                )
            )
            assert (stored.order_id, stored.user_seq) == (order.order_id, n + 1)
            assert stored.status == common_pb2.ORDER_STATUS_PENDING
        (sell,) = await shard.run(
            limit_order(
                seller, "s-0", price_ticks=PRICE, quantity_lots=2, side=common_pb2.SIDE_SELL
            )
        )
        events = [
            accepted_event(1, placed[0].order_id, buyer),
            accepted_event(2, sell.order_id, seller),
            fill_event(
                3, placed[0].order_id, buyer, price_ticks=PRICE, quantity_lots=1,
                remaining_lots=0, trade_id=7,
            ),
        ]  # fmt: skip
        (result,) = await shard.run(matcher_events(events), deposit(buyer, 1))
        as_of = result.stamp.position

        page = await persister.stub.ListOrders(
            persister_pb2.OrderPageQuery(user_id=buyer, limit=3, as_of_position=as_of)
        )
        assert [o.client_order_id for o in page.orders] == ["b-0", "b-1", "b-2"] and page.more
        assert page.orders[0].status == common_pb2.ORDER_STATUS_FILLED
        assert page.orders[0].updated_at_ms >= page.orders[0].accepted_at_ms > 0
        last = page.orders[-1]
        rest = await persister.stub.ListOrders(
            persister_pb2.OrderPageQuery(
                user_id=buyer,
                limit=3,
                after_accepted_at_ms=last.accepted_at_ms,
                after_user_seq=last.user_seq,
                as_of_position=as_of,
            )
        )
        assert [o.client_order_id for o in rest.orders] == ["b-3", "b-4"] and not rest.more
        filled = await persister.stub.ListOrders(
            persister_pb2.OrderPageQuery(
                user_id=buyer,
                limit=10,
                statuses=[common_pb2.ORDER_STATUS_FILLED],
                as_of_position=as_of,
            )
        )
        assert [o.client_order_id for o in filled.orders] == ["b-0"]
        fills = await persister.stub.ListFills(
            persister_pb2.FillPageQuery(user_id=buyer, limit=10, as_of_position=as_of)
        )
        (fill,) = fills.fills
        assert (fill.order_id, fill.client_order_id, fill.trade_id) == (
            placed[0].order_id,
            "b-0",
            7,
        )

        # A position the shard has not reached: BEHIND, retryable, after the read wait.
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await persister.stub.GetStoredOrder(
                persister_pb2.StoredOrderQuery(
                    order_id=placed[0].order_id, as_of_position=as_of + 1_000_000
                )
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert reason_of(refused.value) == "PERSISTER_ERROR_REASON_BEHIND"
        assert time.monotonic() - started < READ_WAIT_MS / 1000 + 1.0
        assert (await persister.counters())["reads_behind"] == 1

        for bad in (
            persister_pb2.OrderPageQuery(user_id=buyer, limit=0),
            persister_pb2.OrderPageQuery(user_id=buyer, limit=1_001),
            persister_pb2.OrderPageQuery(limit=10),
            persister_pb2.OrderPageQuery(user_id=buyer, limit=10, from_ms=5, to_ms=5),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as invalid:
                await persister.stub.ListOrders(bad)
            assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
            assert reason_of(invalid.value) == "PERSISTER_ERROR_REASON_INVALID_FIELD"


async def test_a_reader_waiting_for_a_position_has_it_written_at_once(
    start_mesh: Callable[..., Mesh],
) -> None:
    """The write-behind writes every interval, or at once when a read waits for a
    position: with an interval far longer than the read's wait, the read still sees
    the order's row, in much less than the interval."""
    mesh = start_mesh(
        persister_environment={
            "OMS_PERSISTER_WRITE_INTERVAL_MS": "5000",
            "OMS_PERSISTER_READ_WAIT_MS": "2000",
        }
    )
    async with (
        aio_channel(mesh.shard.address) as shard_channel,
        aio_channel(mesh.persister.address) as persister_channel,
    ):
        shard = ShardClient(shard_channel)
        persister = PersisterClient(persister_channel)
        buyer = (await persister.create_user()).user_id
        await shard.run(deposit(buyer, 10_000_000_000))
        for n in range(3):
            (order,) = await shard.run(
                limit_order(buyer, f"hurry-{n}", price_ticks=PRICE, quantity_lots=1)
            )
            started = time.monotonic()
            stored = await persister.stub.GetStoredOrder(
                persister_pb2.StoredOrderQuery(
                    user_id=buyer, client_order_id=f"hurry-{n}", as_of_position=order.stamp.position
                )
            )
            waited_s = time.monotonic() - started
            assert stored.order_id == order.order_id
            assert waited_s < 2.0, waited_s  # the read's own wait; the interval is 5 s
