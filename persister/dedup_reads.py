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

from persister import answers
from persister.pending_reads import BatchedReads
from protos.oms.v1 import shard_pb2

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


class DedupReads(BatchedReads[Key, None]):
    REQUESTED = "dedup_lookups"
    JOINED = "dedup_lookups_joined"
    SHED = "dedup_lookups_shed"
    FAILED = "dedup_read_failures"

    def request(self, user_id: int, client_order_id: str, position: int) -> None:
        self._request((user_id, client_order_id), None, position)

    async def _read(self, keys: list[Key]) -> list[shard_pb2.ShardCommand]:
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
