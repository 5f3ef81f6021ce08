"""The persister's fencing token on a real PostgreSQL: a newer claim refuses every
later write transaction of the older writer, even one that started waiting for the
row before the claim; an older token cannot claim the shard back; the counter path
hands out increasing tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from persister.cursor import read_cursor, write_cursor
from persister.migrations import apply_migrations
from persister.store import Store
from persister.writer_fence import WriterFencedError, claim

SHARD = "s9"


async def _store(url: str) -> Store:
    store = await Store.open(url, pool_size=3)
    await apply_migrations(store)
    return store


@pytest.fixture
async def stores(new_database: Callable[[], str]) -> AsyncIterator[tuple[Store, Store]]:
    """Two persisters' stores on one database, as two processes would have."""
    url = new_database()
    old, new = await _store(url), await _store(url)
    yield old, new
    await old.close()
    await new.close()


async def test_a_newer_token_fences_the_old_writer_out(stores: tuple[Store, Store]) -> None:
    old, new = stores
    old.fence = await claim(old, SHARD, 100)
    async with old.transaction() as session:
        await write_cursor(session, SHARD, 10)

    # The old writer is inside a transaction (the row share-locked) when the new one
    # claims: the claim waits for it; that transaction commits; the next is refused.
    async with old.transaction() as session:
        claiming = asyncio.create_task(claim(new, SHARD, 101))
        await asyncio.sleep(0)  # the claim is sent and blocks on the row
        await write_cursor(session, SHARD, 11)
    new.fence = await asyncio.wait_for(claiming, 10)
    assert new.fence.token == 101
    with pytest.raises(WriterFencedError):
        async with old.transaction() as session:
            await write_cursor(session, SHARD, 12)
    async with new.transaction() as session:
        assert await read_cursor(session, SHARD) == 11  # nothing of the refused one
        await write_cursor(session, SHARD, 13)

    # The deposed writer cannot take the shard back with its old token.
    with pytest.raises(WriterFencedError):
        await claim(old, SHARD, 100)


async def test_without_etcd_the_database_counts_the_tokens(stores: tuple[Store, Store]) -> None:
    old, new = stores
    first = await claim(old, SHARD)
    second = await claim(new, SHARD)
    assert second.token == first.token + 1
    old.fence = first
    with pytest.raises(WriterFencedError):
        async with old.transaction():
            pass
