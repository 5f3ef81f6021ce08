"""Following the shard's durable egress from the position after the last one handled.

One `SubscribeEgress` stream carries the kinds the persister acts on, paced to the
write-behind's interval (the shard gathers what becomes durable meanwhile into one
message) except for reads, which it sends at once. Reads (hydrate requests, dedup
lookups) go to their readers, which never block this loop; writes (orders, fills,
ledger rows, flushes) go to the write-behind buffer, which blocks this loop only
while it is full (backpressure).

Completeness: the shard never splits one position's items across two stream
messages (shard.proto, `SubscribeEgress`), so every position in a message is
complete when the message arrives; and each message that ends a run of records
says the position it covers the log through (`through_position`), so the
persister is "written through" the shard's position even when the last records
held nothing for it (timers): reads that wait for a position end.

When the stream breaks (the shard restarted or the network failed) the follower
drops what it got past the complete position, waits for the shard's channel to
be ready again (with gRPC's short reconnect backoff), sends recent flush answers
again (`on_connect`), and resubscribes right after the complete position. If the
shard no longer retains that position it answers OUT_OF_RANGE, and the follower
stops with `EgressGapError` instead of skipping rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import structlog

from persister.counters import Counters
from persister.dedup_reads import DedupReads
from persister.errors import EgressGapError
from persister.hydration_reads import HydrationReads
from persister.write_buffer import WRITE_KINDS, WriteBuffer
from protos.oms.v1 import shard_pb2
from services.clients.channels import group_channel
from services.coordination.addresses import AddressSource

log = structlog.get_logger(__name__)

SUBSCRIBE_METHOD = "/oms.v1.UserShard/SubscribeEgress"
URGENT_KINDS = ("hydrate_request", "dedup_lookup")
KINDS = (*URGENT_KINDS, *WRITE_KINDS)
RETRY_DELAY_S = 0.2

COUNTERS = ("egress_items", "egress_messages", "egress_connects", "egress_breaks")


class EgressFollower:
    def __init__(
        self,
        shard: AddressSource,
        buffer: WriteBuffer,
        hydrations: HydrationReads,
        dedup: DedupReads,
        counters: Counters,
        *,
        on_connect: Callable[[], Awaitable[None]],
        interval_ms: int = 0,
    ) -> None:
        self.shard = shard
        # The shard sends at most a message per interval (the write-behind's own), but
        # reads at once: what a client waits for (a hydration, a dedup lookup) never waits.
        self.interval_ms = interval_ms
        self.buffer = buffer
        self.hydrations = hydrations
        self.dedup = dedup
        self.counters = counters
        self.on_connect = on_connect
        self.received_through = 0

    async def run(self) -> None:
        while True:
            try:
                # Where the shard is now (its leader, when replicated): found again after
                # every break, so a failover is followed by the next subscription.
                async with group_channel(self.shard) as channel:
                    await self._subscribe(channel)
            except ConnectionError as error:
                log.info("persister.shard_unreachable", error=str(error))
            self.counters.add("egress_breaks")
            self.buffer.discard_incomplete()
            await asyncio.sleep(RETRY_DELAY_S)

    async def _subscribe(self, channel: grpc.aio.Channel) -> None:
        subscribe = channel.unary_stream(
            SUBSCRIBE_METHOD,
            request_serializer=shard_pb2.EgressSubscription.SerializeToString,
            response_deserializer=shard_pb2.ShardEgressBatch.FromString,
        )
        await channel.channel_ready()
        await self.on_connect()
        start = self.buffer.complete_through + 1
        self.counters.add("egress_connects")
        shard = self.shard.describe()
        log.info("persister.egress_subscribed", shard=shard, from_position=start)
        call = subscribe(
            shard_pb2.EgressSubscription(
                from_position=start,
                kinds=KINDS,
                through_positions=True,
                min_interval_ms=self.interval_ms,
                urgent_kinds=URGENT_KINDS,
            )
        )
        try:
            async for message in call:
                await self._take(message)
            log.info("persister.egress_ended", shard=shard)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.OUT_OF_RANGE:
                log.critical("persister.egress_gap", from_position=start, detail=error.details())
                raise EgressGapError(
                    f"shard {shard} no longer retains egress from position "
                    f"{start}: {error.details()}"
                ) from error
            log.warning("persister.egress_broken", code=error.code().name, detail=error.details())
        finally:
            call.cancel()

    async def _take(self, message: shard_pb2.ShardEgressBatch) -> None:
        items = message.items
        if not items:
            # Positions with nothing for the persister: written through them, at no cost.
            if message.through_position:
                self.received_through = max(self.received_through, message.through_position)
                self.buffer.mark_complete(message.through_position)
            return
        buffer = self.buffer
        await buffer.wait_for_room()
        for item in items:
            kind = item.WhichOneof("egress")
            position = item.stamp.position
            if kind == "hydrate_request":
                request = item.hydrate_request
                self.hydrations.request(request.user_id, request.epoch, position)
            elif kind == "dedup_lookup":
                lookup = item.dedup_lookup
                self.dedup.request(lookup.user_id, lookup.client_order_id, position)
            else:
                if item.trace_parent:  # a sampled order's row: its write joins the trace
                    row = item.fill if kind == "fill" else item.order_update
                    buffer.traces.received(position, item.trace_parent, row.order_id, kind or "")
                buffer.add(item)
        last = max(items[-1].stamp.position, message.through_position)
        self.received_through = last
        self.counters.add("egress_items", len(items))
        self.counters.add("egress_messages")
        buffer.mark_complete(last)
