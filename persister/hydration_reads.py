"""Hydration reads: HydrateRequest{user, epoch} answered with the user's stored state.

Requests come from the egress follower and never block it: they queue in a
bounded single-flight set (`PendingReads`), and a few workers read them in
batches (one query per batch) off the follower's path. Each read first waits
until every write before its request's log position is committed, so it sees
the user's latest flush. Users PostgreSQL does not know are answered
`known=false` and remembered in the negative cache (`UnknownUsers`).

A failed read answers nothing: the shard asks again after 5 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from persister import answers
from persister.answers import AnswerSink
from persister.counters import Counters
from persister.errors import StoreError
from persister.pending_reads import Admission, PendingReads
from persister.store import Store
from persister.unknown_users import UnknownUsers
from persister.user_rows import StoredStateError, read_users, stored_state
from protos.oms.v1 import shard_pb2

log = structlog.get_logger(__name__)
Barrier = Callable[[int], Awaitable[None]]

COUNTERS = (
    "hydration_requests",
    "hydration_requests_joined",
    "hydration_requests_shed",
    "hydration_queries",
    "hydration_users_read",
    "hydrations_answered",
    "unknown_users_answered",
    "negative_cache_hits",
    "hydration_read_failures",
    "stored_states_unreadable",
)


class HydrationReads:
    def __init__(
        self,
        store: Store,
        shard: AnswerSink,
        unknown: UnknownUsers,
        counters: Counters,
        *,
        committed: Barrier,
        workers: int,
        max_per_query: int,
        max_pending: int,
    ) -> None:
        self.store = store
        self.shard = shard
        self.unknown = unknown
        self.counters = counters
        self.committed = committed
        self.workers = workers
        self.max_per_query = max_per_query
        self.pending: PendingReads[int, int] = PendingReads(max_pending)

    def request(self, user_id: int, epoch: int, position: int) -> None:
        self.counters.add("hydration_requests")
        admission = self.pending.add(user_id, epoch, position)
        if admission is Admission.JOINED:
            self.counters.add("hydration_requests_joined")
        elif admission is Admission.SHED:
            self.counters.add("hydration_requests_shed")

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(self.workers):
                group.create_task(self._work())

    async def _work(self) -> None:
        while True:
            users, newest = await self.pending.take(self.max_per_query)
            try:
                commands = await self._read(users, newest)
            except StoreError as error:
                self.counters.add("hydration_read_failures")
                log.warning("persister.hydration_read_failed", users=len(users), error=str(error))
                self.pending.finish(users)
                continue
            if commands:
                await self.shard.send(commands)

    async def _read(self, users: list[int], newest: int) -> list[shard_pb2.ShardCommand]:
        await self.committed(newest - 1)
        cached = {user for user in users if self.unknown.known_unknown(user)}
        to_read = [user for user in users if user not in cached]
        rows = {}
        generation = self.unknown.generation()
        if to_read:
            async with self.store.session() as session:
                rows = await read_users(session, to_read)
            self.counters.add("hydration_queries")
            self.counters.add("hydration_users_read", len(to_read))
        self.counters.add("negative_cache_hits", len(cached))
        commands = []
        # Joiners are answered too: nothing writes a user while its hydration is pending
        # (no actor exists to flush), so a read that started before they asked still holds.
        for user_id, epochs in self.pending.finish(users).items():
            row = rows.get(user_id)
            state = None
            if row is None:
                if user_id in to_read:
                    self.unknown.remember(user_id, generation)
                self.counters.add("unknown_users_answered")
            else:
                try:
                    state = stored_state(row)
                except StoredStateError as error:
                    self.counters.add("stored_states_unreadable")
                    log.error(
                        "persister.stored_state_unreadable", user_id=user_id, error=str(error)
                    )
                    continue
                self.counters.add("hydrations_answered")
            for epoch in dict.fromkeys(epochs):
                commands.append(answers.hydrate_user(user_id, epoch, state))
        return commands
