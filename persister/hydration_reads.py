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

import structlog

from persister import answers
from persister.answers import AnswerSink
from persister.counters import Counters
from persister.pending_reads import Barrier, BatchedReads
from persister.store import Store
from persister.unknown_users import UnknownUsers
from persister.user_rows import StoredStateError, read_users, stored_state
from protos.oms.v1 import shard_pb2

log = structlog.get_logger(__name__)

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


class HydrationReads(BatchedReads[int, int]):
    REQUESTED = "hydration_requests"
    JOINED = "hydration_requests_joined"
    SHED = "hydration_requests_shed"
    FAILED = "hydration_read_failures"

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
        super().__init__(
            store,
            shard,
            counters,
            committed=committed,
            workers=workers,
            max_per_query=max_per_query,
            max_pending=max_pending,
        )
        self.unknown = unknown

    def request(self, user_id: int, epoch: int, position: int) -> None:
        self._request(user_id, epoch, position)

    async def _read(self, users: list[int]) -> list[shard_pb2.ShardCommand]:
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
