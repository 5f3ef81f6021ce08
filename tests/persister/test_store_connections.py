"""The store's pool never lends again a connection that failed as a connection.

After a PostgreSQL crash the persister once met `InternalClientError: cannot switch
to state 12; another operation is in progress` on a connection the pool lent it
(tests/e2e/test_database_crash.py): a call the crash broke had left it mid-operation
and it went back to the pool. A session whose connection failed (a socket error, a
timeout, an interface error) now ends it before the pool takes it back, so the next
session gets a fresh one; a statement the server merely refused leaves its
connection as good as it was, and it is lent again. Shown on a real server, by the
backend process id each session sees.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from persister.errors import RowRejected, StoreUnavailable
from persister.store import Store
from tests.databases import drop_database, fresh_database


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    url = fresh_database(database_url, prefix="oms_store")
    store = await Store.open(url, pool_size=1)  # one connection: who gets it is plain
    try:
        yield store
    finally:
        await store.close()
        drop_database(database_url, url)


async def backend(store: Store) -> int:
    async with store.session() as session:
        return int(await session.fetchval("SELECT pg_backend_pid()"))


async def test_a_connection_that_failed_is_not_lent_again(store: Store) -> None:
    first = await backend(store)
    with pytest.raises(StoreUnavailable):
        async with store.session():
            raise StoreUnavailable("OSError: the socket broke") from OSError("reset")
    assert await backend(store) != first
    second = await backend(store)
    with pytest.raises(StoreUnavailable):
        async with store.transaction():
            raise StoreUnavailable("TimeoutError") from TimeoutError()
    assert await backend(store) != second


async def test_a_refused_statement_leaves_its_connection_in_use(store: Store) -> None:
    first = await backend(store)
    with pytest.raises(RowRejected):
        async with store.session() as session:
            await session.fetchval("SELECT 1 / 0")
    assert await backend(store) == first
