"""The persister service: its parts wired together, its status, its loops.

Loops (one TaskGroup, owned by `ServiceHost`): the egress follower, the
write-behind writer, the hydration and dedup readers, the shard-lock watch and
a periodic statistics line. Any of them failing stops the service (crash-only:
a restart resumes from the cursor committed with the rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog

from persister import answers, dedup_reads, egress_follower, grpc_api, hydration_reads
from persister import write_behind as write_behind_module
from persister.counters import Counters
from persister.dedup_reads import DedupReads
from persister.egress_follower import EgressFollower
from persister.errors import StoreError
from persister.flushes import recent_flushes
from persister.grpc_api import PersisterApi
from persister.hydration_reads import HydrationReads
from persister.secret_seal import MasterKey
from persister.settings import PersisterSettings
from persister.shard_answers import ShardAnswers
from persister.shard_lock import ShardLock
from persister.store import Store
from persister.unknown_users import UnknownUsers
from persister.write_behind import WriteBehind
from persister.write_buffer import WriteBuffer
from services.serving.service_host import ServicePlan

log = structlog.get_logger(__name__)
STATISTICS_INTERVAL_S = 10.0
MAX_RESENT_FLUSH_ANSWERS = 10_000
# The DB-side oracles (seeds/no-blocking-db-hot-path.txt): all must stay at zero.
ORACLE_COUNTERS = (
    "duplicate_command_reached_db",
    "duplicate_order_reached_db",
    "duplicate_fill_reached_db",
    "rejected_rows",
)


# The shard's feed gathers at most this long (or the write interval, if shorter): a
# reader waiting for a position hurries the write (WriteBehind.wait_committed), but
# not the feed, so the feed's pacing stays short whatever the write interval.
MAX_FEED_INTERVAL_MS = 10


class PersisterService:
    def __init__(
        self,
        settings: PersisterSettings,
        store: Store,
        shard: ShardAnswers,
        lock: ShardLock,
        *,
        master: MasterKey,
        start_position: int,
    ) -> None:
        self.settings = settings
        self.store = store
        self.shard = shard
        self.lock = lock
        self.counters = Counters(
            (
                *write_behind_module.COUNTERS,
                *hydration_reads.COUNTERS,
                *dedup_reads.COUNTERS,
                *egress_follower.COUNTERS,
                *grpc_api.COUNTERS,
                "flush_answers_resent",
                "answer_link_breaks",
            )
        )
        self.unknown = UnknownUsers(settings.unknown_user_ttl_ms, settings.max_unknown_users)
        self.buffer = WriteBuffer(start_position, settings.max_buffered_rows)
        self.write_behind = WriteBehind(
            store,
            settings.shard_id,
            shard,
            self.counters,
            self.buffer,
            interval_ms=settings.write_interval_ms,
            max_rows_per_transaction=settings.max_rows_per_transaction,
        )
        self.hydrations = HydrationReads(
            store,
            shard,
            self.unknown,
            self.counters,
            committed=self.write_behind.wait_committed,
            workers=settings.read_workers,
            max_per_query=settings.max_reads_per_query,
            max_pending=settings.max_pending_reads,
        )
        self.dedup = DedupReads(
            store,
            shard,
            self.counters,
            committed=self.write_behind.wait_committed,
            workers=settings.read_workers,
            max_per_query=settings.max_reads_per_query,
            max_pending=settings.max_pending_reads,
        )
        self.follower = EgressFollower(
            shard.shard,
            self.buffer,
            self.hydrations,
            self.dedup,
            self.counters,
            on_connect=self.resend_recent_flush_answers,
            interval_ms=min(settings.write_interval_ms, MAX_FEED_INTERVAL_MS),
        )
        self.api = PersisterApi(
            store,
            shard,
            self.unknown,
            self.counters,
            master=master,
            committed_through=lambda: self.write_behind.committed_through,
            wait_committed=self.write_behind.wait_committed,
            read_wait_s=settings.read_wait_ms / 1000,
        )

    def plan(self) -> ServicePlan:
        return ServicePlan(
            name="persister",
            service_names=(grpc_api.SERVICE_NAME,),
            register=self.api.register,
            status=self.status,
            loops=[
                self.follower.run,
                self.answer_again_after_breaks,
                self.write_behind.run,
                self.hydrations.run,
                self.dedup.run,
                self.lock.watch,
                self.log_statistics,
            ],
        )

    def status(self) -> tuple[Mapping[str, int], Mapping[str, str]]:
        counters = self.counters.snapshot()
        counters["committed_position"] = self.write_behind.committed_through
        counters["complete_position"] = self.buffer.complete_through
        counters["buffered_rows"] = len(self.buffer)
        counters["buffer_full_waits"] = self.buffer.full_waits
        counters["pending_hydrations"] = len(self.hydrations.pending)
        counters["pending_dedup_lookups"] = len(self.dedup.pending)
        counters["unknown_users_cached"] = len(self.unknown)
        counters["database_round_trips"] = self.store.counts.round_trips
        counters["database_transactions"] = self.store.counts.transactions
        info = {
            "shard_id": self.settings.shard_id,
            "shard_address": self.shard.shard.describe(),
            "oracles": ",".join(ORACLE_COUNTERS),
        }
        return counters, info

    async def resend_recent_flush_answers(self) -> None:
        """Flush answers committed lately may have died with a broken stream: send them again.

        The shard drops those it already applied (stale epoch) and a lost one would
        otherwise leave its user DEHYDRATING until the next activity. The link is
        renewed first, so nothing queued here meets a reader of the broken stream.
        """
        await self.shard.renew()
        try:
            async with self.store.session() as session:
                flushed = await recent_flushes(
                    session,
                    self.settings.shard_id,
                    self.settings.flush_reanswer_window_ms,
                    MAX_RESENT_FLUSH_ANSWERS,
                )
        except StoreError as error:
            log.warning("persister.flush_answers_not_resent", error=str(error))
            return
        if flushed:
            await self.shard.send(
                [answers.flush_complete(user, epoch, version) for user, epoch, version in flushed]
            )
            self.counters.add("flush_answers_resent", len(flushed))

    async def answer_again_after_breaks(self) -> None:
        """The answers link's stream can break while the egress stream lives on (the
        link finds a saturated shard wedged): what was sent on it may be lost, so recent
        flush answers go again on a fresh link, as after a reconnect."""
        while True:
            link = self.shard.link
            await link.wait_breaks(0)
            if link is self.shard.link:  # not renewed meanwhile by the follower's reconnect
                self.counters.add("answer_link_breaks")
                await self.resend_recent_flush_answers()

    async def log_statistics(self) -> None:
        previous: dict[str, int] = {}
        while True:
            await asyncio.sleep(STATISTICS_INTERVAL_S)
            counters = self.counters.snapshot()
            if counters != previous:
                log.info("persister.statistics", **counters)
                previous = counters
