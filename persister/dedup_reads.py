"""Dedup lookups: has this user ever sent this client order id? PostgreSQL's exact answer.

The shard asks only when its Bloom filters say "possibly seen" and its exact
recent map has no entry (DedupLookup egress). The answer carries the original
result (its order id and acceptance time) so the shard can return it to a retry.
Only admitted orders have rows: a client order id the shard refused never
reached the matcher, so "not seen" is the right answer for it too.

Batched, single-flight and bounded like hydration reads; each read waits until
every write before its request's log position is committed, so an order admitted
just before the lookup is found.
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
from protos.oms.v1 import shard_pb2

log = structlog.get_logger(__name__)
Barrier = Callable[[int], Awaitable[None]]
Key = tuple[int, str]

_LOOKUP = """
SELECT user_id, client_order_id, order_id, accepted_at_ms FROM orders
WHERE (user_id, client_order_id) IN (SELECT * FROM unnest($1::bigint[], $2::text[]))
"""

COUNTERS = (
    "dedup_lookups",
    "dedup_lookups_joined",
    "dedup_lookups_shed",
    "dedup_queries",
    "dedup_answers_seen",
    "dedup_answers_not_seen",
    "dedup_read_failures",
)


class DedupReads:
    def __init__(
        self,
        store: Store,
        shard: AnswerSink,
        counters: Counters,
        *,
        committed: Barrier,
        workers: int,
        max_per_query: int,
        max_pending: int,
    ) -> None:
        self.store = store
        self.shard = shard
        self.counters = counters
        self.committed = committed
        self.workers = workers
        self.max_per_query = max_per_query
        self.pending: PendingReads[Key, None] = PendingReads(max_pending)

    def request(self, user_id: int, client_order_id: str, position: int) -> None:
        self.counters.add("dedup_lookups")
        admission = self.pending.add((user_id, client_order_id), None, position)
        if admission is Admission.JOINED:
            self.counters.add("dedup_lookups_joined")
        elif admission is Admission.SHED:
            self.counters.add("dedup_lookups_shed")

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(self.workers):
                group.create_task(self._work())

    async def _work(self) -> None:
        while True:
            keys, newest = await self.pending.take(self.max_per_query)
            try:
                commands = await self._read(keys, newest)
            except StoreError as error:
                self.counters.add("dedup_read_failures")
                log.warning("persister.dedup_read_failed", lookups=len(keys), error=str(error))
                self.pending.finish(keys)
                continue
            await self.shard.send(commands)

    async def _read(self, keys: list[Key], newest: int) -> list[shard_pb2.ShardCommand]:
        await self.committed(newest - 1)
        async with self.store.session() as session:
            rows = await session.fetch(
                _LOOKUP, [user for user, _ in keys], [client_id for _, client_id in keys]
            )
        self.counters.add("dedup_queries")
        found = {(row["user_id"], row["client_order_id"]): row for row in rows}
        commands = []
        # One answer per key however many asked: it carries no epoch.
        for key in self.pending.finish(keys):
            user_id, client_order_id = key
            row = found.get(key)
            original = None
            if row is not None:
                original = shard_pb2.RecentResult(
                    client_order_id=client_order_id,
                    order_id=row["order_id"],
                    accepted_at_ms=row["accepted_at_ms"],
                )
                self.counters.add("dedup_answers_seen")
            else:
                self.counters.add("dedup_answers_not_seen")
            commands.append(answers.dedup_answer(user_id, client_order_id, original))
        return commands
