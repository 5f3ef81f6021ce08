"""One matcher group's two streams: batched commands out, sequenced events back.

A `MatcherLane` owns, per connection to its group: one `Matcher/Execute`
stream that carries the group's work queue in `MatcherCommandBatch`es (all that
is ready in one loop turn, capped), a reader of its results (exceptions only:
duplicates and unknown cancels, counted, never trusted: the truth comes from
events), and one `Subscribe` stream for this
shard's events, delivered to the shard. When the bridge exports traces, an
order the gateway sampled goes to the matcher on a short call of its own
instead (`order_traces`), so that the matcher's span can join the order's trace.

Any break (matcher restart, stream error) closes the connection and the work
queue; after a backoff the lane starts again from a fresh `GetInFlight`: it
re-drives the group's sagas (the matcher dedups by order id) and subscribes
from the shard's last applied sequence + 1. OUT_OF_RANGE from Subscribe means
the matcher no longer retains that sequence: the lane logs it as an error,
counts it and resumes from the oldest retained sequence; the events in between
are lost to this shard until the reconciler heals their effect.
"""

from __future__ import annotations

import asyncio
import re

import grpc
import structlog

from bridge.backoff import Backoff
from bridge.event_delivery import EventDelivery
from bridge.order_traces import OrderTraces
from bridge.saga_commands import Work, add_command, saga_work
from bridge.statistics import BridgeStatistics
from bridge.work_queue import WorkQueue
from protos.oms.v1 import matcher_pb2, matcher_pb2_grpc, shard_pb2, shard_pb2_grpc
from services.clients.channels import group_channel
from services.clients.matcher_results import EXCEPTIONS_ONLY_METADATA
from services.coordination.addresses import AddressSource
from services.coordination.writer_tokens import WriterCredential

log = structlog.get_logger(__name__)
CONNECT_TIMEOUT_S = 5.0
IN_FLIGHT_TIMEOUT_S = 30.0
# The matcher names the oldest retained sequence only in the status details.
_OLDEST_RETAINED = re.compile(r"oldest retained is (\d+)")


class MatcherStreamEndedError(ConnectionError):
    """A matcher stream ended without an error status (the matcher is stopping)."""


def oldest_retained(details: str | None) -> int | None:
    match = _OLDEST_RETAINED.search(details or "")
    return int(match.group(1)) if match else None


