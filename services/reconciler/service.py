"""The reconciler of one user shard: periodic, capped drift sweeps (DESIGN.md section 6).

Every `interval_ms` one round checks the next window of the shard's resident
users against the matchers (see `sweep`) and sends the reports, batched, on a
ShardLink; the shard defers each until it has applied the matcher sequence the
report is as-of, then heals deterministically and counts what it healed
(`reconcile_phantoms_closed`, `reconcile_reservations_released`,
`reconcile_acceptances_healed`, `reconcile_impossible_states` in its status).
A round that cannot reach the shard is counted and skipped; a report lost with
a broken stream is sent again when the window comes round. The reconciler
keeps no state: its cursor restarts at the first user.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

import grpc
import structlog

from protos.oms.v1 import matcher_pb2_grpc, shard_pb2_grpc
from services.clients.channels import group_channel
from services.clients.matcher_directory import MatcherDirectory
from services.clients.shard_link import ShardLink
from services.coordination.addresses import address_source
from services.coordination.writer_tokens import WriterCredential
from services.reconciler.settings import ReconcilerSettings
from services.reconciler.sweep import ReconcilerCounters, ReconcileSweep
from services.serving.service_host import ServicePlan

log = structlog.get_logger(__name__)


class ReconcilerService:
    def __init__(
        self,
        settings: ReconcilerSettings,
        directory: MatcherDirectory,
        *,
        credential: WriterCredential | None = None,
    ) -> None:
        self.settings = settings
        # Leader-only: the term's token, sent with its commands (set by LeaderOnly).
        self.credential = credential or WriterCredential()
        self.directory = directory
        self.counters = ReconcilerCounters()
        self.cursor = 0
        self.last_round_ms = 0.0
        self.shard = address_source(
            settings.shard_address,
            kind="shard",
            name=settings.shard_id,
            etcd_endpoints=settings.etcd_endpoints,
            mesh_id=settings.mesh_id,
        )
        self.matchers = directory.sources(settings.etcd_endpoints, settings.mesh_id)

    async def run(self) -> None:
        """Sessions, one after another: each resolves where the shard and the matchers
        are now (their leaders, when replicated) and sweeps until a round fails."""
        while True:
            await self._session()
            await asyncio.sleep(self.settings.interval_ms / 1000)

    async def _session(self) -> None:
        settings = self.settings
        try:
            async with contextlib.AsyncExitStack() as stack:
                shard_channel = await stack.enter_async_context(group_channel(self.shard))
                matcher_channels = {
                    group: await stack.enter_async_context(group_channel(source))
                    for group, source in self.matchers.items()
                }
                link = ShardLink(self.shard, metadata=self.credential.metadata)
                stack.push_async_callback(link.close)
                sweep = ReconcileSweep(
                    shard=shard_pb2_grpc.UserShardStub(shard_channel),
                    matchers={
                        group: matcher_pb2_grpc.MatcherStub(channel)
                        for group, channel in matcher_channels.items()
                    },
                    shard_id=settings.shard_id,
                    group_of=self.directory.group_of,
                    max_users=settings.max_users_per_round,
                    only_on_drift=settings.report_only_on_drift,
                    counters=self.counters,
                )
                while True:
                    if not await self._round(sweep, link):
                        return
                    await asyncio.sleep(settings.interval_ms / 1000)
        except ConnectionError as error:
            self.counters.round_errors += 1
            log.warning("reconciler.unreachable", error=str(error))

    async def _round(self, sweep: ReconcileSweep, link: ShardLink) -> bool:
        """One round; False when the shard or a matcher was unreachable (a new session
        then finds them again, with a fresh link: the old stream may have broken)."""
        started = time.monotonic()
        try:
            reports = await sweep.round()
        except grpc.aio.AioRpcError as error:
            self.counters.round_errors += 1
            log.warning("reconciler.round_failed", error=error.code().name, details=error.details())
            return False
        if reports:
            await link.send(reports)
            self.counters.reports_sent += len(reports)
        self.counters.rounds += 1
        self.cursor = sweep.cursor
        self.last_round_ms = (time.monotonic() - started) * 1000
        return True

    def status(self) -> tuple[Mapping[str, int], Mapping[str, str]]:
        info = {
            "shard_id": self.settings.shard_id,
            "shard_address": self.shard.describe(),
            "cursor_user_id": str(self.cursor),
            "last_round_ms": f"{self.last_round_ms:.1f}",
        }
        return self.counters.plain(), info

    def plan(self) -> ServicePlan:
        return ServicePlan(
            name="reconciler",
            service_names=(),
            register=lambda server: None,
            status=self.status,
            loops=[self.run],
        )
