"""The row-lock design's pgbench scripts do the job the benchmark says they do.

Each script runs for a second against the test PostgreSQL: the full job leaves
one fill per two orders with every order closed and the books balanced (fees
included), the reservation alone leaves open orders with their funds reserved,
and the hot workload puts most orders on the whales.
"""

from __future__ import annotations

import asyncpg
import pytest

from services.bench.row_lock_design import (
    FUNDS,
    PRICE_TICKS,
    Workload,
    books_balance,
    prepare,
    run_pgbench,
)

USERS = 64
CLIENTS = 4


async def _scalar(database_url: str, query: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        return int(await connection.fetchval(query))
    finally:
        await connection.close()


async def test_the_full_job_settles_every_pair_and_balances(database_url: str) -> None:
    await prepare(database_url, USERS)
    result = run_pgbench(
        database_url, "full", Workload("uniform", USERS), clients=CLIENTS, seconds=1
    )
    assert result.orders_per_s > 0 and result.failed == 0, result
    await books_balance(database_url, USERS)
    orders = await _scalar(database_url, "SELECT count(*) FROM rl_orders")
    fills = await _scalar(database_url, "SELECT count(*) FROM rl_fills")
    # A run can stop between a pair's orders and its fill, at most once per client.
    assert orders - CLIENTS * 2 <= 2 * fills <= orders, (orders, fills)
    still_open = await _scalar(
        database_url, "SELECT count(*) FROM rl_orders WHERE remaining_lots > 0"
    )
    assert still_open <= CLIENTS * 2
    ledger = await _scalar(database_url, "SELECT count(*) FROM rl_ledger")
    assert ledger == 5 * fills  # two legs per side and the fees


async def test_the_reservation_alone_reserves_and_leaves_orders_open(database_url: str) -> None:
    await prepare(database_url, USERS)
    result = run_pgbench(
        database_url, "reserve", Workload("uniform", USERS), clients=CLIENTS, seconds=1
    )
    assert result.orders_per_s > 0 and result.failed == 0, result
    orders = await _scalar(database_url, "SELECT count(*) FROM rl_orders")
    buys = await _scalar(database_url, "SELECT count(*) FROM rl_orders WHERE side = 'B'")
    reserved_quote = await _scalar(
        database_url, "SELECT sum(reserved) FROM rl_balances WHERE asset = 'USDT'"
    )
    reserved_base = await _scalar(
        database_url, "SELECT sum(reserved) FROM rl_balances WHERE asset = 'BTC'"
    )
    assert reserved_quote == buys * PRICE_TICKS
    assert reserved_base == orders - buys
    assert await _scalar(database_url, "SELECT count(*) FROM rl_fills") == 0
    assert await _scalar(database_url, "SELECT max(total) FROM rl_balances") == FUNDS


@pytest.mark.parametrize("job", ["full", "reserve"])
async def test_the_hot_workload_puts_most_orders_on_the_whales(database_url: str, job: str) -> None:
    workload = Workload("hot", USERS, hot_users=4, hot_percent=80)
    await prepare(database_url, USERS)
    result = run_pgbench(database_url, job, workload, clients=CLIENTS, seconds=1)
    assert result.failed == 0, result
    orders = await _scalar(database_url, "SELECT count(*) FROM rl_orders")
    on_whales = await _scalar(database_url, "SELECT count(*) FROM rl_orders WHERE user_id <= 4")
    assert orders > 50
    assert 0.7 < on_whales / orders < 0.9, (on_whales, orders)
    await books_balance(database_url, USERS)
