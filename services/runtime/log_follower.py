"""A follower: applies the etcd log to its replica as the leader appends it.

It reads from its applied position to the log's end (range reads), then watches
the record keys from the revision that read saw, applying each new record in
order. A record that does not follow on (a gap: a split record's manifest seen
before a page was read, a watch that fell behind) or a watch that breaks or asks
for compacted history sends it back to a range read. Every record goes through
`Replica.apply_batch`, which checks position order and verifies the leader's
logged state hashes: a follower that computes another hash stops with
`DivergenceError` (position and both hashes). Applied records are handed to
`on_applied` (the egress feed), so a follower that is promoted already holds the
egress its consumers may ask for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import structlog

from services.coordination.errors import CoordinationError
from services.coordination.etcd_session import EtcdSession
from services.coordination.group_keys import GroupKeys
from services.runtime.core.log_batch import LogBatch
from services.runtime.core.replica import Replica
from services.runtime.errors import RuntimeStoreError
from services.runtime.etcd_log import read_records, record_of

log = structlog.get_logger(__name__)
EgressT = TypeVar("EgressT")
RETRY_S = 0.2

Applied = Callable[[LogBatch, list[Sequence[Any]]], None]


class LogFollower(Generic[EgressT]):
    def __init__(
        self,
        session: EtcdSession,
        keys: GroupKeys,
        replica: Replica[EgressT],
        *,
        on_applied: Applied | None = None,
        between_records: Callable[[], None] | None = None,
    ) -> None:
        self.session = session
        self.keys = keys
        self.replica = replica
        self.on_applied = on_applied
        self.between_records = between_records
        self.applied_records = 0
        self.range_reads = 0
        self.watch_restarts = 0
        self.progress = asyncio.Event()  # set each time a record is applied

    async def catch_up(self) -> int:
        """Apply every record stored now; the revision that read was made at."""
        self.range_reads += 1
        revision = 0
        async for batch in read_records(self.session, self.keys, self.replica.applied_position + 1):
            self._apply(batch)
            revision = max(revision, self.session.revision)
        return max(revision, self.session.revision)

    async def run(self) -> None:
        """Follow until cancelled; errors of the replica (divergence) stop it."""
        while True:
            try:
                revision = await self.catch_up()
                await self._watch(revision + 1)
            except (CoordinationError, RuntimeStoreError) as error:
                self.watch_restarts += 1
                log.info(
                    "follower.reread", error=repr(error), applied=self.replica.applied_position
                )
                await asyncio.sleep(RETRY_S)

    async def _watch(self, from_revision: int) -> None:
        keys = self.keys
        async for event in self.session.watch(
            keys.records, keys.records_end, from_revision=from_revision
        ):
            if event.kind != "put":
                continue  # the leader truncating what every replica has snapshotted
            first = keys.position_of(event.entry.key)
            expected = self.replica.applied_position + 1
            if first < expected:
                continue  # already applied (a re-read overlapped the watch)
            if first > expected:
                return  # a gap: read the range again
            self._apply(await record_of(self.session, keys, event.entry))

    def _apply(self, batch: LogBatch) -> None:
        if batch.last_position <= self.replica.applied_position:
            return
        outputs = self.replica.apply_batch(batch)
        self.applied_records += 1
        if self.on_applied is not None:
            self.on_applied(batch, outputs)
        self.progress.set()
        self.progress = asyncio.Event()
        if self.between_records is not None:
            self.between_records()
