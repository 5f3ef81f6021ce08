"""Dehydration flushes: a version-checked CAS of the user's row, balances rewritten with it.

A flush of `BeginDehydrate{user, epoch, state}` writes only where the row's
version is still `state.db_version`, and bumps it. When that finds nothing:
- the row already carries this very flush (same shard and epoch, version one
  past the expected one): a replay after a crash, answered complete again;
- otherwise the flush is stale (or the user unknown): refused, nothing written.
Several flushes of one user in one batch run in rounds, in log order, because
one UPDATE statement can change a row only once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from persister.store import Session
from protos.oms.v1 import shard_pb2

_CAS = """
UPDATE users AS u
SET state = f.state, version = u.version + 1, tier = f.tier, flush_epoch = f.epoch,
    flush_position = f.position, flushed_by = $7, flushed_at = now(), updated_at = now()
FROM unnest($1::bigint[], $2::bigint[], $3::bytea[], $4::bigint[], $5::smallint[],
            $6::bigint[]) AS f(user_id, expected, state, epoch, tier, position)
WHERE u.user_id = f.user_id AND u.version = f.expected
RETURNING u.user_id, u.version
"""
_STORED = (
    "SELECT user_id, version, flush_epoch, flushed_by FROM users WHERE user_id = ANY($1::bigint[])"
)
_DELETE_BALANCES = "DELETE FROM balances WHERE user_id = ANY($1::bigint[])"
_INSERT_BALANCES = (
    "INSERT INTO balances (user_id, asset, total) "
    "SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[])"
)


@dataclass(frozen=True, slots=True)
class Flush:
    user_id: int
    epoch: int
    expected_version: int
    tier: int
    state: bytes
    balances: tuple[tuple[str, int], ...]
    position: int

    @classmethod
    def from_egress(cls, item: shard_pb2.BeginDehydrate, position: int) -> Flush:
        state = item.state
        return cls(
            item.user_id,
            item.epoch,
            state.db_version,
            int(state.tier),
            state.SerializeToString(deterministic=True),
            tuple((balance.asset, balance.total) for balance in state.balances),
            position,
        )


@dataclass(frozen=True, slots=True)
class FlushOutcome:
    flush: Flush
    completed: bool
    version: int  # the row's version after the flush (when completed)
    replayed: bool = False
    reason: str = ""


async def write_flushes(
    session: Session, flushes: Sequence[Flush], shard_id: str
) -> list[FlushOutcome]:
    """CAS every flush, in log order per user; outcomes in the order given."""
    outcomes: dict[int, FlushOutcome] = {}
    for round_indexes in _rounds(flushes):
        batch = [flushes[index] for index in round_indexes]
        rows = await session.fetch(
            _CAS,
            [flush.user_id for flush in batch],
            [flush.expected_version for flush in batch],
            [flush.state for flush in batch],
            [flush.epoch for flush in batch],
            [flush.tier for flush in batch],
            [flush.position for flush in batch],
            shard_id,
        )
        written = {row["user_id"]: row["version"] for row in rows}
        missed = [flush.user_id for flush in batch if flush.user_id not in written]
        stored = {}
        if missed:
            stored = {row["user_id"]: row for row in await session.fetch(_STORED, missed)}
        for index, flush in zip(round_indexes, batch, strict=True):
            if flush.user_id in written:
                outcomes[index] = FlushOutcome(flush, True, written[flush.user_id])
                continue
            row = stored.get(flush.user_id)
            if row is None:
                outcomes[index] = FlushOutcome(flush, False, 0, reason="unknown user")
            elif (
                row["flush_epoch"] == flush.epoch
                and row["flushed_by"] == shard_id
                and row["version"] == flush.expected_version + 1
            ):
                outcomes[index] = FlushOutcome(flush, True, row["version"], replayed=True)
            else:
                outcomes[index] = FlushOutcome(
                    flush,
                    False,
                    0,
                    reason=(
                        f"stale version: the row is at {row['version']}, "
                        f"the flush expects {flush.expected_version}"
                    ),
                )
    await _rewrite_balances(session, [outcomes[index] for index in range(len(flushes))])
    return [outcomes[index] for index in range(len(flushes))]


async def _rewrite_balances(session: Session, outcomes: Sequence[FlushOutcome]) -> None:
    latest: dict[int, Flush] = {}
    for outcome in outcomes:
        if outcome.completed and not outcome.replayed:
            latest[outcome.flush.user_id] = outcome.flush  # log order: the last one wins
    if not latest:
        return
    await session.execute(_DELETE_BALANCES, list(latest))
    users: list[int] = []
    assets: list[str] = []
    totals: list[int] = []
    for user_id, flush in latest.items():
        for asset, total in flush.balances:
            users.append(user_id)
            assets.append(asset)
            totals.append(total)
    if users:
        await session.execute(_INSERT_BALANCES, users, assets, totals)


def _rounds(flushes: Sequence[Flush]) -> list[list[int]]:
    """Indexes grouped so that each round holds at most one flush per user, in log order."""
    rounds: list[list[int]] = []
    seen: dict[int, int] = {}
    for index, flush in enumerate(flushes):
        occurrence = seen.get(flush.user_id, 0)
        seen[flush.user_id] = occurrence + 1
        if occurrence == len(rounds):
            rounds.append([])
        rounds[occurrence].append(index)
    return rounds


async def recent_flushes(
    session: Session, shard_id: str, window_ms: int, limit: int
) -> list[tuple[int, int, int]]:
    """(user, epoch, version) of flushes this shard committed in the last `window_ms`."""
    rows = await session.fetch(
        "SELECT user_id, flush_epoch, version FROM users WHERE flushed_by = $1 "
        "AND flushed_at > now() - make_interval(secs => $2::double precision / 1000) "
        "ORDER BY flushed_at DESC LIMIT $3",
        shard_id,
        window_ms,
        limit,
    )
    return [(row["user_id"], row["flush_epoch"], row["version"]) for row in rows]
