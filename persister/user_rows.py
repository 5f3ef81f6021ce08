"""The users table: the state of each user's last completed flush, by version.

`state` holds `oms.v1.UserState` bytes exactly as the shard flushed them; its
`db_version` field is the version the flush was checked against, so readers take
the row's `version` instead (`stored_state`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from persister.store import Session
from protos.oms.v1 import shard_pb2

INT64_MAX = (1 << 63) - 1


class StoredStateError(ValueError):
    """A users row holds bytes that are not a UserState of that user."""


@dataclass(frozen=True, slots=True)
class UserRow:
    user_id: int
    version: int
    state: bytes
    flush_epoch: int


async def read_users(session: Session, user_ids: Sequence[int]) -> dict[int, UserRow]:
    rows = await session.fetch(
        "SELECT user_id, version, state, flush_epoch FROM users WHERE user_id = ANY($1::bigint[])",
        list(user_ids),
    )
    return {
        row["user_id"]: UserRow(row["user_id"], row["version"], row["state"], row["flush_epoch"])
        for row in rows
    }


def stored_state(row: UserRow) -> shard_pb2.UserState:
    """The state to hydrate: the flushed bytes, carrying the row's current version."""
    try:
        state = shard_pb2.UserState.FromString(row.state)
    except DecodeError as error:
        raise StoredStateError(f"user {row.user_id}: state bytes do not decode") from error
    if state.user_id != row.user_id:
        raise StoredStateError(f"user {row.user_id}: stored state is of user {state.user_id}")
    state.db_version = row.version
    return state


async def insert_user(session: Session, state: shard_pb2.UserState) -> bool:
    """Insert a version-0 row; False when the id is taken."""
    inserted = await session.fetchval(
        "INSERT INTO users (user_id, version, tier, state) VALUES ($1, 0, $2, $3) "
        "ON CONFLICT (user_id) DO NOTHING RETURNING user_id",
        state.user_id,
        int(state.tier),
        state.SerializeToString(deterministic=True),
    )
    return inserted is not None


async def next_user_id(session: Session) -> int:
    return int(await session.fetchval("SELECT nextval('user_ids')"))


async def skip_taken_user_ids(session: Session) -> None:
    """Move the id sequence past ids that were chosen by callers."""
    await session.execute(
        "SELECT setval('user_ids', greatest((SELECT max(user_id) FROM users), 1))"
    )
