"""Parked results: a command for a non-resident user is answered `parked`, then finally on
the stream that sent it once a HydrateUser lands, even when the hydration comes from another
stream (as the persister's does)."""

from __future__ import annotations

from protos.oms.v1 import common_pb2, shard_pb2
from tests.shard_service.shard_client import (
    USDT,
    ShardClient,
    balance,
    deposit,
    hydrate,
    limit_order,
)


async def _hydrate_request(shard: ShardClient, user: int) -> shard_pb2.HydrateRequest:
    def asked(items: list[shard_pb2.ShardEgress]) -> bool:
        return any(item.hydrate_request.user_id == user for item in items)

    items = await shard.egress(["hydrate_request"], until=asked)
    assert all(item.WhichOneof("egress") == "hydrate_request" for item in items)
    return next(item.hydrate_request for item in items if item.hydrate_request.user_id == user)


async def test_final_result_of_a_parked_command_reaches_the_sending_stream_once(
    shard: ShardClient, users: tuple[int, ...]
) -> None:
    user, bystander = users[0], users[1]
    await shard.run(hydrate(bystander), deposit(bystander, 1_000))
    async with shard.execute() as first, shard.execute() as second:
        funding = deposit(user, 50_000_000_000)
        order = limit_order(user, "p-1", price_ticks=6_500_000, quantity_lots=2)
        first.send(funding, order)
        for command in (funding, order):
            parked = await first.wait_parked(command.correlation_id)
            assert parked.parked and not parked.accepted, parked
        assert not first.finals.get(funding.correlation_id)
        assert not (await shard.actor(user)).resident
        assert (await shard.status()).parked_commands >= 2

        request = await _hydrate_request(shard, user)
        second.send(hydrate(user, epoch=request.epoch))

        funded = await first.wait_final(funding.correlation_id)
        placed = await first.wait_final(order.correlation_id)
        assert funded.accepted and not funded.parked, funded
        assert placed.accepted and placed.order_id == f"s1:{user}:1", placed
        assert placed.status == common_pb2.ORDER_STATUS_PENDING
        # A final carries the stamp of the entry that decided it (the hydration's).
        parked_at = first.parked[order.correlation_id][0].stamp.position
        assert funded.stamp.position == placed.stamp.position > parked_at > 0
        assert placed.stamp.consensus_time_ms > 0

        # A later command on each stream is answered after anything already due on it:
        # once those answers are in, a duplicate final would have been delivered too.
        (later_first,) = await first.run(deposit(bystander, 1))
        (later_second,) = await second.run(deposit(bystander, 1))
        assert later_first.accepted and later_second.accepted
        assert len(first.finals[funding.correlation_id]) == 1
        assert len(first.finals[order.correlation_id]) == 1
        assert len(first.parked[funding.correlation_id]) == 1
        for correlation_id in (funding.correlation_id, order.correlation_id):
            assert correlation_id not in second.finals
            assert correlation_id not in second.parked

    view = await shard.actor(user)
    assert view.resident
    assert balance(view, USDT).total == 50_000_000_000
    assert [o.order_id for o in view.open_orders] == [placed.order_id]


async def test_unknown_user_gets_a_final_unknown_user(
    shard: ShardClient, users: tuple[int, ...]
) -> None:
    user = users[0]
    async with shard.execute() as first, shard.execute() as second:
        order = limit_order(user, "u-1", price_ticks=6_500_000, quantity_lots=1)
        first.send(order)
        assert (await first.wait_parked(order.correlation_id)).parked
        request = await _hydrate_request(shard, user)
        second.send(hydrate(user, known=False, epoch=request.epoch))
        final = await first.wait_final(order.correlation_id)
    assert not final.accepted and not final.parked
    assert final.reject_reason == shard_pb2.SHARD_REJECT_REASON_UNKNOWN_USER
    assert not (await shard.actor(user)).resident
