"""New sagas from the shard's durable egress, routed to their matcher group's work queue."""

from __future__ import annotations

from collections.abc import Mapping

import grpc
import structlog

from bridge.matcher_streams import MatcherLane
from bridge.saga_commands import Work, saga_work
from bridge.statistics import BridgeStatistics
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
            by_group: dict[str, list[Work]] = {}
            for item in batch.items:
                routed = saga_work(item)
                if routed is not None:
                    by_group.setdefault(routed[0], []).append(routed[1])
            for group, work in by_group.items():
                lane = lanes.get(group)
                if lane is None:
                    counters.unroutable += len(work)
                    log.error("bridge.unroutable", matcher_group=group, items=len(work))
                    continue
                counters.shed_while_down += await lane.queue.offer(work)
    except grpc.aio.AioRpcError as error:
        raise ShardStreamEndedError(f"shard egress stream: {error.code().name}") from error
    finally:
        call.cancel()
    raise ShardStreamEndedError("shard egress stream ended")
