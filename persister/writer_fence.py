"""The persister's fencing token, checked by PostgreSQL at every write transaction.

A persister that lost its lease (or its advisory lock's connection) may not know
it yet: the next writer could already be writing. So the database decides: the
shard's row in `writer_fences` holds the newest token that claimed the shard, each
write transaction reads it `FOR SHARE` before writing anything and stops with
`WriterFencedError` if it is not its own, and a claim never lowers it. See
`migrations/0003_writer_fences.sql`.
"""

from __future__ import annotations

from dataclasses import dataclass

from persister.errors import WriterFencedError
from persister.store import Session, Store

__all__ = ["WriterFence", "WriterFencedError", "claim"]


@dataclass(frozen=True, slots=True)
class WriterFence:
    shard_id: str
    token: int

    async def check(self, session: Session) -> None:
        """First statement of every write transaction (the row stays share-locked to
        its end, so a newer claim waits for it and is seen by every later one)."""
        token = await session.fetchval(
            "SELECT token FROM writer_fences WHERE shard_id = $1 FOR SHARE", self.shard_id
        )
        if token != self.token:
            raise WriterFencedError(
                f"shard {self.shard_id} is written by token {token} now, not {self.token}"
            )


async def claim(store: Store, shard_id: str, token: int | None = None) -> WriterFence:
    """Claim the shard with `token` (an etcd term), or with the next counter value;
    refused (`WriterFencedError`) if the database has seen a newer token."""
    async with store.transaction() as session:
        if token is None:
            claimed = await session.fetchval(
                "INSERT INTO writer_fences (shard_id, token) VALUES ($1, 1)"
                " ON CONFLICT (shard_id) DO UPDATE SET token = writer_fences.token + 1"
                " RETURNING token",
                shard_id,
            )
        else:
            claimed = await session.fetchval(
                "INSERT INTO writer_fences (shard_id, token) VALUES ($1, $2)"
                " ON CONFLICT (shard_id) DO UPDATE SET token = EXCLUDED.token"
                " WHERE writer_fences.token <= EXCLUDED.token RETURNING token",
                shard_id,
                token,
            )
    if claimed is None:
        raise WriterFencedError(f"shard {shard_id} was claimed with a newer token than {token}")
    return WriterFence(shard_id, int(claimed))