class MatcherLane:
    def __init__(
        self,
        group: str,
        source: AddressSource,
        *,
        shard_id: str,
        queue_capacity: int,
        max_batch_commands: int,
        backoff: Backoff,
        statistics: BridgeStatistics,
        credential: WriterCredential,
        traced: bool = False,
    ) -> None:
        self.group = group
        self.credential = credential  # its token goes with every Execute call
        self.source = source
        self.shard_id = shard_id
        self.queue = WorkQueue(group, queue_capacity)
        self.max_batch_commands = max_batch_commands
        self.backoff = backoff
        self.statistics = statistics
        # Only a bridge that exports spans sends sampled orders on calls of their own.
        self.traces = OrderTraces(group, statistics, credential) if traced else None
        statistics.connected[group] = False

    async def prepare(self, snapshot: shard_pb2.InFlightSnapshot) -> None:
        """Open the queue and put the group's in-flight sagas at its front."""
        await self.queue.open()
        work: list[Work] = []
        for item in snapshot.items:
            routed = saga_work(item)
            if routed is not None and routed[0] == self.group:
                work.append(routed[1])
        await self.queue.redrive(work)
        self.statistics.counters.redriven += len(work)

    async def run(
        self,
        shard: shard_pb2_grpc.UserShardStub,
        delivery: EventDelivery,
        first_sequence: int,
    ) -> None:
        """Serve the group until cancelled; `prepare` ran for the first connection."""
        from_sequence: int | None = first_sequence
        try:
            while True:
                try:
                    async with group_channel(self.source) as channel:
                        async with asyncio.timeout(CONNECT_TIMEOUT_S):
                            await channel.channel_ready()
                        if from_sequence is None:
                            # Open before the snapshot: a fresh item is then either queued or
                            # still in flight in the snapshot, never shed and missing from both.
                            await self.queue.open()
                            snapshot = await shard.GetInFlight(
                                shard_pb2.InFlightRequest(), timeout=IN_FLIGHT_TIMEOUT_S
                            )
                            await self.prepare(snapshot)
                            from_sequence = snapshot.matcher_sequences.get(self.group, 0) + 1
                        await self._serve(channel, delivery, from_sequence)
                except* (grpc.aio.AioRpcError, ConnectionError, TimeoutError) as failure:
                    log.warning(
                        "bridge.matcher_connection_lost",
                        group=self.group,
                        address=self.source.describe(),
                        error=repr(failure.exceptions[0]),
                    )
                self.statistics.connected[self.group] = False
                await self.queue.close()
                self.statistics.counters.reconnects += 1
                from_sequence = None
                await self.backoff.wait()
        finally:
            self.statistics.connected[self.group] = False
            await self.queue.close()

    async def _serve(
        self, channel: grpc.aio.Channel, delivery: EventDelivery, from_sequence: int
    ) -> None:
        self.backoff.reset()
        self.statistics.connected[self.group] = True
        log.info("bridge.matcher_connected", group=self.group, from_sequence=from_sequence)
        stub = matcher_pb2_grpc.MatcherStub(channel)
        # Results of exceptions only (services/clients/matcher_results.py): the truth of
        # every order comes back on the events.
        call = stub.Execute(metadata=(*self.credential.metadata(), *EXCEPTIONS_ONLY_METADATA))
        if self.traces is not None:
            self.traces.connection_started()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._send_commands(call, stub, tasks))
                tasks.create_task(self._read_results(call))
                tasks.create_task(self._follow_events(stub, delivery, from_sequence))
        finally:
            call.cancel()

    async def _send_commands(
        self,
        call: grpc.aio.StreamStreamCall,
        stub: matcher_pb2_grpc.MatcherStub,
        tasks: asyncio.TaskGroup,
    ) -> None:
        counters = self.statistics.counters
        traces = self.traces
        correlation_id = 0
        while True:
            batch = matcher_pb2.MatcherCommandBatch()
            work = await self.queue.take(self.max_batch_commands)
            if traces is not None:
                work = await traces.divert(work, stub, tasks)
                if not work:
                    continue
            submits = 0
            for item in work:
                correlation_id += 1
                submits += add_command(batch, item, correlation_id)
            try:
                await call.write(batch)
            except asyncio.InvalidStateError as error:  # the call already finished
                raise MatcherStreamEndedError(f"matcher {self.group} closed Execute") from error
            counters.submits_forwarded += submits
            counters.cancels_forwarded += len(work) - submits

    async def _read_results(self, call: grpc.aio.StreamStreamCall) -> None:
        counters = self.statistics.counters
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                raise MatcherStreamEndedError(f"matcher {self.group} ended Execute")
            for result in message.results:
                counters.matcher_duplicates += result.duplicate
                counters.cancels_not_found += result.not_found

    async def _follow_events(
        self, stub: matcher_pb2_grpc.MatcherStub, delivery: EventDelivery, from_sequence: int
    ) -> None:
        counters = self.statistics.counters
        traces = self.traces
        next_sequence = from_sequence
        while True:
            call = stub.Subscribe(
                matcher_pb2.SubscribeRequest(oms_shard=self.shard_id, from_sequence=next_sequence)
            )
            try:
                async for batch in call:
                    if batch.events:
                        spans = traces.returning(batch.events) if traces is not None else ()
                        await delivery.deliver(self.group, batch.events)
                        if spans:
                            OrderTraces.delivered(spans)
                        next_sequence = batch.events[-1].sequence + 1
            except grpc.aio.AioRpcError as error:
                oldest = oldest_retained(error.details())
                if error.code() != grpc.StatusCode.OUT_OF_RANGE or oldest is None:
                    raise
                if oldest <= next_sequence:
                    raise  # not a gap we can explain: reconnect and start over
                counters.sequence_out_of_range += 1
                counters.events_skipped += oldest - next_sequence
                log.error(
                    "bridge.matcher_events_lost",
                    group=self.group,
                    wanted_sequence=next_sequence,
                    oldest_retained=oldest,
                    lost=oldest - next_sequence,
                    healing="the reconciler closes what these events would have ended",
                )
                next_sequence = oldest
                continue
            finally:
                call.cancel()
            raise MatcherStreamEndedError(f"matcher {self.group} ended Subscribe")
