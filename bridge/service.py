"""The bridge: the matcher client of one user shard (DESIGN.md sections 5, 6, 6a).

Its work queue is the shard's set of in-flight sagas. A session with the shard
starts from `GetInFlight`: its items are re-driven to their matcher groups (the
matcher dedups by order id, so a re-drive is safe), `as_of_position` is where
the egress stream resumes for new submits and cancels, and `matcher_sequences`
is where each group's event subscription resumes (last applied + 1). Events
come back as `MatcherEvents` commands on a ShardLink; the shard drops repeated
sequences, so delivering too much is safe, and the bridge never skips.

Breaks: when either of the shard's streams breaks (its egress, or the Execute
stream of the session's ShardLink) the whole session ends and, after a backoff,
starts again from a new `GetInFlight`. The link's break matters as much as the
egress stream's: a MatcherEvents command sent on a stream that broke may never have
reached the log, and the shard takes the next sequence across a gap (it must, for a
matcher that no longer retains some events), so a session that went on delivering
after a break would lose those events for good; a new session resumes each group
from the shard's applied sequence + 1 instead. A matcher break only restarts that group's lane (see
`matcher_streams`), so one matcher's outage does not stop the others.

Leadership: DESIGN.md runs the bridge leader-only under an etcd lease. In this
issue there is exactly one bridge per shard and no lease: a second bridge would
only duplicate submits (absorbed by the matcher's dedup) and events (dropped by
the shard), never money, but it is not a supported deployment.

Marks: the bridge also carries each group's last trade prices to the shard's
risk (`mark_feed`), on streams of their own that never hold up the order flow.
Traces: see `order_traces` (sampled orders only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc
import structlog

from bridge.backoff import Backoff
from bridge.event_delivery import EventDelivery
from bridge.mark_feed import MarkFeed
from bridge.matcher_streams import CONNECT_TIMEOUT_S, IN_FLIGHT_TIMEOUT_S, MatcherLane
from bridge.settings import BridgeSettings
from bridge.shard_feed import ShardStreamEndedError, follow_egress
from bridge.statistics import BridgeStatistics
from protos.oms.v1 import shard_pb2, shard_pb2_grpc
from services.clients.channels import group_channel
from services.clients.matcher_directory import MatcherDirectory
from services.clients.shard_link import ShardLink
from services.coordination.addresses import address_source
from services.coordination.writer_tokens import WriterCredential
from services.serving.service_host import ServicePlan

log = structlog.get_logger(__name__)


class BridgeService:
    def __init__(
        self,
        settings: BridgeSettings,
        directory: MatcherDirectory,
        *,
        traced: bool = False,
        credential: WriterCredential | None = None,
    ) -> None:
        self.settings = settings
        # Leader-only: the term's token, sent on every call that writes (set by LeaderOnly).
        self.credential = credential or WriterCredential()
        self.statistics = BridgeStatistics()
        self.backoff = Backoff(settings.backoff_initial_ms, settings.backoff_max_ms)
        # Fixed addresses, or each group's leader as etcd names it (re-resolved at every
        # reconnect, so a failover is followed by the next session).
        self.shard = address_source(
            settings.shard_address,
            kind="shard",
            name=settings.shard_id,
            etcd_endpoints=settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
        )
        matchers = directory.sources(settings.etcd_endpoints, settings.mesh_id)
        self.lanes: Mapping[str, MatcherLane] = {
            group: MatcherLane(
                group,
                source,
                shard_id=settings.shard_id,
                queue_capacity=settings.queue_capacity,
                max_batch_commands=settings.max_batch_commands,
                backoff=Backoff(settings.backoff_initial_ms, settings.backoff_max_ms),
                statistics=self.statistics,
                credential=self.credential,
                traced=traced,
            )
            for group, source in matchers.items()
        }
        self.marks = MarkFeed(
            self.shard,
            matchers,
            self.statistics,
            self.credential,
            interval_ms=settings.mark_interval_ms,
            backoff_initial_ms=settings.backoff_initial_ms,
            backoff_max_ms=settings.backoff_max_ms,
        )

    async def run(self) -> None:
        """Shard sessions, one after another, until cancelled."""
        while True:
            try:
                await self._session()
            except* (grpc.aio.AioRpcError, ConnectionError, TimeoutError) as failure:
                log.warning(
                    "bridge.shard_session_ended",
                    shard=self.shard.describe(),
                    error=repr(failure.exceptions[0]),
                )
            self.statistics.counters.reconnects += 1
            await self.backoff.wait()

    async def _session(self) -> None:
        link = ShardLink(self.shard, metadata=self.credential.metadata)
        try:
            async with group_channel(self.shard) as channel:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await channel.channel_ready()
                shard = shard_pb2_grpc.UserShardStub(channel)
                snapshot = await shard.GetInFlight(
                    shard_pb2.InFlightRequest(), timeout=IN_FLIGHT_TIMEOUT_S
                )
                self.backoff.reset()
                log.info(
                    "bridge.session_started",
                    as_of_position=snapshot.as_of_position,
                    in_flight=len(snapshot.items),
                    matcher_sequences=dict(snapshot.matcher_sequences),
                )
                self._count_unroutable(snapshot)
                for lane in self.lanes.values():
                    await lane.prepare(snapshot)
                delivery = EventDelivery(
                    link, self.statistics, shard_batch_bytes=self.settings.shard_batch_bytes
                )
                async with asyncio.TaskGroup() as tasks:
                    for group, lane in self.lanes.items():
                        first = snapshot.matcher_sequences.get(group, 0) + 1
                        tasks.create_task(lane.run(shard, delivery, first))
                    tasks.create_task(
                        follow_egress(
                            shard, snapshot.as_of_position + 1, self.lanes, self.statistics
                        )
                    )
                    tasks.create_task(_end_at_first_break(link))
        finally:
            await link.close()

    def _count_unroutable(self, snapshot: shard_pb2.InFlightSnapshot) -> None:
        for item in snapshot.items:
            kind = item.WhichOneof("egress")
            group = item.submit.matcher_group if kind == "submit" else item.cancel.matcher_group
            if group not in self.lanes:
                self.statistics.counters.unroutable += 1
                log.error("bridge.unroutable", matcher_group=group, kind=kind)

    def status(self) -> tuple[Mapping[str, int], Mapping[str, str]]:
        return self.statistics.status(self.settings.shard_id, self.shard.describe())

    def plan(self) -> ServicePlan:
        return ServicePlan(
            name="bridge",
            service_names=(),
            register=lambda server: None,
            status=self.status,
            loops=[self.run, self.marks.run],
        )


async def _end_at_first_break(link: ShardLink) -> None:
    """End the session when the events link's stream breaks (see the module's docstring)."""
    await link.wait_breaks(0)
    raise ShardStreamEndedError("the shard's Execute stream broke: events sent on it may be lost")
