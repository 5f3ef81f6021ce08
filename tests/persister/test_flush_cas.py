"""The flush CAS on a real PostgreSQL, without processes: complete, replay, stale, rounds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from persister.flushes import Flush, write_flushes
from persister.migrations import apply_migrations
from persister.store import Store
from persister.user_rows import insert_user, read_users, stored_state
from protos.oms.v1 import shard_pb2

USER = 31


@pytest.fixture
async def store(new_database: Callable[[], str]) -> AsyncIterator[Store]:
    opened = await Store.open(new_database(), pool_size=2)
    await apply_migrations(opened)
    async with opened.transaction() as session:
        await insert_user(
            session, shard_pb2.UserState(user_id=USER, tier=shard_pb2.USER_TIER_NORMAL)
        )
    yield opened
    await opened.close()


def _flush(epoch: int, expected: int, usdt: int, position: int) -> Flush:
    state = shard_pb2.UserState(
        user_id=USER, db_version=expected, tier=shard_pb2.USER_TIER_NORMAL, user_seq=epoch
    )
    state.balances.add(asset="USDT", total=usdt)
    state.balances.add(asset="BTC", total=0)
    return Flush.from_egress(
        shard_pb2.BeginDehydrate(user_id=USER, epoch=epoch, state=state), position
    )


async def _balances(store: Store) -> dict[str, int]:
    async with store.session() as session:
        rows = await session.fetch("SELECT asset, total FROM balances WHERE user_id = $1", USER)
    return {row["asset"]: row["total"] for row in rows}


async def test_a_flush_writes_where_the_version_matches_and_a_replay_is_recognised(
    store: Store,
) -> None:
    first = _flush(epoch=3, expected=0, usdt=700, position=10)
    async with store.transaction() as session:
        (outcome,) = await write_flushes(session, [first], "s1")
    assert outcome.completed and outcome.version == 1 and not outcome.replayed
    assert await _balances(store) == {"USDT": 700, "BTC": 0}

    # The same flush again (a crash before the answer went out): complete, nothing rewritten.
    async with store.transaction() as session:
        (again,) = await write_flushes(session, [first], "s1")
    assert again.completed and again.replayed and again.version == 1
    async with store.session() as session:
        row = (await read_users(session, [USER]))[USER]
    assert row.version == 1 and row.flush_epoch == 3
    state = stored_state(row)
    assert state.db_version == 1 and state.user_seq == 3

    # Another shard's flush with the same epoch number is not ours: refused.
    async with store.transaction() as session:
        (foreign,) = await write_flushes(session, [first], "s2")
    assert not foreign.completed


async def test_a_stale_flush_is_refused_and_writes_nothing(store: Store) -> None:
    async with store.session() as session:
        await session.execute("UPDATE users SET version = 4 WHERE user_id = $1", USER)
        before = (await read_users(session, [USER]))[USER]
    async with store.transaction() as session:
        (outcome,) = await write_flushes(session, [_flush(5, 0, 900, 11)], "s1")
    assert not outcome.completed
    assert "the row is at 4" in outcome.reason
    async with store.session() as session:
        after = (await read_users(session, [USER]))[USER]
    assert after == before
    assert await _balances(store) == {}


async def test_two_flushes_of_one_user_in_one_batch_apply_in_log_order(store: Store) -> None:
    # Activity cancelled the first eviction; the second flush still expects version 0.
    flushes = [_flush(6, 0, 100, 20), _flush(7, 0, 200, 21), _flush(8, 1, 300, 22)]
    async with store.transaction() as session:
        outcomes = await write_flushes(session, flushes, "s1")
    assert [(o.completed, o.version) for o in outcomes] == [(True, 1), (False, 0), (True, 2)]
    assert await _balances(store) == {"USDT": 300, "BTC": 0}
