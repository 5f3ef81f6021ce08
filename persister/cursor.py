"""persister_cursor: the last shard log position whose rows are all committed.

Written in the same transaction as those rows, and never moved backwards, so a
restart resumes right after it: nothing is lost and nothing is written twice.
"""

from __future__ import annotations

from persister.store import Session


async def read_cursor(session: Session, shard_id: str) -> int:
    position = await session.fetchval(
        "SELECT position FROM persister_cursor WHERE shard_id = $1", shard_id
    )
    return int(position or 0)


async def write_cursor(session: Session, shard_id: str, position: int) -> None:
    await session.execute(
        "INSERT INTO persister_cursor (shard_id, position) VALUES ($1, $2) "
        "ON CONFLICT (shard_id) DO UPDATE SET "
        "position = greatest(persister_cursor.position, excluded.position), updated_at = now()",
        shard_id,
        position,
    )
