"""Waiting for an order's client-visible state, read from the shard's durable egress."""

from __future__ import annotations

from protos.oms.v1 import common_pb2, shard_pb2
from tests.shard_service.shard_client import ShardClient, limit_order

WAIT_S = 15.0


async def wait_order_update(
    shard: ShardClient, order_id: str, status: int, *, from_position: int = 1
) -> shard_pb2.OrderUpdate:
    """The first update of `order_id` with `status` (fails on another final status)."""

    def reached(items: list[shard_pb2.ShardEgress]) -> bool:
        return any(
            item.order_update.order_id == order_id and item.order_update.status == status
            for item in items
        )

    items = await shard.egress(
        ["order_update"], from_position=from_position, until=reached, timeout_s=WAIT_S
    )
    (update,) = [
        item.order_update
        for item in items
        if item.order_update.order_id == order_id and item.order_update.status == status
    ][:1]
    return update


def post_only_order(
    user_id: int, client_order_id: str, *, price_ticks: int, quantity_lots: int, side: int
) -> shard_pb2.ShardCommand:
    command = limit_order(
        user_id, client_order_id, price_ticks=price_ticks, quantity_lots=quantity_lots, side=side
    )
    command.place.time_in_force = common_pb2.TIME_IN_FORCE_POST_ONLY
    return command
