"""`oms bench write-behind` runs both modes on a real PostgreSQL, and both leave the
same rows: the one-call path writes what the statements write."""

from __future__ import annotations

import asyncpg
import pytest

from services.bench.write_behind_bench import _measure
from tests.databases import drop_database, fresh_database


async def test_both_modes_write_every_row_once(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = fresh_database(database_url, "oms_bench_write_behind")
    try:
        await _measure(url, [3], batches=5, rounds=1)
        connection = await asyncpg.connect(url)
        try:
            orders = await connection.fetchval("SELECT count(*) FROM orders")
            ledger = await connection.fetchval("SELECT count(*) FROM ledger")
            cursor = await connection.fetchval("SELECT position FROM persister_cursor")
        finally:
            await connection.close()
    finally:
        drop_database(database_url, url)
    assert (orders, ledger) == (2 * 5 * 3, 2 * 5 * 3 * 2)
    assert cursor == 1 + 2 * 5 * 3
    printed = capsys.readouterr().out
    assert "statements" in printed and "one call" in printed
