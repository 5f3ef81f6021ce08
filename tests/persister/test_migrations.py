"""The schema: versioned migrations applied once, idempotent, safe when started together,
and constraints that refuse rows breaking money invariants."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import asyncpg
import pytest

from persister.errors import MigrationError
from persister.migrations import Migration, apply_migrations, shipped_migrations
from persister.store import Store
from tests.persister.persister_client import sql

TABLES = {
    "users",
    "balances",
    "api_keys",
    "orders",
    "fills",
    "ledger",
    "persister_cursor",
    "shard_snapshots",
    "schema_migrations",
}


async def _tables(url: str) -> set[str]:
    async with sql(url) as connection:
        rows = await connection.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
    return {row["table_name"] for row in rows}


async def test_migrations_apply_once_and_again_change_nothing(
    new_database: Callable[[], str],
) -> None:
    url = new_database()
    store = await Store.open(url, pool_size=4)
    try:
        shipped = [migration.version for migration in shipped_migrations()]
        assert await apply_migrations(store) == shipped
        assert await apply_migrations(store) == []
    finally:
        await store.close()
    assert await _tables(url) >= TABLES
    async with sql(url) as connection:
        versions = await connection.fetch("SELECT version FROM schema_migrations ORDER BY 1")
    assert [row["version"] for row in versions] == shipped


async def test_persisters_starting_together_apply_each_migration_once(
    new_database: Callable[[], str],
) -> None:
    url = new_database()
    stores = [await Store.open(url, pool_size=2) for _ in range(3)]
    try:
        results = await asyncio.gather(*(apply_migrations(store) for store in stores))
    finally:
        for store in stores:
            await store.close()
    applied = [versions for versions in results if versions]
    assert len(applied) == 1, results


async def test_an_edited_migration_is_drift_and_stops_the_start(
    new_database: Callable[[], str],
) -> None:
    url = new_database()
    store = await Store.open(url, pool_size=2)
    try:
        await apply_migrations(store)
        edited = [replace(m, sql=m.sql + "\n-- edited\n") for m in shipped_migrations()]
        with pytest.raises(MigrationError, match="differs"):
            await apply_migrations(store, edited)
        extra = Migration(9_999, "later", "CREATE TABLE later (x integer)")
        assert await apply_migrations(store, [*shipped_migrations(), extra]) == [9_999]
        with pytest.raises(MigrationError, match="lacks"):
            await apply_migrations(store)
    finally:
        await store.close()


async def test_constraints_refuse_rows_that_break_money_invariants(
    new_database: Callable[[], str],
) -> None:
    url = new_database()
    store = await Store.open(url, pool_size=2)
    try:
        await apply_migrations(store)
    finally:
        await store.close()
    async with sql(url) as connection:
        await connection.execute("INSERT INTO users (user_id, tier, state) VALUES (1, 1, '')")
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute(
                "INSERT INTO balances (user_id, asset, total) VALUES (1, 'USDT', -1)"
            )
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute("UPDATE users SET version = -1 WHERE user_id = 1")
        await connection.execute(
            "INSERT INTO ledger (shard_id, position, item_index, user_id, account, asset, "
            "amount, reference, consensus_time_ms) VALUES ('s1', 1, 0, 1, 'user', 'USDT', 5, "
            "'t-1', 0)"
        )
        with pytest.raises(asyncpg.RaiseError, match="never updated or deleted"):
            await connection.execute("UPDATE ledger SET amount = 6")
        with pytest.raises(asyncpg.RaiseError):
            await connection.execute("DELETE FROM ledger")
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute(
                "INSERT INTO ledger (shard_id, position, item_index, user_id, account, asset, "
                "amount, reference, consensus_time_ms) VALUES ('s1', 1, 1, 0, 'user', 'USDT', "
                "5, 't-1', 0)"
            )
