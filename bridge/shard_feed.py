"""New sagas from the shard's durable egress, routed to their matcher group's work queue."""

from __future__ import annotations

from collections.abc import Mapping

import grpc
import structlog

from bridge.matcher_streams import MatcherLane
from bridge.statistics import BridgeStatistics
from bridge.work_queue import matcher_command
from protos.oms.v1 import shard_pb2, shard_pb2_grpc

log = structlog.get_logger(__name__)
SAGA_KINDS = ("submit", "cancel")


class ShardStreamEndedError(ConnectionError):
    """The shard's egress stream ended: the shard stopped or restarted."""


async def follow_egress(
    shard: shard_pb2_grpc.UserShardStub,
    from_position: int,
    lanes: Mapping[str, MatcherLane],
    statistics: BridgeStatistics,
) -> None:
    """Forward SubmitToME / CancelToME from `from_position` on; raise when the stream ends."""
    counters = statistics.counters
    call = shard.SubscribeEgress(
        shard_pb2.EgressSubscription(from_position=from_position, kinds=list(SAGA_KINDS))
    )
    try:
        async for batch in call:
            for item in batch.items:
                routed = matcher_command(item)
                if routed is None:
                    continue
                group, command = routed
                lane = lanes.get(group)
                if lane is None:
                    counters.unroutable += 1
                    log.error(
                        "bridge.unroutable", matcher_group=group, position=item.stamp.position
                    )
                    continue
                if not await lane.queue.offer(command):
                    counters.shed_while_down += 1
    except grpc.aio.AioRpcError as error:
        raise ShardStreamEndedError(f"shard egress stream: {error.code().name}") from error
    finally:
        call.cancel()
    raise ShardStreamEndedError("shard egress stream ended")
